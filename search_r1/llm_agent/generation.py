"""The multi-turn search loop (Search-R1's ``LLMGenerationManager``), token in, token out.

Two modes run the same per-turn rules (``GenerationConfig.mode``):

* ``sync`` (Search-R1's, the reference): each turn sends the active rows' contexts (prompt +
  response so far, as token ids) to the engine with stop strings ``</search>`` and ``</answer>``,
  parses the first complete action of each row's new text, runs one batched retriever call for all
  searching rows and appends the tokenised observation; the next turn waits for the slowest row.
* ``async``: every row is its own task that generates, searches and continues on its own
  (``async_rollout.py``), so a row that stopped at ``</search>`` searches while others decode.

The trajectory is the exact concatenation of engine token ids and observation token ids: generated
text is decoded only to parse actions, never re-encoded. A turn ends exactly at its stop string
(``stop_rule.py``: a sampled token that carries text past it is replaced by the rest of the stop
string as environment tokens).

Row lifecycle: an ``<answer>`` ends the row (``finished``); an EOS ends it; a ``length`` finish or a
context/response budget overflow ends it (``truncated``); an invalid action gets Search-R1's
corrective message and the row continues. After ``max_turns`` search rounds one last generation is
made without search (a search there ends the row unanswered). A prompt that itself opens
``<search>``/``<answer>`` (a forced assistant prefix) has its first turn parsed as the
continuation of that tag; the tag is returned per row (``action_prefix``) so the reward scores the
same action the loop parsed.

Answered rows stop on ``</answer>``, before the model's own EOS. With ``close_with_eos`` one extra
1-token generation per answered row (one engine call for all) samples the next token; when it is
the EOS it is appended (mask 1, real log-prob), so the final EOS is trained on.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

import torch

from search_r1.llm_agent.observation import ObservationEncoder
from search_r1.llm_agent.parsing import STOP_STRINGS, Action, parse_action
from search_r1.llm_agent.stop_rule import split_at_stop
from search_r1.llm_agent.tensor_helper import length_mask, pad_rows, position_ids_from_mask
from search_r1.llm_agent.trajectory import Trajectory
from verl.protocol import DataProto
from verl.utils.aio import in_event_loop, run_coroutine
from verl.workers.rollout.base import RolloutOutput, SamplingParams
from verl.workers.rollout.config import ROLLOUT_MODES as MODES


@dataclass
class GenerationConfig:
    """Budgets of the multi-turn loop (Search-R1 names).

    Attributes:
        max_turns: search rounds before the final, search-free generation.
        max_start_length: longest accepted prompt (tokens).
        max_prompt_length: longest context sent to the engine (prompt + response so far); the
            engine's ``max_model_len`` must be at least this plus the per-turn ``max_tokens``.
        max_response_length: response budget (generated + observation tokens) = width R of the output.
        max_obs_length: token budget of one search observation (cut inside the passages).
        do_search: False gives the "R1 without search" baseline (searches get an empty
            ``<information></information>`` block, as in Search-R1).
        close_with_eos: sample one token after ``</answer>`` and keep it if it is the EOS.
        mode: ``"sync"`` (turn by turn over the batch) or ``"async"`` (a task per row).
    Raises:
        ValueError: an unknown ``mode``.
    """

    max_turns: int = 4
    max_start_length: int = 2048
    max_prompt_length: int = 4096
    max_response_length: int = 1024
    max_obs_length: int = 512
    do_search: bool = True
    close_with_eos: bool = True
    mode: str = "sync"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"rollout mode must be one of {MODES}, got {self.mode!r}")

    @property
    def seeds_per_row(self) -> int:
        """Requests one row can make: ``max_turns + 1`` turns and the EOS-closing one."""
        return self.max_turns + 2


class LLMGenerationManager:
    """Runs the search loop over a batch with any engine exposing ``generate(prompt_ids, params)``.

    Args:
        tokenizer: the policy's tokenizer (decodes new text for parsing, encodes observations).
        engine: a ``RolloutEngine``; in ``async`` mode also an engine with ``agenerate`` or one
            whose rows live in other processes (``run_agent_loop``, the trainer's worker group).
        config: ``GenerationConfig``.
        retriever: an object with ``async aretrieve(queries)`` or ``retrieve(queries)`` returning
            one list of ``{"document": {"contents"}}`` per query (``search_r1.search.client``).
    Raises:
        ValueError: ``do_search`` without a retriever.
    """

    def __init__(self, tokenizer, engine, config: GenerationConfig, retriever=None) -> None:
        if config.do_search and retriever is None:
            raise ValueError("do_search=True needs a retriever (search_r1.search.client.RetrieverClient)")
        self.tokenizer, self.engine, self.config, self.retriever = tokenizer, engine, config, retriever
        self.observations = ObservationEncoder(tokenizer, config.max_obs_length)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.timing: dict[str, float] = {}
        self._rows_seeded = 0  # async mode: rows given seeds so far (each row gets seeds of its own)

    # ---- the loop ---------------------------------------------------------------------------
    def run_llm_loop(self, batch: DataProto, params: SamplingParams) -> DataProto:
        """Roll out every row of ``batch``; see the module docstring for the rules.

        Args:
            batch: left-padded ``input_ids``/``attention_mask`` ``(B, P)``, or a ``raw_prompt_ids``
                non-tensor column (preferred when present).
            params: sampling parameters; ``n`` must be 1 (repeat the batch for several samples) and
                ``stop`` is replaced by ``</search>``, ``</answer>``.
        Returns:
            DataProto with ``prompts (B, P)``, ``responses``/``response_mask``/``rollout_log_probs``
            ``(B, R=max_response_length)``, ``input_ids``/``attention_mask``/``position_ids``
            ``(B, P + R)``, int64 ``(B,)`` stats ``turns, valid_search, empty_search, valid_action, finished,
            truncated, obs_truncated`` and the non-tensor ``action_prefix`` (the tag the prompt
            opened, or ""); ``meta_info["timing"]`` has seconds (sync: generation / retrieval /
            bookkeeping, and the engine calls and the decode steps they waited for; async: also the
            busy fractions and mean in-flight counts).
        """
        if params.n != 1:
            raise ValueError(f"run_llm_loop samples once per row; got n={params.n}. Repeat the batch instead.")
        params = replace(params, stop=list(STOP_STRINGS), logprobs=True)
        prompts = self._prompts(batch)
        width = max([self._prompt_width(batch)] + [len(p) for p in prompts])
        if self.config.mode == "async" and hasattr(self.engine, "run_agent_loop"):
            return self._run_remote(batch, prompts, width, params)
        start = time.perf_counter()
        rows = [Trajectory(prompt, open_tag=self._open_tag(prompt)) for prompt in prompts]
        if self.config.mode == "async":
            timing = self._run_async(rows, params, self._row_seeds(batch, params, len(rows)))
        else:
            timing = self._run_sync(rows, params)
        output = self._to_dataproto(rows, width)
        total = time.perf_counter() - start
        busy = timing.get("rollout_s", timing["generation_s"] + timing["retrieval_s"])
        timing.update(total_s=total, bookkeeping_s=max(0.0, total - busy))
        self.timing = timing
        output.meta_info["timing"] = dict(timing)
        return output

    def _run_sync(self, rows: list[Trajectory], params: SamplingParams) -> dict[str, float]:
        """Search-R1's turn loop over all active rows at once."""
        self.timing = {"generation_s": 0.0, "retrieval_s": 0.0, "engine_calls": 0, "decode_steps": 0}
        for turn in range(self.config.max_turns + 1):
            active = [row for row in rows if row.active]
            if not active:
                break
            outputs = self._generate(active, params)
            self._step(active, outputs, final=turn == self.config.max_turns)
        if self.config.close_with_eos:
            self._close_answers(rows, params)
        return self.timing

    def _run_async(self, rows: list[Trajectory], params: SamplingParams, seeds: list[int] | None) -> dict[str, float]:
        """One task per row on this process's engine (``async_rollout.AsyncRollout``)."""
        from search_r1.llm_agent.async_rollout import AsyncRollout
        from verl.workers.rollout.async_engine import async_engine

        rollout = AsyncRollout(self, async_engine(self.engine), self.retriever)
        return run_coroutine(rollout.run(rows, params, seeds), "async-rollout")

    def _run_remote(self, batch: DataProto, prompts: list[list[int]], width: int,
                    params: SamplingParams) -> DataProto:
        """Async mode with the engine in other processes: the row tasks run there, beside it."""
        from search_r1.llm_agent.async_rollout import AgentLoop

        non_tensors = {"raw_prompt_ids": [list(p) for p in prompts]}
        seeds = self._row_seeds(batch, params, len(prompts))
        if seeds is not None:
            non_tensors["rollout_seed"] = seeds
        remote = DataProto.from_dict(non_tensors=non_tensors, meta_info={"prompt_width": width})
        output = self.engine.run_agent_loop(remote, AgentLoop(self.config, self.retriever, params))
        self.timing = dict(output.meta_info.get("timing", {}))
        return output

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
        """Async mode: the first request seed of each row (``seed_per_row`` consecutive seeds each),
        from the batch's ``rollout_seed`` column when the controller assigned them."""
        if "rollout_seed" in batch.non_tensor_batch:
            return [int(s) for s in batch.non_tensor_batch["rollout_seed"]]
        if params.seed is None:
            return None
        stride = self.config.seeds_per_row
        seeds = [params.seed + (self._rows_seeded + i) * stride for i in range(num_rows)]
        self._rows_seeded += num_rows
        return seeds

    def _open_tag(self, prompt: list[int]) -> str:
        """``<search>``/``<answer>`` when the prompt itself opens the action (a forced assistant
        prefix); the first turn's new text is parsed as its continuation."""
        tail = self.tokenizer.decode(prompt[-4:], skip_special_tokens=False)
        return next((tag for tag in ("<search>", "<answer>") if tail.endswith(tag)), "")

    # ---- sync mode ----------------------------------------------------------------------------
    def _generate(self, rows: list[Trajectory], params: SamplingParams) -> list[RolloutOutput]:
        budget = [self.turn_budget(row) for row in rows]
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
        searches: list[tuple[Trajectory, str]] = []
        for row, out in zip(rows, outputs):
            action = self.apply_generation(row, out, final)
            if action is not None and action.kind == "search" and row.active:
                searches.append((row, action.content))
        if not searches:
            return
        if self.config.do_search:
            results = self._retrieve([query for _, query in searches])
        else:
            results = [[] for _ in searches]
        for (row, _), docs in zip(searches, results):
            self.observe_search(row, docs)

    def _retrieve(self, queries: list[str]) -> list[list[dict]]:
        """One retriever call for the turn's searches; a query several rows ask (a GRPO group's
        samples often search the same words) is sent once."""
        tic = time.perf_counter()
        unique = list(dict.fromkeys(queries))
        if hasattr(self.retriever, "aretrieve") and not in_event_loop():
            results = asyncio.run(self.retriever.aretrieve(unique))
        else:
            results = self.retriever.retrieve(unique)
        self.timing["retrieval_s"] += time.perf_counter() - tic
        if len(results) != len(unique):
            raise RuntimeError(f"retriever returned {len(results)} result lists for {len(unique)} queries")
        by_query = dict(zip(unique, results))
        return [by_query[query] for query in queries]

    def _close_answers(self, rows: list[Trajectory], params: SamplingParams) -> None:
        answered = [row for row in rows if self.wants_eos(row)]
        if not answered:
            return
        outputs = self._generate(answered, self.eos_params(params))
        for row, out in zip(answered, outputs):
            self.accept_eos(row, out)

    # ---- the per-turn rules both modes share ----------------------------------------------------
    def turn_budget(self, row: Trajectory) -> int:
        """Tokens the row may still generate (its response budget)."""
        return self.config.max_response_length - len(row.response)

    def apply_generation(self, row: Trajectory, out: RolloutOutput, final: bool) -> Action | None:
        """Append the turn's tokens, end the row when needed; returns the parsed action (stop only).

        An invalid action gets the corrective message here; a search's observation is appended
        by the caller (:meth:`observe_search`) once the retriever answered.
        """
        row.turns += 1
        if out.finish_reason != "stop":
            row.add_generated(out.token_ids, out.log_probs)
            row.end(truncated=out.finish_reason == "length")
            return None
        text = self.tokenizer.decode(out.token_ids, skip_special_tokens=False)
        keep, tail = split_at_stop(self.tokenizer, out.token_ids, STOP_STRINGS, text)
        row.add_generated(out.token_ids[:keep], out.log_probs[:keep])
        if tail:  # the rest of the stop string, in place of a token that ran past it (stop_rule.py)
            if (len(row.context) + len(tail) > self.config.max_prompt_length
                    or len(row.response) + len(tail) > self.config.max_response_length):
                row.end(truncated=True)
                return None
            row.add_observation(tail)
        action = parse_action((row.open_tag if row.turns == 1 else "") + text)
        row.valid_action += int(action.valid)
        row.valid_search += int(action.kind == "search")
        if action.kind == "answer":
            row.end(finished=True)
        elif final:
            row.end()
        elif action.kind is None:
            self._observe(row, self.observations.invalid_ids)
        return action

    def observe_search(self, row: Trajectory, docs: list[dict]) -> None:
        """Append the tokenised passages of a search (cut to ``max_obs_length``)."""
        ids, cut = self.observations.search(docs)
        row.obs_truncated += int(cut)
        row.empty_search += int(not docs)
        self._observe(row, ids)

    def _observe(self, row: Trajectory, ids: list[int]) -> None:
        """Append an observation, or end the row (truncated) when it would overflow a budget."""
        too_long_context = len(row.context) + len(ids) > self.config.max_prompt_length
        too_long_response = len(row.response) + len(ids) >= self.config.max_response_length
        if too_long_context or too_long_response:
            row.end(truncated=True)
        else:
            row.add_observation(ids)

    def wants_eos(self, row: Trajectory) -> bool:
        """Whether ``close_with_eos`` samples one more token for this row (answered, no EOS yet, room)."""
        eos = self.tokenizer.eos_token_id
        return (self.config.close_with_eos and eos is not None and row.finished and bool(row.response_mask)
                and row.response[-1] != eos and len(row.response) < self.config.max_response_length)

    @staticmethod
    def eos_params(params: SamplingParams) -> SamplingParams:
        return replace(params, max_tokens=1, stop=[])

    def accept_eos(self, row: Trajectory, out: RolloutOutput) -> None:
        """Keep the closing token when it is the EOS (mask 1, its real log-prob)."""
        if out.token_ids[:1] == [self.tokenizer.eos_token_id]:
            row.add_generated(out.token_ids[:1], out.log_probs[:1])

    # ---- output -----------------------------------------------------------------------------
    def _to_dataproto(self, rows: list[Trajectory], width: int) -> DataProto:
        resp_len = self.config.max_response_length
        prompts = pad_rows([r.prompt for r in rows], width, self.pad_id, torch.long, left=True)
        prompt_mask = length_mask(torch.tensor([len(r.prompt) for r in rows], dtype=torch.long), width, left=True)
        responses = pad_rows([r.response for r in rows], resp_len, self.pad_id, torch.long, left=False)
        resp_attn = length_mask(torch.tensor([len(r.response) for r in rows], dtype=torch.long), resp_len, left=False)
        attention_mask = torch.cat([prompt_mask, resp_attn], dim=1)
        tensors = {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
            "response_mask": pad_rows([r.response_mask for r in rows], resp_len, 0, torch.long, left=False),
            "rollout_log_probs": pad_rows([r.log_probs for r in rows], resp_len, 0.0, torch.float32, left=False),
        }
        for stat in ("turns", "valid_search", "valid_action", "finished", "truncated", "obs_truncated", "empty_search"):
            tensors[stat] = torch.tensor([int(getattr(r, stat)) for r in rows], dtype=torch.long)
        return DataProto.from_dict(tensors=tensors, non_tensors={"action_prefix": [r.open_tag for r in rows]},
                                   meta_info={"obs_truncated": sum(r.obs_truncated for r in rows)})
