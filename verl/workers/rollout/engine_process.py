"""A rollout engine served from a child process: the trainer's process only sends token ids and
receives sampled tokens (``rollout.frontend_process``).

Why: vLLM's front end (request setup, the output loop that runs once per decode step for every
request: incremental detokenisation for the stop strings, log-probs) is Python that holds the
interpreter lock while it runs. In the actor's worker process it competes with the trainer's own
Python; with ``rollout.staleness=1`` a step's log-prob and update passes, which launch their GPU
kernels from Python, then run at the pace the front end leaves them (docs/benchmarks.md,
"Bounded staleness on the H200"). Here the engine lives in a spawned child (with
``engine_process`` its core in a grandchild, as vLLM starts it) and this process keeps only a pipe.

Weights: the trainer packs its tensors into one CUDA buffer and sends the child the buffer's IPC
handle (:func:`verl.workers.rollout.vllm_worker.pack_for_ipc`), which the engine's worker opens, so
no weight crosses the pipe on a GPU; on a CPU the tensors are sent through it.
"""

from __future__ import annotations

import atexit
import multiprocessing
import threading
import traceback
from typing import Any, Iterable

import torch

from verl.workers.rollout.base import RolloutEngine, RolloutOutput, SamplingParams

START_TIMEOUT_S = 900.0  # a vLLM engine with CUDA graphs and compilation starts in minutes


class EngineProcessError(RuntimeError):
    """The engine process failed a call (its traceback in the message) or is gone."""


def _serve(conn, engine_kwargs: dict) -> None:
    """The child's loop: build the engine, then answer ``(method, args)`` requests until ``close`` or
    until the pipe ends (the parent is gone: a killed worker leaves no engine holding the GPU)."""
    from verl.workers.rollout.vllm_rollout import VLLMRolloutEngine

    try:
        engine = VLLMRolloutEngine(**engine_kwargs)
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", engine.weight_dtype))
    handlers = {"generate": engine.generate, "load_ipc": engine.load_ipc_message,
                "update_weights": engine.update_weights, "release_memory": engine.release_memory,
                "resume_memory": engine.resume_memory}
    while True:
        try:
            method, args = conn.recv()
        except EOFError:  # the parent is gone
            break
        if method == "close":
            break
        try:
            reply = ("ok", handlers[method](*args))
        except BaseException:  # noqa: BLE001 - the parent raises it; the engine keeps serving
            reply = ("error", traceback.format_exc())
        try:
            conn.send(reply)
        except OSError:  # the parent went away during the call
            break
    engine.shutdown()
    conn.close()


class EngineProcess(RolloutEngine):
    """:class:`~verl.workers.rollout.vllm_rollout.VLLMRolloutEngine` in a spawned child process.

    Args:
        engine_kwargs: the ``VLLMRolloutEngine`` constructor's arguments (picklable).

    Raises:
        EngineProcessError: the engine did not start (the child's traceback in the message), or a
            later call failed or found the child gone.
    """

    def __init__(self, **engine_kwargs: Any) -> None:
        context = multiprocessing.get_context("spawn")  # a fork of a process holding CUDA cannot use it
        self._conn, child_conn = context.Pipe()
        self._lock = threading.Lock()  # one request on the pipe at a time, whichever thread sends it
        self._process = context.Process(target=_serve, args=(child_conn, engine_kwargs), daemon=False,
                                        name="rollout-engine")
        self._process.start()
        child_conn.close()
        # before multiprocessing's own exit hook, which would wait for the child forever
        atexit.register(self.shutdown)
        if not self._conn.poll(START_TIMEOUT_S):
            self._process.kill()
            raise EngineProcessError(f"the rollout engine process did not start within {START_TIMEOUT_S:.0f} s")
        self.weight_dtype = self._answer("start")

    def _answer(self, method: str) -> Any:
        try:
            status, value = self._conn.recv()
        except EOFError:
            self._process.join(timeout=5)
            raise EngineProcessError(f"the rollout engine process exited (code {self._process.exitcode}) "
                                     f"during {method}") from None
        if status == "error":
            raise EngineProcessError(f"rollout engine process, {method}: {value.strip().splitlines()[-1]}\n{value}")
        return value

    def _call(self, method: str, *args: Any) -> Any:
        if not self._process.is_alive():
            raise EngineProcessError(f"the rollout engine process is gone (code {self._process.exitcode}); "
                                     f"cannot {method}")
        with self._lock:
            self._conn.send((method, args))
            return self._answer(method)

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[RolloutOutput]:
        """See ``RolloutEngine.generate`` (the engine process's outputs, in order)."""
        return self._call("generate", prompt_token_ids, params)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """GPU tensors: one packed buffer's CUDA IPC handle, the buffer freed once the engine has
        loaded it; CPU tensors: sent through the pipe."""
        tensors = {name: t.detach().contiguous() for name, t in named_tensors}
        if not any(t.device.type == "cuda" for t in tensors.values()):
            self._call("update_weights", list(tensors.items()))
            return
        from verl.workers.rollout.vllm_worker import pack_for_ipc

        buffer, message = pack_for_ipc(tensors)
        self._call("load_ipc", message)  # returns once the engine's worker has copied the weights
        del buffer
        torch.cuda.ipc_collect()

    def release_memory(self) -> None:
        """The engine's ``release_memory`` (sleep on GPU)."""
        self._call("release_memory")

    def resume_memory(self, weights_only: bool = False) -> None:
        """The engine's ``resume_memory``, after this process hands its cached free blocks back to
        the GPU (the engine's allocator cannot see them)."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self._call("resume_memory", weights_only)

    def shutdown(self, timeout_s: float = 60.0) -> None:
        """Stop the engine and its process (killed if it does not end within ``timeout_s``)."""
        if self._conn.closed:
            return
        # a call in flight (another thread, at exit) holds the lock: then the child is killed instead
        if self._process.is_alive() and self._lock.acquire(timeout=timeout_s):
            try:
                self._conn.send(("close", ()))
            finally:
                self._lock.release()
            self._process.join(timeout_s)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()
