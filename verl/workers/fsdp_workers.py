"""FSDP2 workers the trainer drives through a worker group: actor/rollout/reference and critic.

``ActorRolloutRefWorker`` hosts, in one process per rank, any of: the trainable actor (FSDP2 +
AdamW), the rollout engine (vLLM or transformers, colocated so weights move in memory) and the
frozen reference policy. ``CriticWorker`` hosts the value model. With ``fsdp_config.param_offload`` a
model lives on the host between phases and each phase that touches it (log-probs, update, weight
push, checkpoint, export) runs inside :func:`verl.utils.fsdp_utils.resident`, which brings it to the
GPU for that phase. Each takes its typed config section
and a :class:`WorkerRun` (what the trainer derived for the whole run); the per-rank batch sizes come
from :mod:`verl.workers.batching`. Numerical work lives in :mod:`verl.workers.actor.dp_actor`,
:mod:`verl.workers.critic.dp_critic` and :mod:`verl.workers.forward`; this module wires models,
optimizers, engines and checkpoints to the group's calls.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller.base import Dispatch, Worker, register
from verl.single_controller.base.host import reachable_address
from verl.utils import fsdp_utils, lora
from verl.utils.checkpoint import FSDPCheckpointManager
from verl.utils.config import to_typed
from verl.utils.device_memory import PhaseMemory
from verl.utils.host_memory import HostMemoryConfig, HostMemoryHook
from verl.utils.optimizer_offload import OptimizerOffload
from verl.utils.torch_functional import build_lr_scheduler, build_optimizer
from verl.workers import batching, weight_sync
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config import ActorRolloutRefConfig
from verl.workers.critic.config import CriticConfig
from verl.workers.critic.dp_critic import DataParallelPPOCritic
from verl.workers.forward import ForwardLayout

logger = logging.getLogger(__name__)

ROLES = ("actor", "rollout", "ref", "actor_ref", "actor_rollout", "actor_rollout_ref")


@dataclass(frozen=True)
class WorkerRun:
    """What the workers need to know about the run beyond their own config section.

    The trainer derives these once (:mod:`verl.trainer.ppo.run_plan`); the defaults serve workers
    built alone (tests, benchmarks).

    Args:
        rollout_n: responses per prompt (the mini-batch rows are ``ppo_mini_batch_size x rollout_n``).
        total_training_steps: optimizer steps of the run (length of the LR schedules).
        max_model_len: the rollout engine's context length (None: the engine's own default).
        host_memory: CPU-only heap tuning (:mod:`verl.utils.host_memory`).
    """

    rollout_n: int = 1
    total_training_steps: int = 0
    max_model_len: int | None = None
    host_memory: HostMemoryConfig = field(default_factory=HostMemoryConfig)


def reduce_metrics_over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """Mean of each metric over the ranks (every rank must hold the same keys). Collective."""
    if not dist.is_initialized() or dist.get_world_size() == 1 or not metrics:
        return metrics
    keys = sorted(metrics)
    values = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(values)
    return {k: float(v) / dist.get_world_size() for k, v in zip(keys, values)}


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


def _load_tokenizer(path: str, trust_remote_code: bool):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


class _FSDPModelWorker(Worker):
    """What the actor and critic workers share: an FSDP2 model with optimizer and scheduler, phases."""

    def __init__(self, run: WorkerRun | None):
        super().__init__()
        self.run = run or WorkerRun()
        self.phase_memory = PhaseMemory()
        self.host_memory = HostMemoryHook(self.run.host_memory)
        self.optimizer_offload: OptimizerOffload | None = None  # set by _build_trainable

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        """One phase of a step: its peak memory is recorded, and on CPU the heap trimmed after it."""
        with self.host_memory.phase(name), self.phase_memory.track(name):
            yield

    def _phase_metrics(self) -> dict[str, float]:
        return {**self.phase_memory.pop_metrics(), **self.host_memory.pop_metrics()}

    def _build_trainable(self, model: torch.nn.Module, fsdp_config, optim_config):
        """``(sharded model, optimizer, LR scheduler)``; ``self.optimizer_offload`` moves the optimizer's
        state between updates when ``fsdp_config`` says so and there is an accelerator (else None)."""
        model = self._shard(model, fsdp_config, fsdp_config.mixed_precision)
        optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], optim_config)
        device = fsdp_utils.accelerator()
        if self._moves_optimizer(fsdp_config) and device is not None:
            self.optimizer_offload = OptimizerOffload(optimizer, device)
        return model, optimizer, build_lr_scheduler(optimizer, optim_config, self.run.total_training_steps)

    def _shard(self, model: torch.nn.Module, fsdp_config, mixed_precision: str | None) -> torch.nn.Module:
        """FSDP2 on ``model``; with ``param_offload`` it then goes to the host, its home between phases
        (the rollout engine, built after, gets the GPU memory)."""
        model = fsdp_utils.apply_fsdp2(model, mixed_precision=mixed_precision,
                                       offload_policy=fsdp_config.offload_policy)
        if self._moves_parameters(fsdp_config):
            fsdp_utils.offload_model(model)
        return model

    @staticmethod
    def _moves_parameters(fsdp_config) -> bool:
        # With offload_policy the parameters never leave the host: nothing to move between phases.
        return fsdp_config.param_offload and not fsdp_config.offload_policy

    @staticmethod
    def _moves_optimizer(fsdp_config) -> bool:
        # With offload_policy, FSDP2 keeps parameters and gradients on the CPU and AdamW steps there:
        # its state must stay on the CPU too (moving it to the GPU breaks the second step).
        return fsdp_config.optimizer_offload and not fsdp_config.offload_policy

    def _resident(self, model: torch.nn.Module, fsdp_config):
        """The context of every phase that touches ``model``: on the GPU inside it when its
        ``param_offload`` moves it between phases (:func:`verl.utils.fsdp_utils.resident`)."""
        return fsdp_utils.resident(model, self._moves_parameters(fsdp_config))

    def _optimizer_on_device(self) -> None:
        if self.optimizer_offload is not None:
            self.optimizer_offload.load()

    def _optimizer_off_device(self) -> None:
        if self.optimizer_offload is not None:
            self.optimizer_offload.offload()

    def _step_scheduler(self, metrics: dict[str, float], key: str) -> None:
        metrics[key] = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()


def role_batchings(config: ActorRolloutRefConfig, rollout_n: int, world_size: int, is_actor: bool, is_ref: bool):
    """``(update, old log-prob, ref log-prob)`` per-rank batchings of the passes a role runs (None for the
    others): an engine's ranks alone (split pools) need none, and their count need not divide the batch.

    Raises:
        ValueError: batch sizes that do not split over ``world_size`` ranks (naming the key).
    """
    update = batching.actor_update_batching(config.actor, rollout_n, world_size) if is_actor else None
    old = batching.log_prob_batching("rollout", config.rollout, config.actor, world_size) if is_actor else None
    ref = batching.log_prob_batching("ref", config.ref, config.actor, world_size) if is_ref else None
    return update, old, ref


class ActorRolloutRefWorker(_FSDPModelWorker):
    """Actor, rollout and/or reference in one process (the hybrid engine).

    Args:
        config: the ``actor_rollout_ref`` section (an ``ActorRolloutRefConfig`` or a mapping of it).
        role: one of ``actor``, ``rollout``, ``ref``, ``actor_ref``, ``actor_rollout``, ``actor_rollout_ref``
            (``actor_ref`` and ``rollout`` are the two sides of split pools, :mod:`verl.workers.weight_sync`).
        run: the run's derived values (:class:`WorkerRun`).
    Raises:
        ValueError: unknown role, a malformed config, or batch sizes that do not split over the ranks.
    """

    def __init__(self, config: Any, role: str = "actor_rollout_ref", run: WorkerRun | None = None):
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
        self.config = to_typed(ActorRolloutRefConfig, config, "actor_rollout_ref")
        super().__init__(run or WorkerRun(rollout_n=self.config.rollout.n))
        self.role = role
        self._is_actor = role in ("actor", "actor_ref", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_ref", "actor_rollout_ref")
        self.init_process_group()
        self.update_batching, self.old_log_prob_batching, self.ref_log_prob_batching = role_batchings(
            self.config, self.run.rollout_n, self.world_size, self._is_actor, self._is_ref)
        self.actor = self.ref_policy = self.rollout_engine = None
        # one user of the engine at a time: with rollout.staleness=1 a rollout runs on a second
        # thread of this process while the update runs, and the weight push waits for it
        self._engine_lock = threading.Lock()
        self.updates_pushed = 0  # actor updates whose weights this process pushed into its engine
        self._weight_sync = None  # split pools: the broadcast group of actor rank 0 and the rollout ranks

    # ------------------------------------------------------------------ set-up
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the models this role needs, shard them, build optimizer and rollout engine."""
        model_cfg = self.config.model
        self.tokenizer = _load_tokenizer(model_cfg.tokenizer_path or model_cfg.path, model_cfg.trust_remote_code)
        if self._is_actor:
            self._init_actor()
        if self._is_ref:
            self._init_ref()
        if self._is_rollout:
            self._init_rollout()

    def _layout(self, model: torch.nn.Module) -> ForwardLayout:
        compiled = torch.cuda.is_available() and self.config.actor.use_torch_compile
        return ForwardLayout.for_model(self.config.model, model, compiled_token_stats=compiled)

    def _init_actor(self) -> None:
        actor_cfg = self.config.actor
        model = fsdp_utils.load_causal_lm(self.config.model, torch_dtype=torch.float32, trainable=True)
        model = lora.maybe_wrap_lora(model, self.config.model)
        if lora.is_lora_model(model) and self.config.model.enable_gradient_checkpointing:
            model.enable_input_require_grads()  # checkpointed blocks need a grad-carrying input
        self._maybe_compile_layers(model)
        self.actor_module, self.actor_optimizer, self.lr_scheduler = self._build_trainable(
            model, actor_cfg.fsdp_config, actor_cfg.optim)
        self.actor = DataParallelPPOActor(actor_cfg, self.actor_module, self.actor_optimizer,
                                          layout=self._layout(self.actor_module), update=self.update_batching)
        self.checkpoint_manager = FSDPCheckpointManager(self.actor_module, self.actor_optimizer,
                                                        self.lr_scheduler, self.tokenizer)
        self._optimizer_off_device()

    def _init_ref(self) -> None:
        if self._is_actor and lora.is_lora_model(self.actor_module):
            # A LoRA actor's reference is its own base (adapters disabled), no second copy.
            self.ref_module = None
            self.ref_policy = DataParallelPPOActor(self.config.actor, self.actor_module, layout=self.actor.layout)
            return
        # A frozen model needs no fp32 master copy: stored in the dtype it computes in (the actor's), it
        # gives the same numbers as an fp32 copy cast per layer, holds half the memory, and its offload
        # (per layer or per phase) moves half the bytes between host and GPU.
        mixed_precision = self.config.actor.fsdp_config.mixed_precision
        model = fsdp_utils.load_causal_lm(self.config.model, torch_dtype=fsdp_utils.compute_dtype(mixed_precision),
                                          trainable=False)
        self._maybe_compile_layers(model)
        self.ref_module = self._shard(model, self.config.ref.fsdp_config, mixed_precision)
        self.ref_policy = DataParallelPPOActor(self.config.actor, self.ref_module, layout=self._layout(self.ref_module))

    def _init_rollout(self) -> None:
        from verl.workers.rollout import build_rollout_engine

        if torch.cuda.is_available():  # what the engine's memory check will see
            free, total = torch.cuda.mem_get_info()
            logger.info("before rollout engine: %.1f of %.1f GiB free, %.1f GiB allocated by torch here",
                        free / 2**30, total / 2**30, torch.cuda.memory_allocated() / 2**30)
        # The engine loads its own copy of model.path (the FSDP actor's weights are sharded); after
        # each actor update _sync_rollout_weights pushes the new ones.
        self.rollout_engine = build_rollout_engine(self.config.rollout, self.config.model.path, self.tokenizer,
                                                   max_model_len=self.run.max_model_len)
        if self._is_actor and lora.is_lora_model(self.actor_module):
            with self._actor_resident():
                self._sync_rollout_weights()  # the engine loaded the base; serve merged weights

    def _maybe_compile_layers(self, model: torch.nn.Module) -> None:
        """``actor.use_torch_compile`` on a GPU: compile each decoder layer (LoRA models stay eager).

        CPU runs stay eager (inductor's CPU backend needs a C++ toolchain, and compilation costs
        more than it saves on the small CPU batches).
        """
        if torch.cuda.is_available() and self.config.actor.use_torch_compile and not lora.is_lora_model(model):
            fsdp_utils.compile_decoder_layers(model)

    # ------------------------------------------------------------------ rollout
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, data: DataProto) -> DataProto:
        """Sample continuations of ``non_tensor_batch["raw_prompt_ids"]`` (lists of token ids).

        ``meta_info["sampling_params"]`` (a ``SamplingParams`` dict, built by the trainer) says how.
        Returns per-row ``output_token_ids``, ``output_log_probs``, ``finish_reason`` and ``stop_str``.

        Raises:
            RuntimeError: this role has no engine; ValueError: no sampling parameters were sent.
        """
        from verl.workers.rollout.base import SamplingParams

        if self.rollout_engine is None:
            raise RuntimeError(f"generate_sequences on a worker with role {self.role!r} (no rollout engine)")
        if "sampling_params" not in data.meta_info:
            raise ValueError("generate_sequences needs meta_info['sampling_params'] (a SamplingParams dict)")
        prompts = [list(map(int, ids)) for ids in data.non_tensor_batch["raw_prompt_ids"]]
        with self._engine_lock, self._phase("gen"):
            outputs = self.rollout_engine.generate(prompts, SamplingParams(**data.meta_info["sampling_params"]))
        return DataProto.from_dict(non_tensors={
            "output_token_ids": [list(o.token_ids) for o in outputs],
            "output_log_probs": [list(o.log_probs) for o in outputs],
            "finish_reason": [o.finish_reason for o in outputs],
            "stop_str": [o.stop_str for o in outputs]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def generate_trajectories(self, data: DataProto) -> DataProto:
        """Run the multi-turn rollout of this rank's rows beside the engine (either rollout mode).

        ``meta_info["agent_loop"]`` is a picklable callable ``(engine, tokenizer, data) -> DataProto``
        (``verl.workers.rollout.agent_loop.remote.AgentLoop``) sent by the controller; it runs the
        rows' multi-turn loop against this worker's engine and returns the trajectories (prompts,
        responses, masks, rollout log-probs, per-row stats) with ``meta_info["updates_pushed"]``:
        the actor updates in the engine's weights when the rollout started. Non-blocking: the group
        call returns a pending call (``.get()``), so a rollout can run beside the update.
        """
        if self.rollout_engine is None:
            raise RuntimeError(f"generate_trajectories on a worker with role {self.role!r} (no rollout engine)")
        agent_loop = data.meta_info["agent_loop"]
        with self._engine_lock, self._phase("gen"):
            updates = self.updates_pushed
            output = agent_loop(self.rollout_engine, self.tokenizer, data)
        output.meta_info["updates_pushed"] = updates
        return output

    def _actor_resident(self):
        return self._resident(self.actor_module, self.config.actor.fsdp_config)

    def _ref_resident(self):
        # a LoRA actor's reference is the actor module itself, placed as the actor says
        if self.ref_module is None:
            return self._actor_resident()
        return self._resident(self.ref_module, self.config.ref.fsdp_config)

    def _sync_rollout_weights(self) -> None:
        """Push the actor's current full weights into the colocated engine (collective; inside
        :meth:`_actor_resident`)."""
        if self.rollout_engine is None:
            return
        self.rollout_engine.update_weights(self._engine_weights(self.rollout_engine.weight_dtype))

    def _engine_weights(self, dtype: torch.dtype | None):
        """``(name, tensor)`` pairs: the actor's full weights as an engine loads them, floating point ones
        in ``dtype`` (None: kept); a LoRA actor's merged (a dict's items). Collective over the actor's
        ranks (every rank consumes the pairs), inside :meth:`_actor_resident`."""
        if lora.is_lora_model(self.actor_module):
            state = dict(fsdp_utils.iter_full_params(self.actor_module))
            merged = lora.merged_state_dict(state, lora.lora_scaling(self.actor_module))
            if dtype is not None:
                merged = {name: t.to(dtype) if t.is_floating_point() else t for name, t in merged.items()}
            return merged.items()
        # full tensors stay on the accelerator, already in the engine's dtype (bf16 on GPU)
        return fsdp_utils.iter_full_params(self.actor_module, device=None, dtype=dtype)

    # ------------------------------------------------------------------ split pools
    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def weight_sync_address(self) -> tuple[str, int]:
        """Where the weight-sync group of split pools meets: this node's address and a free port."""
        return reachable_address()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_sync(self, host: str, port: int, world_size: int, timeout_s: float = 600.0) -> None:
        """Join the broadcast group of split pools (:class:`~verl.workers.weight_sync.WeightBroadcast`):
        the actor's rank 0 as its sender (the other actor ranks only gather), every rollout rank as
        receiver ``1 + rank``. Both groups must be called at once (the group's set-up waits for all).

        Raises:
            RuntimeError: a role that is neither the actor nor the rollout alone, or the group not formed.
        """
        if self._is_actor == self._is_rollout:
            raise RuntimeError(f"join_weight_sync on a worker with role {self.role!r}: split pools put the actor "
                               f"and the rollout in separate workers")
        use_gpu = torch.cuda.is_available()
        if self._is_rollout:
            self._weight_sync = weight_sync.WeightBroadcast(host, port, 1 + self.rank, world_size, use_gpu, timeout_s,
                                                            engine_dtype=self.rollout_engine.weight_dtype)
        elif self.rank == 0:
            self._weight_sync = weight_sync.WeightBroadcast(host, port, 0, world_size, use_gpu, timeout_s)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def send_weights(self) -> dict[str, float]:
        """The actor's full weights to the rollout ranks (every actor rank gathers, rank 0 sends);
        returns ``{"weight_sync/bytes": ...}`` (rank 0's)."""
        if self.actor is None:
            raise RuntimeError(f"send_weights on a worker with role {self.role!r} (no actor)")
        dtype = self._weight_sync.engine_dtype if self._weight_sync is not None else None
        with self._phase("weight_sync"), self._actor_resident():
            named = self._engine_weights(dtype)
            if self._weight_sync is None:  # not rank 0: its part is the gathers
                collections.deque(named, maxlen=0)
                return {}
            # the specs without gathering: a LoRA actor's merged weights are already whole
            specs = (weight_sync.specs_of(dict(named)) if lora.is_lora_model(self.actor_module)
                     else weight_sync.state_specs(self.actor_module, dtype))
            sent = self._weight_sync.send(specs, (tensor for _, tensor in named))
            return {"weight_sync/bytes": float(sent)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def receive_weights(self, after_update: bool = True) -> dict[str, float]:
        """Load the weights the actor sends into this rank's engine (``after_update``: they are a new
        update, counted in ``updates_pushed``; a start or a resume is not); returns
        ``timing_s/weight_sync`` (seconds, until the engine holds them). The caller sends no push while
        this engine generates (``TrainingRollouts.settle``); the lock only guards against a misuse."""
        if self._weight_sync is None or self.rollout_engine is None:
            raise RuntimeError(f"receive_weights on a worker with role {self.role!r} outside a weight-sync group")
        started = time.perf_counter()
        with self._engine_lock, self._phase("weight_sync"):
            self.rollout_engine.update_weights(self._weight_sync.receive())
            self.updates_pushed += int(after_update)
        return {"timing_s/weight_sync": time.perf_counter() - started}

    # ------------------------------------------------------------------ log-probs
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` ``(B, R)`` of the current actor (no grad), at the
        rollout's sampling temperature."""
        if self.actor is None:
            raise RuntimeError(f"compute_log_prob on a worker with role {self.role!r} (no actor)")
        with self._phase("old_log_prob"), self._actor_resident():
            log_probs, entropy = self.actor.compute_log_prob(_on_device(data), self.old_log_prob_batching,
                                                             self.config.rollout.temperature, calculate_entropy=True)
        return DataProto.from_dict(tensors={"old_log_probs": log_probs.cpu(), "entropys": entropy.cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_probs`` ``(B, R)`` of the frozen reference policy."""
        if self.ref_policy is None:
            raise RuntimeError(f"compute_ref_log_prob on a worker with role {self.role!r} (no reference)")
        with lora.reference_policy(self.ref_policy.actor_module), self._phase("ref"), self._ref_resident():
            log_probs, _ = self.ref_policy.compute_log_prob(_on_device(data), self.ref_log_prob_batching,
                                                            self.config.rollout.temperature)
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
        releases = self.rollout_engine is not None and self.config.rollout.free_cache_engine
        started = time.perf_counter()
        if releases:
            self.rollout_engine.release_memory()
        release_s = time.perf_counter() - started
        with contextlib.ExitStack() as engine_turn:
            with self._actor_resident():  # one load for the update and the weight push after it
                metrics = self._update_policy(data)
                if self.rollout_engine is not None:
                    started = time.perf_counter()
                    # a rollout running beside this update (rollout.staleness=1) ends first
                    engine_turn.enter_context(self._engine_lock)
                    metrics["timing_s/rollout_wait"] = time.perf_counter() - started
                    self._push_weights(releases)
            # the KV cache comes back once an offloaded actor has left the GPU to it
            if releases:
                self.rollout_engine.resume_memory()
            if self.rollout_engine is not None:
                metrics["timing_s/weight_sync"] = time.perf_counter() - started - metrics["timing_s/rollout_wait"]
        metrics["timing_s/release_memory"] = release_s
        metrics.update(self._phase_metrics())
        return _metrics_proto(reduce_metrics_over_ranks(metrics))

    def _update_policy(self, data: DataProto) -> dict[str, float]:
        """The PPO epochs on a resident actor, its optimizer state on the GPU for them."""
        with self._phase("update_actor"), self.host_memory.update():
            self._optimizer_on_device()
            metrics = self.actor.update_policy(_on_device(data), self.config.rollout.temperature)
            self._step_scheduler(metrics, "actor/lr")
            self._optimizer_off_device()
        return metrics

    def _push_weights(self, released: bool) -> None:
        """The updated weights into the engine (the caller holds the engine and a resident actor); a
        released engine gets its weights' memory back first, its KV cache after (the caller's turn)."""
        with self._phase("weight_sync"):
            if released:
                self.rollout_engine.resume_memory(weights_only=True)
            self._sync_rollout_weights()
        self.updates_pushed += 1

    # ------------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int | None = None) -> None:
        """Model, optimizer, LR scheduler and RNG of every rank into ``local_path``."""
        with self._actor_resident():
            self.checkpoint_manager.save(local_path, global_step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> None:
        """Restore :meth:`save_checkpoint`'s state and refresh the rollout engine's weights."""
        with self._actor_resident():
            self.checkpoint_manager.load(local_path)
            # the optimizer's load_state_dict puts its state beside the parameters: back where it lives
            self._optimizer_off_device()
            self._sync_rollout_weights()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        """A ``from_pretrained`` folder of the actor (rank 0 writes; LoRA adapters merged)."""
        with self._actor_resident():
            if not lora.is_lora_model(self.actor_module):
                self.checkpoint_manager.export_hf(path)
                return
            state = fsdp_utils.get_full_state_dict(self.actor_module)
        if self.rank == 0:
            lora.export_merged(state, self.actor_module.config, path,
                               lora.lora_scaling(self.actor_module), tokenizer=self.tokenizer)


class CriticWorker(_FSDPModelWorker):
    """The value model (LM body + scalar head) with its optimizer.

    Args:
        config: the ``critic`` section (a ``CriticConfig`` or a complete mapping of it: standalone,
            its keys that default to the actor's must be given).
        run: the run's derived values (:class:`WorkerRun`; ``rollout_n`` multiplies ``ppo_mini_batch_size``).
    """

    def __init__(self, config: Any, run: WorkerRun | None = None):
        self.config = to_typed(CriticConfig, config, "critic")
        super().__init__(run)
        self.init_process_group()
        self.update_batching, self.forward_batching = batching.critic_batching(self.config, self.run.rollout_n,
                                                                               self.world_size)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the value model from the (causal-LM) checkpoint, shard it, build the optimizer."""
        model_cfg = self.config.model
        self.tokenizer = _load_tokenizer(model_cfg.tokenizer_path or model_cfg.path, model_cfg.trust_remote_code)
        model = fsdp_utils.load_value_model(model_cfg, torch_dtype=torch.float32, head_init=model_cfg.value_head_init)
        if torch.cuda.is_available() and self.config.use_torch_compile:  # as the actor's layers (CPU: eager)
            fsdp_utils.compile_decoder_layers(model)
        self.critic_module, self.critic_optimizer, self.lr_scheduler = self._build_trainable(
            model, model_cfg.fsdp_config, self.config.optim)
        layout = ForwardLayout(use_remove_padding=model_cfg.use_remove_padding,
                               max_packed_row_len=model_cfg.max_packed_row_len or 0)
        self.critic = DataParallelPPOCritic(self.config, self.critic_module, self.critic_optimizer, layout=layout,
                                            update=self.update_batching, forward=self.forward_batching)
        self.checkpoint_manager = FSDPCheckpointManager(self.critic_module, self.critic_optimizer,
                                                        self.lr_scheduler, self.tokenizer)
        self._optimizer_off_device()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` ``(B, R)``: the critic's estimate before each response token."""
        with self._phase("values"), self._resident(self.critic_module, self.config.model.fsdp_config):
            values = self.critic.compute_values(_on_device(data))
        return DataProto.from_dict(tensors={"values": values.cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        """Clipped value-loss epochs; ``meta_info["metrics"]`` as for the actor (``critic/*``)."""
        fsdp_cfg = self.config.model.fsdp_config
        with self._phase("update_critic"), self._resident(self.critic_module, fsdp_cfg):
            self._optimizer_on_device()
            metrics = self.critic.update_critic(_on_device(data))
            self._step_scheduler(metrics, "critic/lr")
            self._optimizer_off_device()
        metrics.update(self._phase_metrics())
        return _metrics_proto(reduce_metrics_over_ranks(metrics))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int | None = None) -> None:
        """Model, optimizer, LR scheduler and RNG of every rank into ``local_path``."""
        with self._resident(self.critic_module, self.config.model.fsdp_config):
            self.checkpoint_manager.save(local_path, global_step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> None:
        """Restore :meth:`save_checkpoint`'s state."""
        fsdp_cfg = self.config.model.fsdp_config
        with self._resident(self.critic_module, fsdp_cfg):
            self.checkpoint_manager.load(local_path)
            # the optimizer's load_state_dict puts its state beside the parameters: back where it lives
            self._optimizer_off_device()
