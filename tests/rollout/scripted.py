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
        return RolloutOutput(out, [-0.5] * len(out), reason, stop)
