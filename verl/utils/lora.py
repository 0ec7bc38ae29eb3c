"""LoRA helpers (peft) for SFT and for the RL actor.

LoRA (Hu et al. 2021, arXiv:2106.09685) trains a low-rank update ``W' = W + (alpha / r) * B @ A``
next to each frozen target weight. Three uses in this project:

* ``wrap_lora(model, lora_rank, lora_alpha, target_modules)``: make a causal LM's target linears
  trainable LoRA pairs (everything else frozen).
* ``reference_policy(model)``: a context manager under which the same module computes the *base*
  model (adapters disabled) -- the RL reference policy without a second copy of the weights.
* ``merged_state_dict(state_dict, ...)`` / ``export_merged(...)``: fold the adapters into plain
  Hugging Face weights, for the rollout engine after each update (``update_weights`` takes
  ``(name, tensor)`` pairs with HF names) and for an ``huggingface/`` export that any
  ``from_pretrained`` (or ``actor_rollout_ref.model.path``) loads.

The merge works on a *state dict* (the one ``fsdp_utils.get_full_state_dict`` gathers from an FSDP2
model), so it never mutates the training module and works the same sharded or not.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Mapping

import torch

DEFAULT_TARGET_MODULES = "all-linear"
_PEFT_PREFIX = "base_model.model."
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.(?P<adapter>[^.]+)\.weight$")


def lora_enabled(model_config) -> bool:
    """True when ``model_config.lora_rank`` (``actor_rollout_ref.model`` or SFT ``model``) > 0."""
    return model_config.lora_rank > 0


def _target_modules(target_modules):
    # Hydra/OmegaConf gives ListConfig; peft wants a str or a plain list.
    if target_modules is None:
        return DEFAULT_TARGET_MODULES
    if isinstance(target_modules, str):
        return target_modules
    return [str(name) for name in target_modules]


def wrap_lora(model: torch.nn.Module, lora_rank: int, lora_alpha: float = 16,
              target_modules=DEFAULT_TARGET_MODULES, lora_dropout: float = 0.0):
    """Wrap a causal LM with LoRA adapters; only adapter weights stay trainable.

    Args:
        model: a transformers ``PreTrainedModel``.
        lora_rank: r > 0.
        lora_alpha: scaling numerator; the update is scaled by ``lora_alpha / lora_rank``.
        target_modules: ``"all-linear"`` or a list of module-name suffixes (``["q_proj", "v_proj"]``).
    Returns:
        a ``peft.PeftModel`` (same forward signature as ``model``).
    Raises:
        ValueError: ``lora_rank`` < 1.
    """
    from peft import LoraConfig, TaskType, get_peft_model

    if int(lora_rank) < 1:
        raise ValueError(f"lora_rank must be >= 1 to wrap a model with LoRA, got {lora_rank}")
    config = LoraConfig(task_type=TaskType.CAUSAL_LM, r=int(lora_rank), lora_alpha=float(lora_alpha),
                        target_modules=_target_modules(target_modules), lora_dropout=lora_dropout,
                        bias="none")
    return get_peft_model(model, config)


def maybe_wrap_lora(model: torch.nn.Module, model_config):
    """``wrap_lora`` with the keys of a model config when ``lora_rank > 0``; else ``model`` as is."""
    if not lora_enabled(model_config):
        return model
    return wrap_lora(model, model_config.lora_rank, model_config.lora_alpha,
                     model_config.target_modules or DEFAULT_TARGET_MODULES)


def is_lora_model(model: torch.nn.Module) -> bool:
    """True for a peft-wrapped model (also after FSDP2 ``fully_shard``, which keeps the class tree)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


@contextlib.contextmanager
def reference_policy(model: torch.nn.Module):
    """Run ``model`` as its base model (LoRA adapters off) inside the block.

    The RL reference policy for a LoRA actor: ``ref_log_probs`` come from the frozen base weights
    the actor shares, so no second model is loaded. For a model without adapters this does nothing
    (the caller then needs a separate reference model).
    """
    if not is_lora_model(model):
        yield model
        return
    with model.disable_adapter():
        yield model


def lora_scaling(model: torch.nn.Module, adapter: str = "default") -> float:
    """``lora_alpha / r`` of a peft model's adapter (``sqrt(r)`` in the denominator for rsLoRA)."""
    config = model.peft_config[adapter]
    return config.lora_alpha / (config.r ** 0.5 if config.use_rslora else config.r)


def merged_state_dict(state_dict: Mapping[str, torch.Tensor], scaling: float,
                      adapter: str = "default") -> dict[str, torch.Tensor]:
    """Fold LoRA pairs of a peft state dict into plain Hugging Face weights.

    ``base_model.model.X.base_layer.weight`` + ``X.lora_A.<adapter>.weight`` (r, in) +
    ``X.lora_B.<adapter>.weight`` (out, r) become ``X.weight = W + scaling * B @ A``; the
    ``base_model.model.`` prefix and ``.base_layer`` are dropped from every other key too.
    A state dict without LoRA keys comes back with only the prefix handling applied.

    Raises:
        ValueError: a LoRA A without its B (or the reverse), or a pair without its base weight.
    """
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    plain: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        match = _LORA_KEY.match(key)
        if match:
            if match["adapter"] == adapter:
                pairs.setdefault(match["module"], {})[match["ab"]] = tensor
            continue
        plain[_hf_name(key)] = tensor
    for module, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise ValueError(f"LoRA module {module!r} has only lora_{''.join(pair)}")
        name = _hf_name(module + ".weight")
        if name not in plain:
            raise ValueError(f"LoRA module {module!r} has no base weight {name!r} in the state dict")
        base = plain[name]
        delta = (pair["B"].float() @ pair["A"].float()) * scaling
        plain[name] = (base.float() + delta).to(base.dtype)
    return plain


def _hf_name(key: str) -> str:
    if key.startswith(_PEFT_PREFIX):
        key = key[len(_PEFT_PREFIX):]
    return key.replace(".base_layer.", ".")


def export_merged(state_dict: Mapping[str, torch.Tensor], hf_config, out_dir: str | Path,
                  scaling: float | None = None, tokenizer=None) -> Path:
    """Write a plain HF folder (config + safetensors [+ tokenizer]) with the adapters merged.

    Args:
        state_dict: full (unsharded) state dict of a peft or plain model, e.g. from
            ``fsdp_utils.get_full_state_dict``.
        hf_config: the base model's ``transformers`` config.
        scaling: ``lora_scaling(model)``; required when the state dict holds LoRA keys.
    Returns:
        ``out_dir``, loadable with ``AutoModelForCausalLM.from_pretrained``.
    """
    from transformers import AutoModelForCausalLM

    has_lora = any(_LORA_KEY.match(k) for k in state_dict)
    if has_lora and scaling is None:
        raise ValueError("state dict has LoRA weights: pass scaling=lora_scaling(model)")
    weights = merged_state_dict(state_dict, scaling or 0.0)
    model = AutoModelForCausalLM.from_config(hf_config)
    result = model.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if getattr(hf_config, "tie_word_embeddings", False) else set()
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise ValueError(f"merged state dict does not match {type(model).__name__}: missing "
                         f"{missing[:5]}, unexpected {result.unexpected_keys[:5]}")
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir
