"""Settings of loading, sharding and optimising a model (RL workers and SFT share them).

``ModelSource`` (what every role's model section has) and the policy's ``ModelConfig`` are read by :func:`verl.utils.fsdp_utils.load_causal_lm` / ``load_value_model``,
``FSDPConfig`` by :func:`verl.utils.fsdp_utils.apply_fsdp2` and the workers' placement of parameters
(:func:`verl.utils.fsdp_utils.resident`) and optimizer state,
``OptimConfig`` by :func:`verl.utils.torch_functional.build_optimizer` / ``build_lr_scheduler``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass(frozen=True)
class ModelSource:
    """Where a Hugging Face model comes from and how it loads: the keys every role's ``model``
    section has (the actor's, the critic's, SFT's); each role's class adds its own."""

    path: str = "Qwen/Qwen2.5-3B"
    """the model: a local folder or a hub id"""
    tokenizer_path: Optional[str] = None
    """its tokenizer; `null`: `path`"""
    external_lib: Optional[str] = None
    """module to import before loading the model (registers custom architectures)"""
    override_config: Dict[str, Any] = field(default_factory=dict)
    """HF config fields to override at load"""
    trust_remote_code: bool = False
    """allow model code from the hub"""
    attn_implementation: Optional[str] = None
    """attention kernel; `null`: `flash_attention_2` on a GPU with `flash_attn` installed, else
    `torch_varlen` on a GPU (torch's varlen flash kernel, `verl/utils/varlen_attention.py`), else
    `sdpa`. `share_prompts` needs `sdpa` or `eager`"""
    gguf_file: Optional[str] = None
    """a GGUF file inside `path` to load (transformers dequantizes it)"""


@dataclass(frozen=True)
class ModelConfig(ModelSource):
    """The policy (``actor_rollout_ref.model``): its source, forward layout and LoRA."""

    path: str = "Qwen/Qwen2.5-3B"
    """policy model: a local folder or a hub id"""
    enable_gradient_checkpointing: bool = True
    """activation checkpointing (non-reentrant) in the trained model"""
    use_remove_padding: bool = True
    """packed (padding-free) forward passes"""
    max_packed_row_len: int = 4096
    """with packing, tokens per packed row (0: one row per micro-batch); sdpa's block-diagonal mask
    costs the square of it (docs/benchmarks.md has the measured best per machine; the embedded CPU
    default sets 1024); ignored under `torch_varlen` attention, which has no such cost"""
    share_prompts: bool = True
    """with packing and sdpa/eager attention, rows with the same prompt (a GRPO group) share one copy
    of it under a custom attention mask: same log-probs and gradients, the prompt computed once per
    group (`verl/utils/prefix_sharing.py`); not available with flash/varlen attention (a GPU with
    `attn_implementation` unset), where it is off and logged once at start"""
    lora_rank: int = 0
    """> 0: train LoRA adapters (peft) instead of all weights; the reference policy is the same model
    with adapters disabled (no second copy), the rollout engine receives merged weights, checkpoints
    export merged HF weights"""
    lora_alpha: int = 16
    """LoRA scaling numerator (scale = alpha / rank)"""
    target_modules: Any = None
    """modules given adapters: `null` or `all-linear` = every linear layer except the LM head, or a
    list such as `[q_proj, v_proj]`"""


@dataclass(frozen=True)
class FSDPConfig:
    """FSDP2 sharding of one model (``*.fsdp_config``)."""

    param_offload: bool = True
    """veRL's meaning: parameters (and gradients) move to the CPU between phases and back to the GPU
    for each (log-probs, update, weight push, checkpoint), so the rollout engine has the GPU while it
    generates; every phase, the AdamW step included, runs on the GPU (no effect with
    `offload_policy`, whose parameters never leave the CPU)"""
    offload_policy: bool = False
    """FSDP2's CPUOffloadPolicy: parameters, gradients and the AdamW step stay on the CPU, layers are
    copied to the GPU one at a time; for a model whose training state does not fit the GPU at all
    (a 1.5B `update_actor` took 14.5x as long with it as without on an H200: docs/benchmarks.md)"""
    optimizer_offload: bool = True
    """keep optimizer state on the CPU between updates (without `offload_policy`, where it never
    leaves the CPU)"""
    mixed_precision: Optional[str] = "bf16"
    """compute dtype on a GPU: `bf16`, `fp16` or `fp32` (parameters stay fp32; CPU computes in fp32)"""


@dataclass(frozen=True)
class OptimConfig:
    """AdamW and its learning-rate schedule (``*.optim``)."""

    lr: float = 1.0e-6
    """learning rate (AdamW)"""
    lr_warmup_steps_ratio: float = 0.0
    """linear warm-up steps as a fraction of the run's total steps"""
    min_lr_ratio: Optional[float] = None
    """floor of the cosine schedule, as a fraction of `lr`"""
    warmup_style: str = "constant"
    """after warm-up: `constant` or `cosine`"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas"""
    eps: float = 1.0e-8
    """AdamW epsilon"""
