"""The multi-turn rollout of a batch (Search-R1's ``LLMGenerationManager``), token in, token out.

Two modes apply the same per-turn rules (:mod:`~verl.workers.rollout.agent_loop.rules`):

* ``sync`` (Search-R1's, the reference): each turn sends the active rows' contexts (prompt +
  response so far, as token ids) to the engine with the environment's stop strings, applies each
  row's output, runs the turn's tool calls in one environment call and appends the observations;
  the next turn waits for the slowest row.
* ``async``: every row is its own task that generates, calls its tool and continues on its own
  (:mod:`~verl.workers.rollout.agent_loop.async_loop`), so a row waiting for its tool does not hold
  up the others.

Either mode runs beside the engine: when the engine lives in other processes (the trainer's
worker group), the whole loop goes there with the rows (:mod:`~verl.workers.rollout.agent_loop.remote`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from verl.envs.base import Action, Environment
from verl.protocol import DataProto
from verl.utils.aio import run_coroutine
from verl.workers.rollout.agent_loop.packing import to_dataproto
from verl.workers.rollout.agent_loop.rules import LoopConfig, TurnRules
from verl.workers.rollout.agent_loop.trajectory import Trajectory
from verl.workers.rollout.base import RolloutOutput, SamplingParams


@dataclass(frozen=True)
class TurnProgress:
    """Where a sync rollout stands after one of its turns (what ``run``'s ``on_turn`` gets).

    Attributes:
        turn: turns done (1 after the first).
        max_turns: turns a row can take at most (``max_turns`` tool rounds + the final one).
        rows: rows of the batch.
        active: rows still generating (the others answered or ended).
    """

    turn: int
    max_turns: int
    rows: int
    active: int


class MultiTurnRollout:
    """Runs an environment's multi-turn loop over a batch with any engine.

    Args:
        tokenizer: the policy's tokenizer.
        engine: a ``RolloutEngine`` (``generate(prompt_ids, params)``; in ``async`` mode one with
            ``agenerate``), or one that lives in other processes and runs the loop there
            (``run_agent_loop``: the trainer's worker group), in either mode.
        env: the :class:`~verl.envs.base.Environment` (bound to ``tokenizer``).
        config: the :class:`~verl.workers.rollout.agent_loop.rules.LoopConfig`.
    """

    def __init__(self, tokenizer, engine, env: Environment, config: LoopConfig) -> None:
        self.tokenizer, self.engine, self.env, self.config = tokenizer, engine, env, config
        self.rules = TurnRules(tokenizer, env, config)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.timing: dict[str, float] = {}
        self._rows_seeded = 0  # async mode: rows given seeds so far (each row gets seeds of its own)

    def run(self, batch: DataProto, params: SamplingParams,
            on_turn: Callable[[TurnProgress], None] | None = None) -> DataProto:
        """Roll out every row of ``batch``; see :mod:`~verl.workers.rollout.agent_loop.rules`.

        Args:
            batch: left-padded ``input_ids``/``attention_mask`` ``(B, P)``, or a ``raw_prompt_ids``
                non-tensor column (preferred when present).
            params: sampling parameters; ``n`` must be 1 (repeat the batch for several samples) and
                ``stop`` is replaced by the environment's stop strings and ``logprobs`` by the
                config's ``log_probs``.
            on_turn: called after every turn of the sync mode with a :class:`TurnProgress` (progress
                of a long rollout; the async mode has no common turns and does not call it); with
                the loop in the workers, with every worker's latest summed.
        Returns:
            DataProto with ``prompts (B, P)``, ``responses``/``response_mask``/``rollout_log_probs``
            ``(B, R=max_response_length)`` (``rollout_log_probs`` with ``log_probs`` only),
            ``input_ids``/``attention_mask``/``position_ids`` ``(B, P + R)``, int64 ``(B,)`` stats
            ``turns, finished, truncated`` and the environment's counters, the non-tensor ``action_prefix`` (the action the prompt opened, or "");
            ``meta_info["timing"]`` has seconds (``generation_s``, ``tool_s``, ``bookkeeping_s``,
            ``total_s``; sync: the engine calls and the decode steps they waited for; async: the
            busy fractions and mean in-flight counts).
        Raises:
            ValueError: ``n != 1``, or a prompt that is empty or longer than ``max_start_length``.
        """
        if hasattr(self.engine, "run_agent_loop"):
            output = self.engine.run_agent_loop(*self._remote_request(batch, params), on_turn=on_turn)
            self.timing = dict(output.meta_info.get("timing", {}))
            return output
        params = self._turn_params(params)
        prompts = self._prompts(batch)
        width = max([self._prompt_width(batch)] + [len(p) for p in prompts])
        start = time.perf_counter()
        rows = [Trajectory(prompt, open_tag=self.env.open_tag(prompt),
                           log_probs=[] if self.config.log_probs else None) for prompt in prompts]
        if self.config.mode == "async":
            timing = self._run_async(rows, params, self._row_seeds(batch, params, len(rows)))
        else:
            timing = self._run_sync(rows, params, on_turn)
        output = to_dataproto(rows, width, self.config.max_response_length, self.pad_id, self.env.counters)
        total = time.perf_counter() - start
        busy = timing.get("rollout_s", timing["generation_s"] + timing["tool_s"])
        timing.update(total_s=total, bookkeeping_s=max(0.0, total - busy))
        self.timing = timing
        output.meta_info["timing"] = dict(timing)
        return output

    # ---- sync mode ----------------------------------------------------------------------------
    def _run_sync(self, rows: list[Trajectory], params: SamplingParams,
                  on_turn: Callable[[TurnProgress], None] | None = None) -> dict[str, float]:
        """Search-R1's turn loop over all active rows at once.

        Each turn sends its rows newest first: in the reverse of the order the last turn sent them,
        then the rows that turn did not send, as they were. The engine admits requests
        first come, first served, so a turn's rows finish roughly in the order they were sent, and its
        prefix cache evicts the least recently freed blocks first: sent in the same order again, every
        admitted row would evict the cached prefix of the row sent next. Newest first, the rows whose
        prefixes are still cached run before the engine's new blocks reach them.
        """
        self.timing = {"generation_s": 0.0, "tool_s": 0.0, "engine_calls": 0, "decode_steps": 0}
        order = rows
        for turn in range(self.config.max_turns + 1):
            active = [row for row in order if row.active]
            if not active:
                break
            ended = [row for row in order if not row.active]
            outputs = self._generate(active, params)
            self._step(active, outputs, final=turn == self.config.max_turns)
            order = active[::-1] + ended
            if on_turn is not None:
                on_turn(TurnProgress(turn + 1, self.config.max_turns + 1, len(rows),
                                     sum(row.active for row in rows)))
        answered = [row for row in order if self.rules.wants_eos(row)]
        if answered:
            for row, out in zip(answered, self._generate(answered, self.rules.eos_params(params))):
                self.rules.accept_eos(row, out)
        return self.timing

    def _generate(self, rows: list[Trajectory], params: SamplingParams) -> list[RolloutOutput]:
        budget = [self.rules.turn_budget(row) for row in rows]
        turn_params = replace(params, max_tokens=min(params.max_tokens, max(budget)))
        tic = time.perf_counter()
        outputs = self.engine.generate([row.context for row in rows], turn_params)
        self.timing["generation_s"] += time.perf_counter() - tic
        if len(outputs) != len(rows):
            raise RuntimeError(f"engine returned {len(outputs)} outputs for {len(rows)} prompts")
        # a call decodes until its longest row stops: the engine steps this turn waited for
        self.timing["engine_calls"] += 1
        self.timing["decode_steps"] += max((len(out.token_ids) for out in outputs), default=0)
        # One max_tokens for the batch: cut rows whose own response budget is smaller.
        return [out if len(out.token_ids) <= room else
                RolloutOutput(out.token_ids[:room], out.log_probs[:room], "length")
                for out, room in zip(outputs, budget)]

    def _step(self, rows: list[Trajectory], outputs: list[RolloutOutput], final: bool) -> None:
        calls: list[tuple[Trajectory, Action]] = []
        for row, out in zip(rows, outputs):
            action = self.rules.apply_generation(row, out, final)
            if action is not None and action.kind == "call" and row.active:
                calls.append((row, action))
        if not calls:
            return
        tic = time.perf_counter()
        observations = self.env.call_tools([action for _, action in calls])
        self.timing["tool_s"] += time.perf_counter() - tic
        if len(observations) != len(calls):
            raise RuntimeError(f"environment answered {len(observations)} of {len(calls)} tool calls")
        for (row, _), observation in zip(calls, observations):
            self.rules.observe(row, observation)

    # ---- async mode ---------------------------------------------------------------------------
    def _run_async(self, rows: list[Trajectory], params: SamplingParams, seeds: list[int] | None) -> dict[str, float]:
        """One task per row on this process's engine."""
        from verl.workers.rollout.agent_loop.async_loop import AsyncRollout
        from verl.workers.rollout.async_engine import async_engine

        rollout = AsyncRollout(self.rules, async_engine(self.engine), self.env.max_concurrent_calls)
        return run_coroutine(rollout.run(rows, params, seeds), "async-rollout")

    # ---- the engine in other processes: the loop runs there, beside it (either mode) -----------
    def start(self, batch: DataProto, params: SamplingParams):
        """:meth:`run` without waiting, on an engine in other processes (``start_agent_loop``: the
        trainer's worker group): returns the pending call, whose ``get()`` gives ``run``'s output
        (with ``meta_info["timing"]``, and ``["updates_pushed"]`` from the workers).

        Raises:
            TypeError: the engine runs in this process (use :meth:`run`).
        """
        if not hasattr(self.engine, "start_agent_loop"):
            raise TypeError(f"{type(self.engine).__name__} runs in this process: call run(), not start()")
        return self.engine.start_agent_loop(*self._remote_request(batch, params))

    def _remote_request(self, batch: DataProto, params: SamplingParams):
        """The rows and the :class:`~verl.workers.rollout.agent_loop.remote.AgentLoop` sent to the
        workers. Sync requests keep the engine's own per-request seeds; async rows get theirs here."""
        from verl.workers.rollout.agent_loop.remote import AgentLoop

        params = self._turn_params(params)
        prompts = self._prompts(batch)
        width = max([self._prompt_width(batch)] + [len(p) for p in prompts])
        non_tensors = {"raw_prompt_ids": [list(p) for p in prompts]}
        seeds = self._row_seeds(batch, params, len(prompts)) if self.config.mode == "async" else None
        if seeds is not None:
            non_tensors["rollout_seed"] = seeds
        rows = DataProto.from_dict(non_tensors=non_tensors, meta_info={"prompt_width": width})
        return rows, AgentLoop(self.config, self.env, params)

    # ---- inputs -------------------------------------------------------------------------------
    def _turn_params(self, params: SamplingParams) -> SamplingParams:
        if params.n != 1:
            raise ValueError(f"the rollout samples once per row; got n={params.n}. Repeat the batch instead.")
        return replace(params, stop=list(self.env.stop_strings), logprobs=self.config.log_probs)

    def _prompts(self, batch: DataProto) -> list[list[int]]:
        if "raw_prompt_ids" in batch.non_tensor_batch:
            prompts = [list(map(int, ids)) for ids in batch.non_tensor_batch["raw_prompt_ids"]]
        else:
            ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"].bool()
            prompts = [ids[i][mask[i]].tolist() for i in range(ids.shape[0])]
        for i, prompt in enumerate(prompts):
            if not prompt or len(prompt) > self.config.max_start_length:
                raise ValueError(f"row {i}: prompt has {len(prompt)} tokens; need 1..max_start_length="
                                 f"{self.config.max_start_length}")
        return prompts

    @staticmethod
    def _prompt_width(batch: DataProto) -> int:
        """Width P of the output prompts: the batch's own (or the width the controller sent)."""
        if batch.batch is not None and "input_ids" in batch.batch.keys():
            return int(batch.batch["input_ids"].shape[1])
        return int(batch.meta_info.get("prompt_width", 0))

    def _row_seeds(self, batch: DataProto, params: SamplingParams, num_rows: int) -> list[int] | None:
        """Async mode: the first request seed of each row (``seeds_per_row`` consecutive seeds each),
        from the batch's ``rollout_seed`` column when the controller assigned them."""
        if "rollout_seed" in batch.non_tensor_batch:
            return [int(s) for s in batch.non_tensor_batch["rollout_seed"]]
        if params.seed is None:
            return None
        stride = self.config.seeds_per_row
        seeds = [params.seed + (self._rows_seeded + i) * stride for i in range(num_rows)]
        self._rows_seeded += num_rows
        return seeds
