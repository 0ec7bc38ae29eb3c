"""A scripted engine: replays fixed turn texts per prompt with real tokenisation and stop rules.

Used only where the engine is not the thing under test (the loop's parsing and bookkeeping).
"""

from __future__ import annotations

from verl.workers.rollout.base import RolloutOutput, SamplingParams, first_stop


class ScriptedEngine:
    """``scripts[i]`` lists the texts row ``i`` (identified by its prompt ids) writes, one per turn."""

    def __init__(self, tokenizer, prompts: list[list[int]], scripts: list[list[str]]):
        self.tokenizer = tokenizer
        self.scripts = {tuple(p): list(s) for p, s in zip(prompts, scripts)}
        self.calls: list[list[list[int]]] = []
        self.logprobs_asked: list[bool] = []  # each request's SamplingParams.logprobs
        self.turn = {tuple(p): 0 for p in prompts}

    def _script(self, context: list[int]) -> tuple[tuple, str]:
        for prompt, texts in self.scripts.items():
            if tuple(context[:len(prompt)]) == prompt:
                turn = self.turn[prompt]
                self.turn[prompt] += 1
                return prompt, texts[turn] if turn < len(texts) else self.tokenizer.eos_token
        raise KeyError("unknown prompt")

    def generate(self, prompt_token_ids, params: SamplingParams):
        self.calls.append([list(p) for p in prompt_token_ids])
        return [self._one(context, params) for context in prompt_token_ids]

    def _one(self, context, params) -> RolloutOutput:
        self.logprobs_asked.append(params.logprobs)
        _, text = self._script(context)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        out, reason, stop = [], "length", None
        for token in ids[:params.max_tokens]:
            out.append(token)
            if token == self.tokenizer.eos_token_id:
                reason = "eos"
                break
            match = first_stop(self.tokenizer.decode(out), params.stop)
            if match:
                reason, stop = "stop", match[1]
                break
        else:
            if len(ids) <= params.max_tokens:
                reason = "eos"  # script ran out: treat as an EOS-less natural end
        return RolloutOutput(out, [-0.5] * len(out) if params.logprobs else [], reason, stop)


def search_loop(tokenizer, engine, retriever=None, *, mode: str = "sync", max_turns: int = 4,
                max_start_length: int = 2048, max_prompt_length: int = 4096, max_response_length: int = 1024,
                max_obs_length: int = 512, do_search: bool = True, log_probs: bool = True):
    """A ``MultiTurnRollout`` of the Search-R1 environment over ``engine`` with test-sized budgets
    (``do_search=False`` or no retriever: every search is answered with no passage)."""
    from search_r1.envs.search_r1 import search_rollout
    from verl.workers.rollout.agent_loop import LoopConfig

    loop = LoopConfig(max_turns=max_turns, max_start_length=max_start_length, max_prompt_length=max_prompt_length,
                      max_response_length=max_response_length, mode=mode, log_probs=log_probs)
    return search_rollout(tokenizer, engine, retriever if do_search else None, loop, max_obs_length)
