"""Model loading and FSDP2 wrapping: the one path every trainer (PPO workers, SFT) loads models by.

* :func:`load_causal_lm` / :func:`load_value_model`: ``from_pretrained`` of a local folder or hub id
  (``trust_remote_code``, ``gguf_file``, ``attn_implementation``, ``override_config``,
  ``external_lib``), optional gradient checkpointing. The critic is the LM body with a 1-unit token
  classification head (token-level values), built from the same causal-LM checkpoint.
* :func:`apply_fsdp2`: ``fully_shard`` on each decoder layer and then on the root module, with a
  :class:`MixedPrecisionPolicy` (bf16 compute / fp32 reduce on GPU, fp32 on CPU) and optional
  :class:`CPUOffloadPolicy` (parameters, gradients and the optimizer step on CPU).
* :func:`resident`: a sharded module on the accelerator for one phase and on the host between
  phases (veRL's ``param_offload``); the optimizer state between updates is
  :mod:`verl.utils.optimizer_offload`'s.
* full (unsharded) state dicts for export and for pushing weights to the rollout engine.

Large models are loaded fully on every rank before sharding (no meta-device init); that is simple
and fine up to a few billion parameters per host.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import math
import os
import socket
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from verl.utils import varlen_attention
from verl.utils.host_buffer import HostBuffer, local_shard, with_local

logger = logging.getLogger(__name__)

_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
           "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}


def to_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """``"bf16"``/``"bfloat16"``/``"fp32"``/... -> ``torch.dtype`` (``None`` stays ``None``).

    Raises:
        ValueError: unknown dtype name.
    """
    if name is None or isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def device_name() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_distributed() -> None:
    """Initialise ``torch.distributed`` if nobody has (NCCL on GPU, gloo on CPU).

    Uses ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` when set (worker groups set them);
    otherwise a world of one on a free local port, so FSDP2 also runs in a plain process. That
    rendezvous is given to torch, not written into ``os.environ``: there it would outlive the group and
    send this process's later children (a trainer run, ``torchrun``) to a world of one on a stale port.
    """
    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if "WORLD_SIZE" not in os.environ:
        dist.init_process_group(backend=backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        return
    dist.init_process_group(backend=backend)


def as_model_config(model_config: Any):
    """A ``ModelConfig`` for a plain mapping (tests, benchmarks: ``{"path": ...}``); typed configs
    (``ModelConfig``, the critic's and SFT's model configs) pass through unchanged."""
    from verl.utils.config import to_typed
    from verl.utils.model_config import ModelConfig

    return to_typed(ModelConfig, model_config, "model") if isinstance(model_config, Mapping) else model_config


def _pretrained_kwargs(model_config: Any, torch_dtype: torch.dtype) -> dict:
    attn = resolve_attn_implementation(model_config.attn_implementation)
    if attn == varlen_attention.NAME:
        varlen_attention.register()
    kwargs = {"dtype": torch_dtype, "trust_remote_code": model_config.trust_remote_code, "attn_implementation": attn}
    if model_config.gguf_file:
        kwargs["gguf_file"] = model_config.gguf_file
    return kwargs


def resolve_attn_implementation(requested: str | None) -> str:
    """``requested`` if given; else on a GPU flash_attention_2 when installed, else torch_varlen
    (torch's own varlen flash kernel, :mod:`verl.utils.varlen_attention`); else sdpa."""
    if requested:
        return requested
    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    if varlen_attention.varlen_kernel_available():
        return varlen_attention.NAME
    return "sdpa"


def load_model_config(model_config: Any):
    """``AutoConfig`` of ``model_config.path`` with ``override_config`` applied.

    Also imports ``external_lib`` first (a module that registers custom architectures).

    Raises:
        ValueError: ``path`` is empty.
    """
    from transformers import AutoConfig

    model_config = as_model_config(model_config)
    if model_config.external_lib:
        importlib.import_module(model_config.external_lib)
    if not model_config.path:
        raise ValueError("model.path is empty: give a local folder or a hub id")
    kwargs = {"trust_remote_code": model_config.trust_remote_code}
    if model_config.gguf_file:
        kwargs["gguf_file"] = model_config.gguf_file
    config = AutoConfig.from_pretrained(model_config.path, **kwargs)
    for key, value in dict(model_config.override_config or {}).items():
        setattr(config, key, value)
    return config


def load_causal_lm(model_config: Any, torch_dtype: str | torch.dtype = torch.float32,
                   trainable: bool = True) -> nn.Module:
    """Load a causal LM for the actor, the reference or SFT.

    Args:
        model_config: a ``ModelConfig`` (or a mapping of its keys): ``path`` (folder or hub id),
            ``trust_remote_code``, ``gguf_file``, ``attn_implementation`` (see
            :func:`resolve_attn_implementation`), ``override_config``, ``external_lib``,
            ``enable_gradient_checkpointing``.
        torch_dtype: dtype of the loaded weights (fp32 master weights for training).
        trainable: False freezes all parameters (reference model) and skips checkpointing.
    Returns:
        The ``AutoModelForCausalLM`` in train mode (trainable) or eval mode (frozen).
    """
    from transformers import AutoModelForCausalLM

    model_config = as_model_config(model_config)
    config = load_model_config(model_config)
    model = AutoModelForCausalLM.from_pretrained(
        model_config.path, config=config, **_pretrained_kwargs(model_config, to_dtype(torch_dtype)))
    return _finish_model(model, model_config, trainable)


def load_value_model(model_config: Any, torch_dtype: str | torch.dtype = torch.float32,
                     head_init: str = "zero") -> nn.Module:
    """Load a critic: the LM body plus a linear head giving one value per token.

    ``AutoModelForTokenClassification`` with ``num_labels=1`` reuses the causal-LM checkpoint's body
    weights (the LM head is dropped). A value head the checkpoint lacks starts at ``head_init``:
    ``"zero"`` (weight and bias 0, every value 0) or ``"random"`` (transformers' init); one the
    checkpoint holds is loaded. Dropout is switched off so values are deterministic in train mode.
    ``model(input_ids, ...).logits[..., 0]`` is the value.

    Raises:
        ValueError: the architecture has no token-classification class in transformers, or
            ``head_init`` is not one of ``VALUE_HEAD_INITS``.
    """
    from transformers import AutoModelForTokenClassification

    from verl.workers.critic.config import VALUE_HEAD_INITS

    if head_init not in VALUE_HEAD_INITS:
        raise ValueError(f"critic.model.value_head_init={head_init!r}: choose one of {list(VALUE_HEAD_INITS)}")
    model_config = as_model_config(model_config)
    config = load_model_config(model_config)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    with _load_report_silenced():
        model, info = AutoModelForTokenClassification.from_pretrained(
            model_config.path, config=config, output_loading_info=True,
            **_pretrained_kwargs(model_config, to_dtype(torch_dtype)))
    head = _use_value_head(model)
    fresh = any(key.startswith(f"{head}.") for key in info["missing_keys"])
    if fresh and head_init == "zero":
        with torch.no_grad():
            for param in getattr(model, head).parameters():
                param.zero_()
    _report_value_model_load(head, info, model_config.path, head_init if fresh else None)
    return _finish_model(model, model_config, trainable=True)


@contextlib.contextmanager
def _load_report_silenced():
    """Hold back transformers' loading report (a warning-level table) for one ``from_pretrained``.

    From a causal-LM checkpoint the value head is always missing and the LM head always unexpected,
    so transformers' report would warn on every critic load; :func:`_report_value_model_load`
    reports only what differs from that. Errors still raise.
    """
    def drop_report(record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)

    report_logger = logging.getLogger("transformers.modeling_utils")
    report_logger.addFilter(drop_report)
    try:
        yield
    finally:
        report_logger.removeFilter(drop_report)


def _report_value_model_load(head: str, info: dict, path: str, head_init: str | None) -> None:
    """Warn about checkpoint keys a critic load did not expect to miss or to skip; ``head``: the value
    head's name, ``head_init``: how it started when the checkpoint lacked it (None: loaded)."""
    missing = sorted(k for k in info["missing_keys"] if not k.startswith(f"{head}."))
    unexpected = sorted(k for k in info["unexpected_keys"] if not k.startswith("lm_head."))
    if head_init is not None:
        logger.info("critic from %s: value head %s newly initialised (%s; the checkpoint is a causal LM)",
                    path, head, head_init)
    if missing:
        logger.warning("critic from %s: %d weights missing from the checkpoint, newly initialised: %s",
                       path, len(missing), ", ".join(missing[:10]))
    if unexpected:
        logger.warning("critic from %s: %d checkpoint weights not used: %s", path, len(unexpected),
                       ", ".join(unexpected[:10]))


class ValueHead(nn.Linear):
    """The critic's ``nn.Linear`` head, computed as ``x @ W^T + b`` in two ops.

    ``nn.Linear`` with a bias on a ``(B, T, H)`` input runs ``addmm`` on the flattened input and
    returns a *view* of its ``(B*T, 1)`` result. That view is the value model's output, and FSDP2
    registers the all-gather of its pre-backward hook on the root module's outputs: an in-place op
    on a view output would silently drop that hook (torch warns "returned a view tensor"). Here the
    bias is added out of place, so the logits own their storage. Same parameters and state-dict
    keys as the ``nn.Linear`` it replaces; the sum differs from ``addmm``'s by rounding only.

    Shapes: ``(..., in_features)`` -> ``(..., out_features)``.
    """

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = nn.functional.linear(hidden, self.weight)
        return out if self.bias is None else out + self.bias


def _use_value_head(model: nn.Module) -> str:
    """Swap the token-classification head (``score``, or ``classifier`` in some architectures) of
    ``model`` for a :class:`ValueHead` holding the same parameters; returns the head's name.

    Raises:
        ValueError: ``model`` has neither head as an ``nn.Linear``.
    """
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if type(head) is nn.Linear:
            value_head = ValueHead(head.in_features, head.out_features, bias=head.bias is not None, device="meta")
            value_head.weight, value_head.bias = head.weight, head.bias
            setattr(model, name, value_head)
            return name
    raise ValueError(f"{type(model).__name__}: no linear `score` or `classifier` head to use as the value head")


def _finish_model(model: nn.Module, model_config: Any, trainable: bool) -> nn.Module:
    if not trainable:
        model.requires_grad_(False)
        return model.eval()
    if model_config.enable_gradient_checkpointing:
        # Non-reentrant checkpointing works with FSDP2 and with inputs that need no grad.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model.train()


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 shards one by one: instances of the model's ``_no_split_modules`` classes.

    Raises:
        ValueError: the model declares no such classes or none is found.
    """
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} declares no decoder layer classes (_no_split_modules={names}); "
                         "cannot shard it per layer")
    return layers


def compile_decoder_layers(model: nn.Module, backend: str = "inductor") -> int:
    """``torch.compile`` each decoder layer in place (dynamic shapes); returns how many.

    Per layer and before FSDP2 wraps it, as torchtitan does: FSDP2's hooks stay outside the
    compiled code, and the layers share one compiled graph per grad mode, whatever the packed
    length (a layer that recompiled would, past dynamo's recompile limit, run eager). Eager,
    RMSNorm, rotary embeddings and SiLU-gating run as separate memory-bound kernels; compiled
    they fuse (gain: docs/benchmarks.md). ``backend``: dynamo's backend (``"eager"`` traces and
    guards as inductor does without generating code).
    """
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(dynamic=True, backend=backend)
    return len(layers)


def mixed_precision_policy(mixed_precision: str | None = None):
    """FSDP2 policy: on GPU ``mixed_precision`` parameters (default bf16) with fp32 gradient
    reduction; on CPU everything fp32 (``fsdp_config.mixed_precision`` is a dtype name)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not torch.cuda.is_available():
        return MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy(param_dtype=to_dtype(mixed_precision or "bf16"), reduce_dtype=torch.float32,
                                cast_forward_inputs=True)


def compute_dtype(mixed_precision: str | None = None) -> torch.dtype:
    """The dtype a module sharded by :func:`apply_fsdp2` computes in: ``mixed_precision`` (default
    bf16) on a GPU, fp32 on a CPU-only machine (:func:`mixed_precision_policy`)."""
    return mixed_precision_policy(mixed_precision).param_dtype


def apply_fsdp2(model: nn.Module, mesh=None, mixed_precision: Any = None, offload_policy: bool = False,
                reshard_after_forward: bool = True) -> nn.Module:
    """Shard ``model`` in place with FSDP2: each decoder layer, then the root.

    Args:
        model: a Hugging Face model on CPU (it is moved to the mesh's device).
        mesh: a 1-D ``DeviceMesh`` (default: all ranks of the default group).
        mixed_precision: see :func:`mixed_precision_policy`.
        offload_policy: keep sharded params, grads and the optimizer step on the CPU, each layer
            copied to the device for its forward and backward (:class:`CPUOffloadPolicy`, pinned on
            a GPU). On a CPU-only machine the copies are no-ops. Not to be confused with moving the
            whole module between phases (:func:`resident`).
        reshard_after_forward: free gathered params after forward (ZeRO-3); False keeps them (ZeRO-2).
    Returns:
        The same module, now an ``FSDPModule``.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    init_distributed()
    device = device_name()
    if mesh is None:
        mesh = init_device_mesh(device, (dist.get_world_size(),))
    offload = OffloadPolicy()
    if offload_policy:
        offload = CPUOffloadPolicy(pin_memory=device == "cuda")
    elif device == "cuda":
        model.to(torch.device("cuda", torch.cuda.current_device()))
    kwargs = {"mesh": mesh, "mp_policy": mixed_precision_policy(mixed_precision), "offload_policy": offload,
              "reshard_after_forward": reshard_after_forward}
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def accelerator() -> torch.device | None:
    """This rank's GPU (``torch.cuda.current_device()``), or None on a CPU-only machine."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None


@torch.no_grad()
def load_model(model: nn.Module, device: torch.device) -> None:
    """Move ``model``'s parameters, gradients and buffers to ``device``.

    An ``FSDPModule`` supports this: its ``_apply`` reshards first and re-registers the moved local
    shards afterwards, and DTensor parameters are swapped in place, so an optimizer built on them
    keeps stepping the same objects. From the page-locked home :func:`offload_model` keeps, the
    copies are asynchronous, ordered on the current stream before the phase's kernels.
    """
    model.to(device, non_blocking=True)


# A module's home on the host between phases (param_offload): one exact-size buffer, kept from move to move.
_HOST_HOMES: "weakref.WeakKeyDictionary[nn.Module, HostBuffer]" = weakref.WeakKeyDictionary()


@torch.no_grad()
def offload_model(model: nn.Module) -> None:
    """Move ``model``'s parameters, gradients and buffers to the host and give the accelerator
    memory they held back to the driver (for the rollout engine).

    Each tensor's local shard is copied into its slot of the module's home, one
    :class:`~verl.utils.host_buffer.HostBuffer` (page-locked on a GPU) kept from move to move, so no
    host memory is allocated per move and both directions are DMA (a plain ``model.to("cpu")`` faults
    in fresh pageable memory every time and copies synchronously through a staging buffer). The copies
    are waited for before ``FSDPModule._apply`` swaps the host tensors in, because it re-pads an
    unevenly sharded parameter by reading its new local shard on the host. Such a parameter then lives
    in the re-padded copy FSDP2 allocates until the next offload brings it home again. Tensors already
    in the home stay where they are, so the first call (after the module is built) is the only one on
    a CPU-only machine that copies anything.
    """
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():  # the sharded parameters registered (the root stays unsharded after a forward)
        if isinstance(module, FSDPModule):
            module.reshard()
    entries = _home_entries(model)
    home = _HOST_HOMES.get(model)
    if home is None:
        home = _HOST_HOMES[model] = HostBuffer(page_lock=torch.cuda.is_available())
    if all(home.holds(local_shard(value)) for _, value in entries):
        return
    slots = home.slots((name, tuple(local_shard(value).shape), local_shard(value).dtype) for name, value in entries)
    slot_of = {}
    for (_, value), slot in zip(entries, slots):
        local = local_shard(value)
        if local.data_ptr() != slot.data_ptr():
            slot.copy_(local, non_blocking=True)
        slot_of[id(value)] = slot
    if torch.cuda.is_available():
        torch.cuda.synchronize()

    def home_view(t: torch.Tensor) -> torch.Tensor:
        # A new tensor object each call: _apply swaps a gradient's contents with what this returns, and
        # visits a tied weight (and its gradient) once per module that holds it.
        return with_local(t, slot_of[id(t)].detach()) if id(t) in slot_of else t.to("cpu")

    model._apply(home_view)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _home_entries(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of what :func:`offload_model` moves: each parameter (a tied one once), its
    gradient when it has one, each buffer."""
    entries = []
    for name, param in model.named_parameters():
        entries.append((name, param))
        if param.grad is not None:
            entries.append((f"{name}.grad", param.grad))
    entries.extend((f"buffer:{name}", buffer) for name, buffer in model.named_buffers())
    return entries


@contextlib.contextmanager
def resident(model: nn.Module, enabled: bool, device: torch.device | None = None) -> Iterator[None]:
    """``model`` on ``device`` inside the block and on the host after it, even if the block raises.

    This is veRL's ``fsdp_config.param_offload``: the module lives on the host between phases and
    every phase (forward, backward, optimizer step) runs on the accelerator. A no-op when not
    ``enabled`` or without an accelerator (the module is on the host already). Not re-entrant: the
    inner block's exit would offload the module under the outer block.

    Args:
        model: a module whose home is the host (:func:`offload_model` after it was built).
        enabled: the role's ``param_offload`` (and not its ``offload_policy``).
        device: where the phase runs (None: :func:`accelerator`).
    """
    device = device or accelerator()
    if not enabled or device is None:
        yield
        return
    load_model(model, device)
    try:
        yield
    finally:
        offload_model(model)


def iter_full_params(model: nn.Module, device: str | torch.device | None = "cpu",
                     dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, full tensor)`` for every state-dict entry, gathered on every rank.

    ``device``: where the full tensors go (None: where the gather leaves them, the parameters'
    device); ``dtype``: floating-point entries are cast to it (None: kept). Gathering on the GPU in
    the rollout's bf16 halves the bytes of a weight push and keeps it off the host.

    Collective: all ranks must consume the iterator fully and in step. Memory stays at one full
    tensor at a time, which suits pushing weights to a colocated rollout engine.
    """
    from torch.distributed.tensor import DTensor

    for name, tensor in model.state_dict().items():
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        yield name, tensor.detach() if device is None else tensor.detach().to(device)


def get_full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded fp32 CPU state dict on rank 0 (an empty dict on other ranks). Collective.

    Uses ``torch.distributed.checkpoint.state_dict.get_model_state_dict`` with
    ``full_state_dict=True, cpu_offload=True``.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def clip_grad_and_step(model: nn.Module, optimizer: torch.optim.Optimizer,
                       grad_clip: float | None) -> tuple[float, bool]:
    """Clip the global grad norm to ``grad_clip`` and step; skip the step if the norm is not finite.

    A NaN/inf norm (overflow, a bad batch) would poison the weights and Adam moments, so the step is
    skipped and the gradients cleared; callers log the returned norm.

    Returns:
        ``(grad_norm, stepped)``: the pre-clip L2 norm over all ranks' shards and whether
        ``optimizer.step()`` ran.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    max_norm = float(grad_clip) if grad_clip and grad_clip > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    norm = float(norm)
    if not math.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        return norm, False
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, True
