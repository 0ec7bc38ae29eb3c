"""The rollout worker group seen as a ``RolloutEngine``.

The engine lives inside the actor-rollout workers (colocated with the FSDP actor, sharing its
weights; or, with split pools, in workers of its own), and so does the multi-turn loop that drives it: ``run_agent_loop`` sends the rows with
the loop to run (:class:`~verl.workers.rollout.agent_loop.remote.AgentLoop`, either rollout mode)
and each worker runs it on its share of the rows beside its own engine (``generate_trajectories``),
reporting each turn's progress back when the caller asks for it. ``generate`` (one
``generate_sequences`` call: single-turn generation) serves callers without a loop. Weight sync
after an actor update happens between the workers (inside them when colocated; the trainer's
``WorkerHandles.sync_weights`` with split pools), so ``update_weights`` is a no-op here.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np
import torch

from verl.single_controller.local import LocalWorkerGroup
from verl.workers.rollout.base import RolloutEngine, RolloutOutput, SamplingParams


def _object_array(items: list) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


class WorkerGroupEngine(RolloutEngine):
    """Adapter over ``actor_rollout_wg.generate_sequences``.

    Args:
        worker_group: a worker group whose ``generate_sequences(DataProto)`` reads per-row
            ``raw_prompt_ids`` and ``meta_info["sampling_params"]`` and returns per-row
            ``output_token_ids``, ``output_log_probs``, ``finish_reason`` (and ``stop_str``).
        world_size: number of workers the rows are split over (the async loop's search cap is
            split over them).
    """

    def __init__(self, worker_group, world_size: int = 1):
        self.worker_group = worker_group
        self.world_size = max(1, int(world_size))
        self._queue = None  # the Ray progress queue, made at the first call that reports turns

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[RolloutOutput]:
        """One output per prompt and sample, prompts in order, samples of a prompt adjacent."""
        from verl.protocol import DataProto

        if not prompt_token_ids:
            return []
        # Samples are expanded here so every worker row yields exactly one output.
        rows = [list(ids) for ids in prompt_token_ids for _ in range(params.n)]
        single = dataclasses.replace(params, n=1)
        data = DataProto.from_dict(non_tensors={"raw_prompt_ids": _object_array(rows)},
                                   meta_info={"sampling_params": dataclasses.asdict(single)})
        return _to_outputs(self.worker_group.generate_sequences(data))  # the dispatcher pads to the ranks

    def run_agent_loop(self, rows, agent_loop, on_turn=None):
        """Run ``agent_loop(engine, tokenizer, rows_of_this_worker)`` on every worker; rows in order.

        Args:
            rows: a DataProto with ``raw_prompt_ids`` (and the columns the loop reads).
            agent_loop: an :class:`~verl.workers.rollout.agent_loop.remote.AgentLoop` (picklable);
                its search cap is split over the workers (``AgentLoop.for_workers``).
            on_turn: called with the batch's ``TurnProgress`` after every worker's sync turn
                (every worker's latest summed), or None.
        Returns:
            The workers' DataProtos concatenated in row order (the padding rows removed).
        """
        from verl.workers.rollout.agent_loop import remote

        if on_turn is None:
            return self.start_agent_loop(rows, agent_loop).get()
        aggregator = remote.TurnAggregator(on_turn)
        if isinstance(self.worker_group, LocalWorkerGroup):  # the workers run in this thread
            local = dataclasses.replace(agent_loop, progress=remote.DirectSink(aggregator))
            return self.start_agent_loop(rows, local).get()
        queue = self._progress_queue()
        reporting = dataclasses.replace(agent_loop, progress=queue)
        return remote.drain_while(lambda: self.start_agent_loop(rows, reporting).get(), queue, aggregator)

    def start_agent_loop(self, rows, agent_loop):
        """``run_agent_loop`` without waiting: returns the pending call, whose
        ``get()`` gives the trajectories. On the Ray backend the workers run it while the controller
        goes on (``rollout.staleness=1``: beside the update); the local backend runs it here first."""
        rows.meta_info["agent_loop"] = agent_loop.for_workers(self.world_size)
        return self.worker_group.generate_trajectories(rows)  # the dispatcher pads to the ranks

    def _progress_queue(self):
        """A Ray queue for the workers' turn progress, made once (an actor reserving no CPU)."""
        if self._queue is None:
            from ray.util.queue import Queue

            self._queue = Queue(actor_options={"num_cpus": 0})
        return self._queue

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """No-op: the workers push weights into their engine after each actor update."""


def _to_outputs(output) -> list[RolloutOutput]:
    fields = output.non_tensor_batch
    stop_strs = fields.get("stop_str", [None] * len(fields["output_token_ids"]))
    return [
        RolloutOutput(token_ids=[int(t) for t in ids], log_probs=[float(x) for x in log_probs],
                      finish_reason=str(reason), stop_str=stop)
        for ids, log_probs, reason, stop in zip(fields["output_token_ids"], fields["output_log_probs"],
                                                fields["finish_reason"], stop_strs)
    ]


def sampling_params(rollout_cfg, max_tokens: int, validate: bool = False) -> SamplingParams:
    """Per-turn sampling parameters from ``actor_rollout_ref.rollout`` (a ``RolloutConfig``).

    Training samples with ``temperature/top_p/top_k``. Validation uses ``rollout.val_kwargs``; with
    ``do_sample: false`` it is truly greedy (temperature 0), which Search-R1 meant but did not do.
    ``rollout.do_sample: false`` makes training greedy as well.

    With ``rollout.seed_per_request`` (default true) training requests carry ``rollout.seed``, which
    vLLM turns into one seed per request (samples do not depend on how requests are batched) and the
    hf engine into the seed of each generate call. ``false`` leaves sampling to the engine's own RNG
    (seeded once with ``rollout.seed``), which spares vLLM a generator call per sequence and decode
    step but makes samples depend on the run's history.
    """
    source = rollout_cfg.val_kwargs if validate else rollout_cfg
    greedy = not source.do_sample
    seeded = rollout_cfg.seed_per_request and not validate
    return SamplingParams(
        temperature=0.0 if greedy else float(source.temperature),
        top_p=1.0 if greedy else float(source.top_p),
        top_k=-1 if greedy else int(source.top_k),
        max_tokens=int(max_tokens), n=1,  # the agent loop adds the environment's stop strings
        seed=rollout_cfg.seed if seeded else None,
        logprobs=True)
