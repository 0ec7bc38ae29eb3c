"""The per-turn rules of the multi-turn rollout, shared by the sync loop and the async tasks.

A turn: the engine generates until one of the environment's stop strings (or the EOS, or the
budget); the turn's tokens are appended as generated (``response_mask`` 1); the environment parses
the text into an action. A final action (the answer) ends the row (``finished``); a tool call gets
the environment's observation appended once the tool answered (``response_mask`` 0); an invalid
action gets the environment's corrective observation. An EOS or a ``length`` finish ends the row, a
budget overflow ends it ``truncated``. After ``max_turns`` tool rounds one last generation is made
whose tool call is not run (the row ends unanswered).

The trajectory is the exact concatenation of engine token ids and environment token ids: generated
text is decoded only to parse actions, never re-encoded. A turn ends exactly at its stop string
(``stop_rule.py``). A prompt that itself opens an action (``Environment.open_tag``, a forced
assistant prefix) has its first turn parsed as the continuation of that tag.

Answered rows stop on their stop string, before the model's own EOS: one extra 1-token generation per
answered row samples the next token, and when it is the EOS it is appended (mask 1, real log-prob),
so the final EOS is trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from verl.envs.base import Action, Environment, Observation
from verl.workers.rollout.agent_loop.stop_rule import split_at_stop
from verl.workers.rollout.agent_loop.trajectory import Trajectory
from verl.workers.rollout.base import RolloutOutput, SamplingParams
from verl.workers.rollout.config import ROLLOUT_MODES


@dataclass(frozen=True)
class LoopConfig:
    """Budgets of the multi-turn rollout, derived from the run's configuration (no defaults here:
    ``verl.trainer.ppo.trainer_setup.loop_config`` maps the config's keys onto them).

    Attributes:
        max_turns: tool rounds before the final, tool-free generation (``max_turns``).
        max_start_length: longest accepted prompt, tokens (``data.max_start_length``).
        max_prompt_length: longest context sent to the engine (prompt + response so far); the
            engine's ``max_model_len`` must be at least this plus one turn (``data.max_prompt_length``).
        max_response_length: response budget (generated + environment tokens) = width R of the
            output (``RunPlan.response_width``).
        mode: ``"sync"`` (turn by turn over the batch) or ``"async"`` (a task per row).
        log_probs: ask the engine for each sampled token's log-prob (``rollout_log_probs``).
    Raises:
        ValueError: an unknown ``mode``.
    """

    max_turns: int
    max_start_length: int
    max_prompt_length: int
    max_response_length: int
    mode: str
    log_probs: bool

    def __post_init__(self) -> None:
        if self.mode not in ROLLOUT_MODES:
            raise ValueError(f"rollout mode must be one of {ROLLOUT_MODES}, got {self.mode!r}")

    @property
    def seeds_per_row(self) -> int:
        """Requests one row can make: ``max_turns + 1`` turns and the EOS-closing one."""
        return self.max_turns + 2


class TurnRules:
    """Applies one turn's output to a row (see the module docstring).

    Args:
        tokenizer: the policy's tokenizer (decodes a turn's text for parsing).
        env: the :class:`~verl.envs.base.Environment`.
        config: the :class:`LoopConfig`.
    """

    def __init__(self, tokenizer, env: Environment, config: LoopConfig) -> None:
        self.tokenizer, self.env, self.config = tokenizer, env, config

    def turn_budget(self, row: Trajectory) -> int:
        """Tokens the row may still generate (its response budget)."""
        return self.config.max_response_length - len(row.response)

    def apply_generation(self, row: Trajectory, out: RolloutOutput, final: bool) -> Action | None:
        """Append the turn's tokens, end the row when needed; returns the parsed action (stop only).

        An invalid action gets the environment's answer here; a tool call's observation is
        appended by the caller (:meth:`observe`) once the tool answered.
        """
        row.turns += 1
        if out.finish_reason != "stop":
            row.add_generated(out.token_ids, out.log_probs)
            row.end(truncated=out.finish_reason == "length")
            return None
        text = self.tokenizer.decode(out.token_ids, skip_special_tokens=False)
        keep, tail = split_at_stop(self.tokenizer, out.token_ids, self.env.stop_strings, text)
        row.add_generated(out.token_ids[:keep], out.log_probs[:keep])
        if tail:  # the rest of the stop string, in place of a token that ran past it (stop_rule.py)
            if not self._fits(row, tail, strict=False):
                row.end(truncated=True)
                return None
            row.add_environment(tail)
        action = self.env.parse((row.open_tag if row.turns == 1 else "") + text)
        row.count(action.counts)
        if action.kind == "final":
            row.end(finished=True)
        elif final:
            row.end()
        elif action.kind is None:
            self.observe(row, self.env.invalid(action))
        return action

    def observe(self, row: Trajectory, observation: Observation) -> None:
        """Append an observation, or end the row (truncated) when it would overflow a budget."""
        row.count(observation.counts)
        if self._fits(row, observation.ids, strict=True):
            row.add_environment(observation.ids)
        else:
            row.end(truncated=True)

    def _fits(self, row: Trajectory, ids: list[int], strict: bool) -> bool:
        """Room for ``ids`` in the context and the response budget (``strict``: an observation must
        leave at least one response token for the next turn)."""
        response_room = self.config.max_response_length - len(row.response)
        return (len(row.context) + len(ids) <= self.config.max_prompt_length
                and (len(ids) < response_room if strict else len(ids) <= response_room))

    def wants_eos(self, row: Trajectory) -> bool:
        """Whether the row samples one more token to close its answer (answered, no EOS yet, room)."""
        eos = self.tokenizer.eos_token_id
        return (eos is not None and row.finished and bool(row.response_mask)
                and row.response[-1] != eos and len(row.response) < self.config.max_response_length)

    @staticmethod
    def eos_params(params: SamplingParams) -> SamplingParams:
        return replace(params, max_tokens=1, stop=[])

    def accept_eos(self, row: Trajectory, out: RolloutOutput) -> None:
        """Keep the closing token when it is the EOS (mask 1, its real log-prob)."""
        if out.token_ids[:1] == [self.tokenizer.eos_token_id]:
            row.add_generated(out.token_ids[:1], out.log_probs[:1])
