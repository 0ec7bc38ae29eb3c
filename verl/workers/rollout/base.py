"""The rollout engine interface shared by the vLLM and transformers engines.

The multi-turn loop (``verl/workers/rollout/agent_loop/``) only ever sends token ids to an engine
and gets token ids back, so a trajectory is the exact concatenation of what the model sampled and
the tokenised observations: no text is decoded and re-encoded into the training sequence.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Iterable, Literal

import torch

FinishReason = Literal["stop", "length", "eos"]


@dataclass
class SamplingParams:
    """Sampling parameters understood by every engine.

    Attributes:
        temperature: softmax temperature; ``0`` means greedy (argmax) decoding.
        top_p: nucleus probability mass kept (1.0 = off).
        top_k: number of most likely tokens kept (-1 = off).
        max_tokens: maximum number of new tokens per sample.
        stop: stop strings; generation ends right after the first one appears in the new text and
            the string is kept in the output (``finish_reason == "stop"``).
        n: samples per prompt; outputs of one prompt are adjacent.
        seed: optional seed for reproducible sampling.
        logprobs: whether to return the log-prob of every sampled token.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    n: int = 1
    seed: int | None = None
    logprobs: bool = True

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class RolloutOutput:
    """One generated sample.

    Attributes:
        token_ids: generated ids, including the matched stop string's tokens or the final EOS.
        log_probs: log-prob of each generated token under the sampling distribution
            (same length as ``token_ids``; empty when ``SamplingParams.logprobs`` is false).
        finish_reason: ``"stop"`` (a stop string matched), ``"eos"`` (an EOS token was sampled) or
            ``"length"`` (``max_tokens`` reached).
        stop_str: the matched stop string when ``finish_reason == "stop"``.
    """

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: FinishReason
    stop_str: str | None = None


class RolloutEngine(abc.ABC):
    """A generation engine the rollout loop drives with token ids.

    ``weight_dtype``: the dtype the engine computes in; a weight push sends tensors already cast to
    it (None: any dtype, the engine converts).
    """

    weight_dtype: torch.dtype | None = None

    @abc.abstractmethod
    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[RolloutOutput]:
        """Continue each prompt; returns ``len(prompt_token_ids) * params.n`` outputs, prompts in
        order and the samples of one prompt adjacent."""

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights (Hugging Face parameter names) into the engine."""

    def release_memory(self) -> None:
        """Free the KV cache (and weights where supported) before training; default no-op."""

    def resume_memory(self, weights_only: bool = False) -> None:
        """Re-create what ``release_memory`` freed; default no-op.

        Args:
            weights_only: bring back the weights only (a weight push needs them, not the KV cache),
                so that the caller can free its training memory before the KV cache returns with a
                second call, without it (veRL's order around the push).
        """


def first_stop(text: str, stops: Iterable[str]) -> tuple[int, str] | None:
    """Earliest end position of any stop string in ``text`` as ``(end, stop)``, or None.

    Ties on the start position go to the longer stop string.
    """
    best: tuple[int, int, str] | None = None
    for stop in stops:
        start = text.find(stop)
        if start < 0:
            continue
        key = (start, -len(stop))
        if best is None or key < best[:2]:
            best = (start, -len(stop), stop)
    if best is None:
        return None
    return best[0] + len(best[2]), best[2]
