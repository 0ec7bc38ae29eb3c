"""The multi-turn search loop (Search-R1's ``LLMGenerationManager``), token in, token out.

Each turn sends the active rows' contexts (prompt + response so far, as token ids) to the engine
with stop strings ``</search>`` and ``</answer>``, parses the first complete action of each row's
new text, runs one batched retriever call for all searching rows and appends the tokenised
observation. The trajectory is the exact concatenation of engine token ids and observation token
ids: generated text is decoded only to parse actions, never re-encoded.

Row lifecycle: an ``<answer>`` ends the row (``finished``); an EOS ends it; a ``length`` finish or a
context/response budget overflow ends it (``truncated``); an invalid action gets Search-R1's
corrective message and the row continues. After ``max_turns`` search rounds one last generation is
made without search (a search there ends the row unanswered).

Answered rows stop on ``</answer>``, before the model's own EOS. With ``close_with_eos`` one extra
1-token generation per answered row (one engine call for all) samples the next token; when it is
the EOS it is appended (mask 1, real log-prob), so the final EOS is trained on.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch

from search_r1.llm_agent.observation import ObservationEncoder
from search_r1.llm_agent.parsing import STOP_STRINGS, Action, parse_action
from search_r1.llm_agent.tensor_helper import pad_rows, position_ids_from_mask
from search_r1.llm_agent.trajectory import Trajectory
from verl.protocol import DataProto
from verl.workers.rollout.base import RolloutOutput, SamplingParams


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
    """

    max_turns: int = 4
    max_start_length: int = 2048
    max_prompt_length: int = 4096
    max_response_length: int = 1024
    max_obs_length: int = 512
    do_search: bool = True
    close_with_eos: bool = True


class LLMGenerationManager:
    """Runs the search loop over a batch with any engine exposing ``generate(prompt_ids, params)``.

    Args:
        tokenizer: the policy's tokenizer (decodes new text for parsing, encodes observations).
        engine: a ``RolloutEngine`` or an adapter with the same ``generate``.
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
            ``(B, P + R)`` and int64 ``(B,)`` stats ``turns, valid_search, valid_action, finished,
            truncated``; ``meta_info["timing"]`` has generation/retrieval/bookkeeping seconds.
        """
        if params.n != 1:
            raise ValueError(f"run_llm_loop samples once per row; got n={params.n}. Repeat the batch instead.")
        self.timing = {"generation_s": 0.0, "retrieval_s": 0.0, "bookkeeping_s": 0.0}
        start = time.perf_counter()
        rows = [Trajectory(prompt, open_tag=self._open_tag(prompt)) for prompt in self._prompts(batch)]
        params = replace(params, stop=list(STOP_STRINGS), logprobs=True)
        for turn in range(self.config.max_turns + 1):
            active = [row for row in rows if row.active]
            if not active:
                break
            outputs = self._generate(active, params)
            self._step(active, outputs, final=turn == self.config.max_turns)
        if self.config.close_with_eos:
            self._close_answers(rows, params)
        output = self._to_dataproto(rows, batch)
        self.timing["bookkeeping_s"] = time.perf_counter() - start - self.timing["generation_s"] - self.timing["retrieval_s"]
        output.meta_info["timing"] = dict(self.timing)
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

    def _open_tag(self, prompt: list[int]) -> str:
        """``<search>``/``<answer>`` when the prompt itself opens the action (a forced assistant
        prefix); the first turn's new text is parsed as its continuation."""
        tail = self.tokenizer.decode(prompt[-4:], skip_special_tokens=False)
        return next((tag for tag in ("<search>", "<answer>") if tail.endswith(tag)), "")

    def _generate(self, rows: list[Trajectory], params: SamplingParams) -> list[RolloutOutput]:
        budget = [self.config.max_response_length - len(row.response) for row in rows]
        turn_params = replace(params, max_tokens=min(params.max_tokens, max(budget)))
        tic = time.perf_counter()
        outputs = self.engine.generate([row.context for row in rows], turn_params)
        self.timing["generation_s"] += time.perf_counter() - tic
        if len(outputs) != len(rows):
            raise RuntimeError(f"engine returned {len(outputs)} outputs for {len(rows)} prompts")
        # One max_tokens for the batch: cut rows whose own response budget is smaller.
        return [out if len(out.token_ids) <= room else
                RolloutOutput(out.token_ids[:room], out.log_probs[:room], "length")
                for out, room in zip(outputs, budget)]

    def _step(self, rows: list[Trajectory], outputs: list[RolloutOutput], final: bool) -> None:
        searches: list[tuple[Trajectory, str]] = []
        for row, out in zip(rows, outputs):
            action = self._apply_generation(row, out, final)
            if action is not None and action.kind == "search" and row.active:
                searches.append((row, action.content))
        if not searches:
            return
        if self.config.do_search:
            results = self._retrieve([query for _, query in searches])
        else:
            results = [[] for _ in searches]
        for (row, _), docs in zip(searches, results):
            ids, cut = self.observations.search(docs)
            row.obs_truncated += int(cut)
            self._observe(row, ids)

    def _apply_generation(self, row: Trajectory, out: RolloutOutput, final: bool) -> Action | None:
        """Append the turn's tokens, end the row when needed; returns the parsed action (stop only)."""
        row.turns += 1
        row.add_generated(out.token_ids, out.log_probs)
        if out.finish_reason != "stop":
            row.end(truncated=out.finish_reason == "length")
            return None
        text = self.tokenizer.decode(out.token_ids, skip_special_tokens=False)
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

    def _observe(self, row: Trajectory, ids: list[int]) -> None:
        """Append an observation, or end the row (truncated) when it would overflow a budget."""
        too_long_context = len(row.context) + len(ids) > self.config.max_prompt_length
        too_long_response = len(row.response) + len(ids) >= self.config.max_response_length
        if too_long_context or too_long_response:
            row.end(truncated=True)
        else:
            row.add_observation(ids)

    def _retrieve(self, queries: list[str]) -> list[list[dict]]:
        tic = time.perf_counter()
        if hasattr(self.retriever, "aretrieve") and not _in_event_loop():
            results = asyncio.run(self.retriever.aretrieve(queries))
        else:
            results = self.retriever.retrieve(queries)
        self.timing["retrieval_s"] += time.perf_counter() - tic
        if len(results) != len(queries):
            raise RuntimeError(f"retriever returned {len(results)} result lists for {len(queries)} queries")
        return results

    def _close_answers(self, rows: list[Trajectory], params: SamplingParams) -> None:
        eos = self.tokenizer.eos_token_id
        answered = [row for row in rows if row.finished and row.response_mask and row.response[-1] != eos
                    and len(row.response) < self.config.max_response_length]
        if not answered or eos is None:
            return
        outputs = self._generate(answered, replace(params, max_tokens=1, stop=[]))
        for row, out in zip(answered, outputs):
            if out.token_ids[:1] == [eos]:
                row.add_generated(out.token_ids[:1], out.log_probs[:1])

    # ---- output -----------------------------------------------------------------------------
    def _to_dataproto(self, rows: list[Trajectory], batch: DataProto) -> DataProto:
        width = batch.batch["input_ids"].shape[1] if batch.batch is not None and "input_ids" in batch.batch.keys() \
            else max(len(row.prompt) for row in rows)
        width = max(width, max(len(row.prompt) for row in rows))
        resp_len = self.config.max_response_length
        prompts = pad_rows([r.prompt for r in rows], width, self.pad_id, torch.long, left=True)
        prompt_mask = pad_rows([[1] * len(r.prompt) for r in rows], width, 0, torch.long, left=True)
        responses = pad_rows([r.response for r in rows], resp_len, self.pad_id, torch.long, left=False)
        resp_attn = pad_rows([[1] * len(r.response) for r in rows], resp_len, 0, torch.long, left=False)
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
        for stat in ("turns", "valid_search", "valid_action", "finished", "truncated"):
            tensors[stat] = torch.tensor([int(getattr(r, stat)) for r in rows], dtype=torch.long)
        return DataProto.from_dict(tensors=tensors, meta_info={"obs_truncated": sum(r.obs_truncated for r in rows)})


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
