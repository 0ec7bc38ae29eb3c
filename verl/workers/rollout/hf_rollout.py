"""Transformers rollout engine: a batched KV-cache decode loop over a causal LM.

For machines without vLLM and for debugging. It is a hand-written loop (not ``model.generate``)
so that stop strings, finish reasons and log-probs follow exactly the same rules as the vLLM engine:

* prompts are left padded; ``position_ids = cumsum(attention_mask) - 1`` so padding never shifts
  positions (padding is never inferred from ids: pad == eos for SmolLM2/Qwen);
* log-probs are those of the *processed* sampling distribution, the same as vLLM's
  ``logprobs_mode="processed_logprobs"``: ``log_softmax(top_k_top_p(logits / temperature))`` when
  sampling and ``log_softmax(logits)`` when greedy (``temperature == 0``);
* a row stops right after the token that completes a stop string (the token is kept, so the stop
  string is in the output) -> ``"stop"``; after sampling an EOS id (kept) -> ``"eos"``; after
  ``max_tokens`` -> ``"length"``. Stop strings are searched in the new text only.
"""

from __future__ import annotations

import inspect
import logging
from typing import Iterable

import torch

from verl.workers.rollout.base import RolloutEngine, RolloutOutput, SamplingParams, first_stop

logger = logging.getLogger(__name__)


def apply_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside the top-k / top-p nucleus with -inf.

    Args:
        logits: ``(batch, vocab)`` temperature-scaled logits.
    Returns:
        A new ``(batch, vocab)`` tensor; the most likely token is always kept.
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cum <= 1.0 - top_p
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the next token of every row and its log-prob under the processed distribution.

    Args:
        logits: ``(batch, vocab)`` float32 raw logits of the last position.
    Returns:
        ``(tokens, log_probs)``, both ``(batch,)``.
    """
    if params.greedy:
        log_probs = logits.log_softmax(dim=-1)
        tokens = logits.argmax(dim=-1)
    else:
        processed = apply_top_k_top_p(logits / params.temperature, params.top_k, params.top_p)
        log_probs = processed.log_softmax(dim=-1)
        tokens = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(-1)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts into ``(input_ids, attention_mask)``, both ``(batch, max_len)`` int64."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if prompt:
            ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt):] = 1
    return ids, mask


class _RowState:
    """Bookkeeping of one sample while decoding."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.log_probs: list[float] = []
        self.finish_reason: str | None = None
        self.stop_str: str | None = None


class HFRolloutEngine(RolloutEngine):
    """Batched generation with a transformers causal LM and its KV cache.

    Args:
        model: a loaded ``PreTrainedModel`` (e.g. the actor's unwrapped module) or None to load
            ``model_path``.
        tokenizer: used to detect stop strings in decoded tail windows and for the EOS/pad ids.
        model_path: folder or hub id loaded with ``AutoModelForCausalLM`` when ``model`` is None.
        dtype: torch dtype for loading (float32 on CPU).
        max_batch_size: prompts*samples decoded together at most (memory bound).
        seed: seeds the engine's generator, which samples requests that carry no seed of their
            own (None: torch's global RNG).
    """

    def __init__(self, tokenizer, model=None, model_path: str | None = None,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 max_batch_size: int = 64, seed: int | None = None) -> None:
        if model is None:
            if model_path is None:
                raise ValueError("HFRolloutEngine needs a model or a model_path")
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.eos_ids = self._eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.generator = None if seed is None else torch.Generator(device=self.device).manual_seed(seed)
        # Only the last position's logits are sampled from: a prompt's forward then skips the
        # (tokens x vocabulary) head output, which dominates it for small models with a large vocabulary.
        accepts = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.forward_kwargs = {"logits_to_keep": 1} if accepts else {}

    @staticmethod
    def _eos_ids(model, tokenizer) -> list[int]:
        ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
            ids.append(tokenizer.eos_token_id)
        if not ids:
            raise ValueError("neither the model's generation_config nor the tokenizer names an EOS token")
        return ids

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[RolloutOutput]:
        """See ``RolloutEngine.generate``; rows are decoded in chunks of ``max_batch_size``."""
        for row, prompt in enumerate(prompt_token_ids):
            if not prompt:
                raise ValueError(f"prompt {row} is empty")
        expanded = [p for p in prompt_token_ids for _ in range(params.n)]
        generator = self.generator
        if params.seed is not None and not params.greedy:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        outputs: list[RolloutOutput] = []
        for start in range(0, len(expanded), self.max_batch_size):
            outputs.extend(self._generate_chunk(expanded[start:start + self.max_batch_size], params, generator))
        return outputs

    @torch.no_grad()
    def _generate_chunk(self, prompts: list[list[int]], params: SamplingParams,
                        generator: torch.Generator | None) -> list[RolloutOutput]:
        input_ids, attention_mask = left_pad(prompts, self.pad_id)
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        states = [_RowState() for _ in prompts]
        past = None
        for _ in range(params.max_tokens):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past, use_cache=True, **self.forward_kwargs)
            past = out.past_key_values
            tokens, log_probs = sample_next(out.logits[:, -1, :].float(), params, generator)
            self._record(states, tokens.tolist(), log_probs.tolist(), params)
            if all(s.finish_reason is not None for s in states):
                break
            # Finished rows keep decoding (their tokens are ignored): the KV cache stays rectangular.
            input_ids = tokens[:, None]
            position_ids = position_ids[:, -1:] + 1
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(prompts), 1))], dim=-1)
        for state in states:
            if state.finish_reason is None:
                state.finish_reason = "length"
        return [RolloutOutput(s.token_ids, s.log_probs if params.logprobs else [], s.finish_reason, s.stop_str)
                for s in states]

    def _record(self, states: list[_RowState], tokens: list[int], log_probs: list[float],
                params: SamplingParams) -> None:
        window = max((len(s) for s in params.stop), default=0) + 2
        for state, token, log_prob in zip(states, tokens, log_probs):
            if state.finish_reason is not None:
                continue
            state.token_ids.append(token)
            state.log_probs.append(log_prob)
            if token in self.eos_ids:
                state.finish_reason = "eos"
                continue
            if params.stop:
                # A stop string of L characters spans at most L tokens, and it is detected at the
                # step that completes it, so decoding a short tail window is enough.
                tail = self.tokenizer.decode(state.token_ids[-window:], skip_special_tokens=False)
                match = first_stop(tail, params.stop)
                if match is not None:
                    state.finish_reason, state.stop_str = "stop", match[1]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors into the wrapped model's parameters by Hugging Face name.

        Raises:
            KeyError: a name that the model does not have.
        """
        state = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in state:
                    raise KeyError(f"update_weights: model has no parameter {name!r}")
                state[name].copy_(tensor.to(state[name].dtype))
