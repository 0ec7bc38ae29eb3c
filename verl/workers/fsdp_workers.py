"""FSDP2 workers the trainer drives through a worker group: actor/rollout/reference and critic.

``ActorRolloutRefWorker`` hosts, in one process per rank, any of: the trainable actor (FSDP2 +
AdamW), the rollout engine (vLLM or transformers, colocated so weights move in memory) and the
frozen reference policy. ``CriticWorker`` hosts the value model. Batch-size keys follow veRL:
algorithmic sizes (``ppo_mini_batch_size``, counted in prompts) are global and multiplied by
``rollout.n``; performance knobs (``*_micro_batch_size_per_gpu``, token budgets) are per rank.
Numerical work lives in :mod:`verl.workers.actor.dp_actor` and :mod:`verl.workers.critic.dp_critic`;
this module wires models, optimizers, engines and checkpoints to the group's calls.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf, open_dict

from verl.protocol import DataProto
from verl.single_controller.base import Dispatch, Worker, register
from verl.utils import fsdp_utils, lora
from verl.utils.checkpoint import FSDPCheckpointManager
from verl.utils.device_memory import PhaseMemory, host_mmap_threshold
from verl.utils.torch_functional import build_lr_scheduler, build_optimizer, use_compiled_token_stats
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.critic.dp_critic import DataParallelPPOCritic

logger = logging.getLogger(__name__)

ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")


def _plain_config(config: Any) -> DictConfig:
    """A resolved, writable copy of a config subtree (dict or DictConfig)."""
    if isinstance(config, DictConfig):
        config = OmegaConf.to_container(config, resolve=True)
    cfg = OmegaConf.create(config)
    OmegaConf.set_struct(cfg, False)
    return cfg


def per_rank(value: int, world_size: int, key: str) -> int:
    """``value // world_size``, refusing sizes that do not split evenly over the ranks.

    Raises:
        ValueError: naming ``key`` when ``value`` is not a positive multiple of ``world_size``.
    """
    if value < world_size or value % world_size:
        raise ValueError(f"{key}={value} must be a positive multiple of the data-parallel size {world_size}")
    return value // world_size


def normalize_micro_batch(node: DictConfig, key: str, world_size: int, use_dynamic: bool) -> None:
    """Fill ``<key>_per_gpu`` from the legacy global ``<key>`` when only that is set.

    Raises:
        ValueError: neither is set and dynamic batching is off.
    """
    per_gpu = node.get(f"{key}_per_gpu")
    if per_gpu is None and node.get(key):
        node[f"{key}_per_gpu"] = per_rank(int(node[key]), world_size, key)
    elif per_gpu is None and not use_dynamic:
        raise ValueError(f"set {key}_per_gpu (or use_dynamic_bsz with a token budget)")


def reduce_metrics_over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """Mean of each metric over the ranks (every rank must hold the same keys). Collective."""
    if not dist.is_initialized() or dist.get_world_size() == 1 or not metrics:
        return metrics
    keys = sorted(metrics)
    values = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(values)
    return {k: float(v) / dist.get_world_size() for k, v in zip(keys, values)}


DEFAULT_PACKED_ROW_LEN = 4096


def _packed_row_len(model_config: DictConfig) -> int:
    """Tokens per packed row with ``use_remove_padding`` (0: one row per micro-batch).

    Attention inside a packed row runs over a dense block-diagonal mask (sdpa), so its cost grows
    with the row length squared: rows of <= 4096 tokens were fastest on the H200, <= 1024 on CPU
    (docs/benchmarks.md).
    """
    return int(model_config.get("max_packed_row_len", DEFAULT_PACKED_ROW_LEN) or 0)


def _on_device(data: DataProto) -> DataProto:
    """A copy of ``data`` with its tensors on this rank's accelerator (CPU without one).

    The controller sends CPU tensors; copying (not ``DataProto.to``, which moves in place) keeps
    the caller's batch on the CPU when the worker runs in the controller's process (local backend).
    """
    device = fsdp_utils.device_name()
    batch = data.batch.to(device) if data.batch is not None else None
    return DataProto(batch=batch, non_tensor_batch=data.non_tensor_batch, meta_info=data.meta_info)


def _metrics_proto(metrics: dict[str, float]) -> DataProto:
    return DataProto.from_dict(meta_info={"metrics": metrics})


def build_rollout(rollout_config: DictConfig, model_path: str, tokenizer):
    """The colocated rollout engine (``verl.workers.rollout.build_rollout_engine``: vLLM or HF).

    The engine loads its own copy of ``model_path`` (the FSDP actor's weights are sharded); after
    each actor update :meth:`ActorRolloutRefWorker._sync_rollout_weights` pushes the new ones.
    """
    from verl.workers.rollout import build_rollout_engine

    return build_rollout_engine(rollout_config, model_path, tokenizer)


def _sampling_params(meta_info: dict, rollout_config: DictConfig):
    """``meta_info["sampling_params"]`` (a SamplingParams dict) or the rollout config's defaults."""
    from verl.workers.rollout.base import SamplingParams

    if "sampling_params" in meta_info:
        return SamplingParams(**meta_info["sampling_params"])
    return SamplingParams(temperature=float(rollout_config.get("temperature", 1.0)),
                          top_p=float(rollout_config.get("top_p", 1.0)), top_k=int(rollout_config.get("top_k", -1)),
                          max_tokens=int(rollout_config.get("response_length", 512)), n=1)


class _FSDPModelWorker(Worker):
    """What the actor and critic workers share: set-up of an FSDP2 model, optimizer, scheduler."""

    def _build_trainable(self, model: torch.nn.Module, fsdp_config: Any, optim_config: Any):
        model = fsdp_utils.apply_fsdp2(model, mixed_precision=fsdp_config.get("mixed_precision"),
                                       param_offload=bool(fsdp_config.get("param_offload", False)))
        optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], optim_config)
        return model, optimizer, build_lr_scheduler(optimizer, optim_config)

    @staticmethod
    def _moves_optimizer(fsdp_config) -> bool:
        # With param_offload, FSDP2 keeps parameters and gradients on the CPU and AdamW steps there:
        # its state must stay on the CPU too (moving it to the GPU breaks the second step).
        return bool(fsdp_config.get("optimizer_offload", False)) and not fsdp_config.get("param_offload", False)

    def _optimizer_on_device(self, optimizer, fsdp_config) -> None:
        if self._moves_optimizer(fsdp_config):
            fsdp_utils.load_optimizer(optimizer, fsdp_utils.device_name())

    def _optimizer_off_device(self, optimizer, fsdp_config) -> None:
        if self._moves_optimizer(fsdp_config):
            fsdp_utils.offload_optimizer(optimizer)

    @staticmethod
    def _load_tokenizer(path: str, trust_remote_code: bool):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer


class ActorRolloutRefWorker(_FSDPModelWorker):
    """Actor, rollout and/or reference in one process (the hybrid engine).

    Args:
        config: the ``actor_rollout_ref`` config subtree (``model``, ``actor``, ``ref``, ``rollout``).
        role: one of ``actor``, ``rollout``, ``ref``, ``actor_rollout``, ``actor_rollout_ref``.
    Raises:
        ValueError: unknown role, or batch sizes that do not split over the ranks.
    """

    def __init__(self, config: Any, role: str = "actor_rollout_ref"):
        super().__init__()
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
        self.role = role
        self.config = _plain_config(config)
        self._is_actor = role in ("actor", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref")
        self.init_process_group()
        self._normalize_config()
        self.actor = self.ref_policy = self.rollout_engine = None
        self.phase_memory = PhaseMemory()

    def _normalize_config(self) -> None:
        cfg, world = self.config, self.world_size
        actor = cfg.setdefault("actor", {})
        rollout = cfg.setdefault("rollout", {})
        use_dynamic = bool(actor.get("use_dynamic_bsz", False))
        if self._is_actor:
            n = int(rollout.get("n", 1))
            actor.ppo_mini_batch_size = per_rank(int(actor.ppo_mini_batch_size) * n, world,
                                                 "actor.ppo_mini_batch_size * rollout.n")
            normalize_micro_batch(actor, "ppo_micro_batch_size", world, use_dynamic)
        for name in ("rollout", "ref"):
            node = cfg.setdefault(name, {})
            normalize_micro_batch(node, "log_prob_micro_batch_size", world,
                                  bool(node.get("log_prob_use_dynamic_bsz", use_dynamic)))
        # the actor's forward layout follows the model node (as in veRL)
        actor.use_remove_padding = bool(cfg.model.get("use_remove_padding", False))
        actor.max_packed_row_len = _packed_row_len(cfg.model)
        actor.share_prompts = bool(cfg.model.get("share_prompts", False))

    # ------------------------------------------------------------------ set-up
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the models this role needs, shard them, build optimizer and rollout engine."""
        model_cfg = self.config.model
        self.tokenizer = self._load_tokenizer(model_cfg.get("tokenizer_path") or model_cfg.path,
                                              bool(model_cfg.get("trust_remote_code", False)))
        if self._is_actor:
            self._init_actor()
        if self._is_ref:
            self._init_ref()
        if self._is_rollout:
            if torch.cuda.is_available():  # what the engine's memory check will see
                free, total = torch.cuda.mem_get_info()
                logger.info("before rollout engine: %.1f of %.1f GiB free, %.1f GiB allocated by torch here",
                            free / 2**30, total / 2**30, torch.cuda.memory_allocated() / 2**30)
            self.rollout_engine = build_rollout(self.config.rollout, model_cfg.path, self.tokenizer)
            if self._is_actor and lora.is_lora_model(self.actor_module):
                self._sync_rollout_weights()  # the engine loaded the base; serve merged weights

    def _init_actor(self) -> None:
        actor_cfg, fsdp_cfg = self.config.actor, self.config.actor.get("fsdp_config", {})
        model = fsdp_utils.load_causal_lm(self.config.model, torch_dtype=torch.float32, trainable=True)
        model = lora.maybe_wrap_lora(model, self.config.model)
        if lora.is_lora_model(model) and self.config.model.get("enable_gradient_checkpointing", False):
            model.enable_input_require_grads()  # checkpointed blocks need a grad-carrying input
        # the transformers rollout generates with this very module: keep its layers eager
        self._maybe_compile(model, compile_layers=not (self._is_rollout and self.config.rollout.name == "hf"))
        self.actor_module, self.actor_optimizer, self.lr_scheduler = self._build_trainable(
            model, fsdp_cfg, actor_cfg.optim)
        self.actor = DataParallelPPOActor(actor_cfg, self.actor_module, self.actor_optimizer)
        self.checkpoint_manager = FSDPCheckpointManager(self.actor_module, self.actor_optimizer,
                                                        self.lr_scheduler, self.tokenizer)
        self._optimizer_off_device(self.actor_optimizer, fsdp_cfg)

    def _init_ref(self) -> None:
        ref_cfg = _plain_config(self.config.ref)
        ref_cfg.use_remove_padding = bool(self.config.model.get("use_remove_padding", False))
        ref_cfg.max_packed_row_len = _packed_row_len(self.config.model)
        ref_cfg.share_prompts = bool(self.config.model.get("share_prompts", False))
        if self._is_actor and lora.is_lora_model(self.actor_module):
            # Hook: a LoRA actor's reference is its own base (adapters disabled), no second copy.
            self.ref_module = None
            self.ref_policy = DataParallelPPOActor(ref_cfg, self.actor_module)
            return
        model = fsdp_utils.load_causal_lm(self.config.model, torch_dtype=torch.float32, trainable=False)
        self._maybe_compile(model, compile_layers=True)
        self.ref_module = fsdp_utils.apply_fsdp2(
            model, mixed_precision=self.config.actor.get("fsdp_config", {}).get("mixed_precision"),
            param_offload=bool(ref_cfg.get("fsdp_config", {}).get("param_offload", False)))
        self.ref_policy = DataParallelPPOActor(ref_cfg, self.ref_module)

    def _maybe_compile(self, model: torch.nn.Module, compile_layers: bool) -> None:
        """``actor.use_torch_compile`` on a GPU: compiled log-prob/entropy chunks and decoder layers.

        CPU runs stay eager (inductor's CPU backend needs a C++ toolchain, and compilation costs
        more than it saves on the small CPU batches); LoRA models stay eager (peft's wrappers).
        """
        if not (torch.cuda.is_available() and self.config.actor.get("use_torch_compile", True)):
            return
        use_compiled_token_stats(True)
        if compile_layers and not lora.is_lora_model(model):
            fsdp_utils.compile_decoder_layers(model)

    # ------------------------------------------------------------------ rollout
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, data: DataProto) -> DataProto:
        """Sample continuations of ``non_tensor_batch["raw_prompt_ids"]`` (lists of token ids).

        Sampling parameters come from ``meta_info["sampling_params"]`` (a ``SamplingParams``
        dict) or the rollout config. Returns per-row ``output_token_ids``, ``output_log_probs``,
        ``finish_reason`` and ``stop_str`` (``n`` rows per prompt, samples adjacent).
        """
        if self.rollout_engine is None:
            raise RuntimeError(f"generate_sequences on a worker with role {self.role!r} (no rollout engine)")
        prompts = [list(map(int, ids)) for ids in data.non_tensor_batch["raw_prompt_ids"]]
        with self.phase_memory.track("gen"):
            outputs = self.rollout_engine.generate(prompts, _sampling_params(data.meta_info, self.config.rollout))
        return DataProto.from_dict(non_tensors={
            "output_token_ids": [list(o.token_ids) for o in outputs],
            "output_log_probs": [list(o.log_probs) for o in outputs],
            "finish_reason": [o.finish_reason for o in outputs],
            "stop_str": [o.stop_str for o in outputs]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_trajectories(self, data: DataProto) -> DataProto:
        """Run the multi-turn rollout of this rank's rows beside the engine (async rollout mode).

        ``meta_info["agent_loop"]`` is a picklable callable ``(engine, tokenizer, data) -> DataProto``
        (``search_r1.llm_agent.async_rollout.AgentLoop``) sent by the controller; it runs one task
        per row against this worker's engine and returns the trajectories (prompts, responses,
        masks, rollout log-probs, per-row stats).
        """
        if self.rollout_engine is None:
            raise RuntimeError(f"generate_trajectories on a worker with role {self.role!r} (no rollout engine)")
        agent_loop = data.meta_info["agent_loop"]
        with self.phase_memory.track("gen"):
            return agent_loop(self.rollout_engine, self.tokenizer, data)

    def _sync_rollout_weights(self) -> None:
        """Push the actor's current full weights into the colocated engine (collective)."""
        if self.rollout_engine is None:
            return
        if lora.is_lora_model(self.actor_module):
            state = dict(fsdp_utils.iter_full_params(self.actor_module))
            named = lora.merged_state_dict(state, lora.lora_scaling(self.actor_module)).items()
        else:  # full tensors stay on the accelerator, already in the engine's dtype (bf16 on GPU)
            named = fsdp_utils.iter_full_params(self.actor_module, device=None,
                                                dtype=self.rollout_engine.weight_dtype)
        self.rollout_engine.update_weights(named)

    # ------------------------------------------------------------------ log-probs
    def _log_prob_meta(self, data: DataProto, node: DictConfig) -> None:
        data.meta_info.setdefault("micro_batch_size", node.get("log_prob_micro_batch_size_per_gpu"))
        data.meta_info.setdefault("use_dynamic_bsz", bool(node.get("log_prob_use_dynamic_bsz",
                                                                   self.config.actor.get("use_dynamic_bsz", False))))
        data.meta_info.setdefault("max_token_len", node.get("log_prob_max_token_len_per_gpu")
                                  or self.config.actor.get("ppo_max_token_len_per_gpu"))
        data.meta_info.setdefault("temperature", float(self.config.rollout.get("temperature", 1.0)))

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` ``(B, R)`` of the current actor (no grad)."""
        if self.actor is None:
            raise RuntimeError(f"compute_log_prob on a worker with role {self.role!r} (no actor)")
        self._log_prob_meta(data, self.config.rollout)
        with self.phase_memory.track("old_log_prob"):
            log_probs, entropy = self.actor.compute_log_prob(_on_device(data), calculate_entropy=True)
        return DataProto.from_dict(tensors={"old_log_probs": log_probs.cpu(), "entropys": entropy.cpu()},
                                   meta_info={"temperature": data.meta_info["temperature"]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_probs`` ``(B, R)`` of the frozen reference policy."""
        if self.ref_policy is None:
            raise RuntimeError(f"compute_ref_log_prob on a worker with role {self.role!r} (no reference)")
        self._log_prob_meta(data, self.config.ref)
        with lora.reference_policy(self.ref_policy.actor_module), self.phase_memory.track("ref"):
            log_probs, _ = self.ref_policy.compute_log_prob(_on_device(data), calculate_entropy=False)
        return DataProto.from_dict(tensors={"ref_log_probs": log_probs.cpu()})

    # ------------------------------------------------------------------ update
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """One PPO update on this rank's rows; then the rollout engine gets the new weights.

        Returns:
            An empty DataProto whose ``meta_info["metrics"]`` holds the actor metrics averaged
            over ranks (``actor/pg_loss``, ``actor/grad_norm``, ``actor/lr``, ...).
        """
        if self.actor is None:
            raise RuntimeError(f"update_actor on a worker with role {self.role!r} (no actor)")
        fsdp_cfg = self.config.actor.get("fsdp_config", {})
        data.meta_info.setdefault("temperature", float(self.config.rollout.get("temperature", 1.0)))
        if self.rollout_engine is not None:
            self.rollout_engine.release_memory()
        with self.phase_memory.track("update_actor"), host_mmap_threshold(self._update_mmap_threshold()):
            self._optimizer_on_device(self.actor_optimizer, fsdp_cfg)
            metrics = self.actor.update_policy(_on_device(data))
            metrics["actor/lr"] = self.lr_scheduler.get_last_lr()[0]
            self.lr_scheduler.step()
            self._optimizer_off_device(self.actor_optimizer, fsdp_cfg)
        if self.rollout_engine is not None:
            started = time.perf_counter()
            with self.phase_memory.track("weight_sync"):
                self.rollout_engine.resume_memory()
                self._sync_rollout_weights()
            metrics["timing_s/weight_sync"] = time.perf_counter() - started
        metrics.update(self.phase_memory.pop_metrics())
        return _metrics_proto(reduce_metrics_over_ranks(metrics))

    def _update_mmap_threshold(self) -> int | None:
        """Bytes for :func:`host_mmap_threshold` during the update: CPU-only runs, from
        ``actor.update_mmap_threshold_mib`` (null/0: glibc's own threshold)."""
        mib = self.config.actor.get("update_mmap_threshold_mib", None)
        if not mib or torch.cuda.is_available():
            return None
        return int(float(mib) * 2**20)

    # ------------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int | None = None) -> None:
        """Model, optimizer, LR scheduler and RNG of every rank into ``local_path``."""
        self.checkpoint_manager.save(local_path, global_step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> None:
        """Restore :meth:`save_checkpoint`'s state and refresh the rollout engine's weights."""
        self.checkpoint_manager.load(local_path)
        self._sync_rollout_weights()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        """A ``from_pretrained`` folder of the actor (rank 0 writes; LoRA adapters merged)."""
        if lora.is_lora_model(self.actor_module):
            state = fsdp_utils.get_full_state_dict(self.actor_module)
            if self.rank == 0:
                lora.export_merged(state, self.actor_module.config, path,
                                   lora.lora_scaling(self.actor_module), tokenizer=self.tokenizer)
            return
        self.checkpoint_manager.export_hf(path)


class CriticWorker(_FSDPModelWorker):
    """The value model (LM body + scalar head) with its optimizer.

    Args:
        config: the ``critic`` config subtree (``model``, ``optim``, batch sizes, ``cliprange_value``,
            ``rollout_n``: samples per prompt, default 1, multiplies ``ppo_mini_batch_size``).
    """

    def __init__(self, config: Any):
        super().__init__()
        self.config = _plain_config(config)
        self.init_process_group()
        self.phase_memory = PhaseMemory()
        cfg, world = self.config, self.world_size
        use_dynamic = bool(cfg.get("use_dynamic_bsz", False))
        cfg.ppo_mini_batch_size = per_rank(int(cfg.ppo_mini_batch_size) * int(cfg.get("rollout_n", 1) or 1), world,
                                           "critic.ppo_mini_batch_size * rollout_n")
        normalize_micro_batch(cfg, "ppo_micro_batch_size", world, use_dynamic)
        if cfg.get("forward_micro_batch_size_per_gpu") is None and not cfg.get("forward_micro_batch_size"):
            cfg.forward_micro_batch_size_per_gpu = cfg.get("ppo_micro_batch_size_per_gpu")
        normalize_micro_batch(cfg, "forward_micro_batch_size", world, use_dynamic)
        cfg.use_remove_padding = bool(cfg.model.get("use_remove_padding", False))
        cfg.max_packed_row_len = _packed_row_len(cfg.model)

    def _fsdp_config(self):
        return self.config.model.get("fsdp_config") or self.config.get("fsdp_config") or {}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the value model from the (causal-LM) checkpoint, shard it, build the optimizer."""
        model_cfg = self.config.model
        self.tokenizer = self._load_tokenizer(model_cfg.get("tokenizer_path") or model_cfg.path,
                                              bool(model_cfg.get("trust_remote_code", False)))
        model = fsdp_utils.load_value_model(model_cfg, torch_dtype=torch.float32)
        self.critic_module, self.critic_optimizer, self.lr_scheduler = self._build_trainable(
            model, self._fsdp_config(), self.config.optim)
        self.critic = DataParallelPPOCritic(self.config, self.critic_module, self.critic_optimizer)
        self.checkpoint_manager = FSDPCheckpointManager(self.critic_module, self.critic_optimizer,
                                                        self.lr_scheduler, self.tokenizer)
        self._optimizer_off_device(self.critic_optimizer, self._fsdp_config())

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` ``(B, R)``: the critic's estimate before each response token."""
        with self.phase_memory.track("values"):
            values = self.critic.compute_values(_on_device(data))
        return DataProto.from_dict(tensors={"values": values.cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        """Clipped value-loss epochs; ``meta_info["metrics"]`` as for the actor (``critic/*``)."""
        with self.phase_memory.track("update_critic"):
            self._optimizer_on_device(self.critic_optimizer, self._fsdp_config())
            metrics = self.critic.update_critic(_on_device(data))
            metrics["critic/lr"] = self.lr_scheduler.get_last_lr()[0]
            self.lr_scheduler.step()
            self._optimizer_off_device(self.critic_optimizer, self._fsdp_config())
        metrics.update(self.phase_memory.pop_metrics())
        return _metrics_proto(reduce_metrics_over_ranks(metrics))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int | None = None) -> None:
        """Model, optimizer, LR scheduler and RNG of every rank into ``local_path``."""
        self.checkpoint_manager.save(local_path, global_step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> None:
        """Restore :meth:`save_checkpoint`'s state."""
        self.checkpoint_manager.load(local_path)
