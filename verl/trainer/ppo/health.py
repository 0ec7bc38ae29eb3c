"""Training health: cheap per-step signals of a collapse that the score shows only later, and alarms.

Every training step logs ``health/*`` (on by default, ``trainer.health``):

* the environment's text-level signals (``Environment.health``: Search-R1's share of responses with
  broken tags, ``<think>`` length and repetition, answer avoidance, searches per question by data
  source), each a mean over the step's responses;
* ``health/lld/pos_logprob``: the mean per-token log-likelihood of the responses with a positive
  advantage under the policy that sampled them, and ``health/lld/pos_logprob_change`` its change
  since the previous step. Deng et al. 2026 (arXiv:2512.04220) find this likelihood stagnating,
  then falling, before GRPO collapses in agent search (lazy likelihood displacement); it costs
  nothing here (the actor update sums it from the log-probs it computes anyway);
* ``health/grad_norm``: the actor's gradient norm before clipping (it inflates as likelihood falls).

A rule watches a signal's drift from the run's own start (its mean over the first
``baseline_steps`` steps): ``rise`` / ``fall``: the step's value is more than the threshold above /
below that start; ``grow``: it is more than ``threshold`` times the start. A rule crossed for
``patience`` consecutive steps raises the alarm: one warning line naming the signal, and
``health/alarm`` = 1 for as long as it stays crossed. The closing summary lists the alarms.
Drift rather than absolute levels: a small model's first steps may already answer rarely; what
warns is that it got worse. The thresholds are defaults chosen for Search-R1-style runs, not
measured optima; ``trainer.health.thresholds`` overrides them by signal name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

import numpy as np

from verl.trainer.run_exit import HealthAlarmStop
from verl.workers.actor.dp_actor import POS_LOGPROB_ROWS, POS_LOGPROB_SUM

HEALTH_RULE_KINDS = ("rise", "fall", "grow")
# The trainer's own signals (any environment): name -> (kind, threshold).
TRAINER_RULES = {"lld/pos_logprob": ("fall", 0.3), "grad_norm": ("grow", 5.0)}


@dataclass(frozen=True)
class HealthConfig:
    """Training-health signals and their alarms (``trainer.health``; verl/trainer/ppo/health.py)."""

    enabled: bool = True
    """log `health/*` every step and raise alarms (costs one decode of the responses)"""
    baseline_steps: int = 3
    """a signal's start: its mean over the run's first N steps (alarms are drifts from it)"""
    patience: int = 3
    """a rule must hold this many consecutive steps to raise the alarm"""
    thresholds: Optional[Dict[str, float]] = None
    """per-signal threshold overrides, e.g. `{broken_tags: 0.1, grad_norm: 10}` (defaults: the
    environment's rules and `lld/pos_logprob` fall 0.3 nats/token, `grad_norm` grow 5x)"""
    stop_on_alarm: bool = False
    """end the run at the step an alarm is raised, before that step's validation and checkpoint (the
    latest checkpoint stays the last one before it): one line naming the alarm, exit status 1"""


@dataclass(frozen=True)
class HealthRule:
    """An alarm rule on ``health/<signal>`` (kinds in the module docstring)."""

    signal: str
    kind: str
    threshold: float

    def __post_init__(self) -> None:
        assert self.kind in HEALTH_RULE_KINDS, f"health rule {self.signal}: unknown kind {self.kind!r}"

    def crossed(self, value: float, start: float) -> bool:
        if self.kind == "rise":
            return value - start > self.threshold
        if self.kind == "fall":
            return start - value > self.threshold
        return start > 0 and value / start > self.threshold

    def describe(self, value: float, start: float) -> str:
        """E.g. ``broken_tags 0.450 rose from its start 0.050 (by more than 0.2)``."""
        verb = {"rise": "rose", "fall": "fell", "grow": "grew"}[self.kind]
        by = f"more than {self.threshold:g}x" if self.kind == "grow" else f"by more than {self.threshold:g}"
        return f"{self.signal} {value:.3f} {verb} from its start {start:.3f} ({by})"


def health_rules(env_rules: Mapping[str, tuple[str, float]], thresholds: Mapping[str, float] | None) -> list[HealthRule]:
    """The run's rules: the environment's and :data:`TRAINER_RULES`, thresholds overridden by name.

    Raises:
        ValueError: an override names no signal (listing the known ones).
    """
    rules = {**TRAINER_RULES, **env_rules}
    unknown = sorted(set(thresholds or {}) - set(rules))
    if unknown:
        raise ValueError(f"trainer.health.thresholds: no signal {', '.join(unknown)} (known: {', '.join(sorted(rules))})")
    overrides = dict(thresholds or {})
    return [HealthRule(name, kind, float(overrides.get(name, threshold))) for name, (kind, threshold) in rules.items()]


def decoded_responses(batch, tokenizer) -> list[str]:
    """Each row's response text (special tokens skipped), after the action its prompt opened."""
    width = batch.batch["responses"].shape[-1]
    real = batch.batch["attention_mask"][:, -width:].bool()
    ids = [row[keep].tolist() for row, keep in zip(batch.batch["responses"], real)]
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    prefixes = batch.non_tensor_batch.get("action_prefix")
    if prefixes is None:
        return texts
    return [str(prefix or "") + text for prefix, text in zip(prefixes, texts)]


def text_signals(env, texts: list[str], data_sources) -> dict[str, float]:
    """``health/<name>``: the mean of each of the environment's per-row signals (NaN rows left
    out), and ``health/<name>/<data_source>`` for its ``health_by_source`` signals."""
    metrics = {}
    for name, values in env.health(texts).items():
        values = np.asarray(values, dtype=float)
        if np.isfinite(values).any():
            metrics[f"health/{name}"] = float(np.nanmean(values))
        if name in env.health_by_source and data_sources is not None:
            sources = np.asarray([str(s) for s in data_sources])
            for source in sorted(set(sources.tolist())):
                chosen = values[sources == source]
                if np.isfinite(chosen).any():
                    metrics[f"health/{name}/{source}"] = float(np.nanmean(chosen))
    return metrics


def positive_logprob(metrics: Mapping[str, float]) -> float | None:
    """Mean over the rows with a positive advantage of their mean token log-probability under the
    sampling policy, from the actor update's sums (``dp_actor.positive_row_log_probs``: the update's
    ``old_log_probs``, its own forward on-policy); None without an update or without such a row."""
    rows = metrics.get(POS_LOGPROB_ROWS)
    if rows is None or not rows > 0:
        return None
    return float(metrics[POS_LOGPROB_SUM] / rows)


class HealthMonitor:
    """The step's ``health/*`` metrics and the alarm state of the run (module docstring).

    Args:
        config: the ``HealthConfig``.
        env: the run's environment (its ``health`` signals and rules).
        tokenizer: decodes the responses.
    """

    def __init__(self, config: HealthConfig, env, tokenizer) -> None:
        self.config, self.env, self.tokenizer = config, env, tokenizer
        self.rules = health_rules(env.health_rules, config.thresholds)
        self.starts: dict[str, list[float]] = {}
        self.streaks: dict[str, int] = {}
        self.fired: dict[str, dict] = {}
        self.previous_logprob: float | None = None
        self.raised_now: list[str] = []  # the alarms the last observed step raised

    def observe(self, step: int, batch, metrics: Mapping[str, float]) -> dict[str, float]:
        """``health/*`` of a finished step (``metrics``: the step's metrics so far, for the
        gradient norm); prints a warning line for each alarm raised at this step."""
        if not self.config.enabled:
            return {}
        out = text_signals(self.env, decoded_responses(batch, self.tokenizer), batch.non_tensor_batch.get("data_source"))
        logprob = positive_logprob(metrics)
        if logprob is not None:
            out["health/lld/pos_logprob"] = logprob
            if self.previous_logprob is not None:
                out["health/lld/pos_logprob_change"] = logprob - self.previous_logprob
            self.previous_logprob = logprob
        if "actor/grad_norm" in metrics and math.isfinite(metrics["actor/grad_norm"]):
            out["health/grad_norm"] = float(metrics["actor/grad_norm"])
        out["health/alarm"] = float(self._watch(step, out))
        return out

    def _watch(self, step: int, signals: Mapping[str, float]) -> bool:
        alarm, self.raised_now = False, []
        for rule in self.rules:
            value = signals.get(f"health/{rule.signal}")
            if value is None:
                continue
            start = self.starts.setdefault(rule.signal, [])
            if len(start) < self.config.baseline_steps:
                start.append(value)
                continue
            baseline = float(np.mean(start))
            streak = self.streaks[rule.signal] = self.streaks.get(rule.signal, 0) + 1 if rule.crossed(value, baseline) else 0
            if streak >= self.config.patience:
                alarm = True
            if streak == self.config.patience:
                text = rule.describe(value, baseline)
                self.fired.setdefault(rule.signal, {"step": step, "text": text})
                self.raised_now.append(f"{text} for {streak} steps")
                print(f"WARNING health alarm at step {step}: {text} for {streak} steps", flush=True)
        return alarm

    def check_stop(self, step: int) -> None:
        """End the run here when ``stop_on_alarm`` is set and the step just observed (``step``) raised an alarm.

        Raises:
            HealthAlarmStop: naming the step and the alarm(s) raised at it.
        """
        if self.config.stop_on_alarm and self.raised_now:
            raise HealthAlarmStop(f"training stopped at step {step} by a health alarm (trainer.health.stop_on_alarm): "
                                  + "; ".join(self.raised_now))

    def summary(self) -> list[str]:
        """The closing summary's lines: the alarms raised (first step of each), or that none was."""
        if not self.config.enabled:
            return []
        if not self.fired:
            return ["  health:       no alarm"]
        return [f"  health:       alarm at step {alarm['step']}: {alarm['text']}" for alarm in
                sorted(self.fired.values(), key=lambda a: a["step"])]

    def state_dict(self) -> dict:
        """What a checkpoint keeps (JSON), so a resumed run watches from the same start."""
        return {"starts": self.starts, "streaks": self.streaks, "fired": self.fired,
                "previous_logprob": self.previous_logprob}

    def load_state_dict(self, state: Mapping) -> None:
        self.starts = {k: list(v) for k, v in state.get("starts", {}).items()}
        self.streaks = dict(state.get("streaks", {}))
        self.fired = dict(state.get("fired", {}))
        self.previous_logprob = state.get("previous_logprob")
