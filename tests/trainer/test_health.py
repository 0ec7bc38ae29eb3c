"""Training health: the step's ``health/*`` figures from real trajectories, the alarm rules, the best
checkpoint kept beside the latest, and the closing summary's lines."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from search_r1.envs.search_r1.env import SearchR1Environment
from search_r1.envs.search_tool import SearchTool
from verl.protocol import DataProto
from verl.trainer.main_ppo import parse_config
from verl.trainer.ppo import checkpointing
from verl.trainer.ppo.health import HealthConfig, HealthMonitor, HealthRule, positive_logprob
from verl.workers.actor.dp_actor import positive_row_log_probs
from verl.trainer.ppo.run_summary import closing_summary
from verl.utils.config import ConfigError

WELL_FORMED = "<think>look it up</think>\n<search> hamlet </search>\n\n<information>Doc 1(Title: x) y</information>\n\n" \
              "<think>found it</think>\n<answer> Shakespeare </answer>"
BROKEN = "<think>look it up look it up"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from verl.utils.model_zoo import qwen_tokenizer_dir
    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir())


@pytest.fixture(scope="module")
def env(tokenizer):
    return SearchR1Environment(tokenizer, SearchTool(None), 64)


def trajectories(tokenizer, texts: list[str], logprob: float = -1.0, advantages=None, sources=None) -> DataProto:
    """A finished rollout batch of these response texts (right padded; every response token trained)."""
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    width = max(map(len, ids))
    responses = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for row, row_ids in enumerate(ids):
        responses[row, :len(row_ids)] = torch.tensor(row_ids)
        mask[row, :len(row_ids)] = 1
    prompts = torch.ones(len(ids), 2, dtype=torch.long)
    advantages = torch.tensor(advantages if advantages is not None else [1.0] * len(ids)).unsqueeze(-1) * mask
    tensors = {"prompts": prompts, "responses": responses, "response_mask": mask,
               "attention_mask": torch.cat([torch.ones_like(prompts), mask], dim=1),
               "advantages": advantages.float(), "old_log_probs": torch.full(mask.shape, logprob) * mask}
    non_tensors = {"data_source": np.array(sources or ["nq"] * len(ids), dtype=object)}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def update_metrics(batch, **metrics):
    """The step's metrics as the actor update reports them for ``batch`` (its old log-probs)."""
    sums = positive_row_log_probs(batch.batch["old_log_probs"], batch.batch["advantages"], batch.batch["response_mask"])
    return {**{key: float(value) for key, value in sums.items()}, **metrics}


def test_health_figures_of_a_step(env, tokenizer):
    monitor = HealthMonitor(HealthConfig(), env, tokenizer)
    batch = trajectories(tokenizer, [WELL_FORMED, BROKEN, WELL_FORMED, "<answer> x </answer>"],
                         advantages=[1.0, -1.0, 0.5, 0.0], sources=["nq", "nq", "hotpotqa", "hotpotqa"])
    out = monitor.observe(1, batch, update_metrics(batch, **{"actor/grad_norm": 2.5}))
    assert out["health/broken_tags"] == 0.25 and out["health/no_answer"] == 0.25
    assert out["health/searches"] == 0.5
    assert out["health/searches/nq"] == 0.5 and out["health/searches/hotpotqa"] == 0.5
    assert out["health/think_words"] == pytest.approx((5 + 6 + 5 + 0) / 4)
    assert out["health/lld/pos_logprob"] == pytest.approx(-1.0)  # rows with A > 0 only
    assert out["health/grad_norm"] == 2.5 and out["health/alarm"] == 0.0
    assert "health/lld/pos_logprob_change" not in out
    later_batch = trajectories(tokenizer, [WELL_FORMED], logprob=-1.25)
    later = monitor.observe(2, later_batch, update_metrics(later_batch))
    assert later["health/lld/pos_logprob_change"] == pytest.approx(-0.25)


def test_health_alarm_fires_after_patience_steps_and_names_the_signal(env, tokenizer, capsys):
    monitor = HealthMonitor(HealthConfig(baseline_steps=2, patience=3), env, tokenizer)
    good = trajectories(tokenizer, [WELL_FORMED] * 4)
    bad = trajectories(tokenizer, [BROKEN, BROKEN, WELL_FORMED, WELL_FORMED])  # broken_tags 0.5, no_answer 0.5
    alarms = [monitor.observe(step, batch, {})["health/alarm"]
              for step, batch in enumerate([good, good, bad, bad, good, bad, bad, bad, bad], start=1)]
    assert alarms == [0, 0, 0, 0, 0, 0, 0, 1, 1]  # the good step 5 resets the streak
    lines = [line for line in capsys.readouterr().out.splitlines() if "health alarm" in line]
    assert lines[0] == ("WARNING health alarm at step 8: broken_tags 0.500 rose from its start 0.000 "
                        "(by more than 0.2) for 3 steps")
    assert any("no_answer 0.500 rose" in line for line in lines)
    summary = monitor.summary()
    assert summary[0].startswith("  health:       alarm at step 8: broken_tags 0.500 rose")
    resumed = HealthMonitor(HealthConfig(baseline_steps=2, patience=3), env, tokenizer)
    resumed.load_state_dict(monitor.state_dict())
    assert resumed.observe(10, bad, {})["health/alarm"] == 1.0  # the streak and the start survive a resume


def test_health_rules_drift_kinds():
    assert HealthRule("x", "rise", 0.2).crossed(0.35, 0.1) and not HealthRule("x", "rise", 0.2).crossed(0.25, 0.1)
    assert HealthRule("x", "fall", 0.3).crossed(-1.5, -1.0) and not HealthRule("x", "fall", 0.3).crossed(-1.2, -1.0)
    assert HealthRule("x", "grow", 5.0).crossed(11.0, 2.0) and not HealthRule("x", "grow", 5.0).crossed(1.0, 0.0)


def test_health_lld_fall_and_grad_norm_growth_raise_alarms(env, tokenizer):
    monitor = HealthMonitor(HealthConfig(baseline_steps=1, patience=2), env, tokenizer)
    steps = [(-1.0, 1.0), (-1.5, 1.0), (-1.5, 1.0), (-1.0, 9.0), (-1.0, 9.0)]
    batches = [trajectories(tokenizer, [WELL_FORMED], logprob=lp) for lp, _ in steps]
    alarms = [monitor.observe(i, batch, update_metrics(batch, **{"actor/grad_norm": g}))["health/alarm"]
              for i, (batch, (_, g)) in enumerate(zip(batches, steps), start=1)]
    assert alarms == [0, 0, 1, 0, 1]
    assert [line.split(": ")[2].split()[0] for line in monitor.summary()] == ["lld/pos_logprob", "grad_norm"]
    assert monitor.summary()[1].endswith("grad_norm 9.000 grew from its start 1.000 (more than 5x)")


def test_health_positive_logprob_ignores_other_rows(tokenizer):
    batch = trajectories(tokenizer, [WELL_FORMED, WELL_FORMED, WELL_FORMED], advantages=[1.0, -1.0, 2.0])
    batch.batch["old_log_probs"][1] = -9.0
    batch.batch["old_log_probs"][2] *= 3.0  # row means -1 and -3 among the positive rows
    assert positive_logprob(update_metrics(batch)) == pytest.approx(-2.0)
    assert positive_logprob({"actor/grad_norm": 1.0}) is None  # no actor update this step
    batch.batch["advantages"] *= 0
    assert positive_logprob(update_metrics(batch)) is None  # no row with a positive advantage


def test_health_disabled_and_thresholds_overridden(env, tokenizer):
    off = HealthMonitor(HealthConfig(enabled=False), env, tokenizer)
    assert off.observe(1, trajectories(tokenizer, [BROKEN]), {}) == {} and off.summary() == []
    tuned = HealthMonitor(HealthConfig(thresholds={"broken_tags": 0.05}), env, tokenizer)
    assert next(r for r in tuned.rules if r.signal == "broken_tags").threshold == 0.05


@pytest.mark.parametrize("overrides, message", [
    (["trainer.keep_best=critic/score/mean"], "trainer.keep_best='critic/score/mean': name a validation metric"),
    (["trainer.keep_best=val/test_em/all", "trainer.test_freq=0"], "needs validation: set trainer.test_freq > 0"),
    (["trainer.health.thresholds={broken_tag: 0.1}"], "trainer.health.thresholds: no signal broken_tag (known: "),
    (["trainer.health.patience=0"], "must be >= 1"),
    (["actor_rollout_ref.actor.llds.coef=0.2", "data.train_batch_size=256"],
     "llds.coef=0.2 has no effect with one update per step"),
    (["actor_rollout_ref.actor.llds.gate=token"], "actor_rollout_ref.actor.llds.gate='token': choose one of"),
    (["actor_rollout_ref.actor.llds.coef=-1"], "llds.coef=-1.0 must be >= 0"),
])
def test_health_keep_best_and_llds_config_errors(overrides, message):
    with pytest.raises(ConfigError) as error:
        parse_config(overrides)
    assert message in str(error.value)


def _save(root, step):
    checkpointing.save_checkpoint(root, step, {"data": {}}, lambda folder: (folder / "actor").mkdir(),
                                  max_to_keep=2, keep=[checkpointing.read_best(root)["step"]]
                                  if checkpointing.read_best(root) else [])


def test_health_best_checkpoint_is_kept_beside_the_latest_and_summarised(tmp_path):
    for step in (1, 2):
        _save(tmp_path, step)
    checkpointing.write_best(tmp_path, 2, "val/test_em/all", 0.4)
    for step in (3, 4, 5):
        _save(tmp_path, step)
    assert sorted(checkpointing.complete_steps(tmp_path)) == [2, 4, 5]  # two newest + the best
    assert checkpointing.read_best(tmp_path) == {"step": 2, "metric": "val/test_em/all", "value": 0.4}
    cfg = OmegaConf.create({"trainer": {"val_only": False, "default_local_dir": str(tmp_path),
                                        "log_dir": str(tmp_path / "logs"), "logger": ["console"]}})
    lines = closing_summary(cfg, 5, 5, {}, ["  health:       no alarm"]).splitlines()
    assert lines[1].startswith(f"  checkpoint:   {tmp_path / 'global_step_5'}")
    assert lines[2] == f"  best:         {tmp_path / 'global_step_2'}  (val/test_em/all 0.400)"
    assert lines[3] == "  health:       no alarm"


def test_health_check_stop_raises_at_the_alarm_step_only_when_asked(env, tokenizer):
    from verl.trainer.run_exit import HealthAlarmStop

    good = trajectories(tokenizer, [WELL_FORMED] * 4)
    bad = trajectories(tokenizer, [BROKEN, BROKEN, WELL_FORMED, WELL_FORMED])
    watching = HealthMonitor(HealthConfig(baseline_steps=1, patience=2), env, tokenizer)
    stopping = HealthMonitor(HealthConfig(baseline_steps=1, patience=2, stop_on_alarm=True), env, tokenizer)
    for step, batch in enumerate([good, bad], start=1):
        for monitor in (watching, stopping):
            monitor.observe(step, batch, {})
            monitor.check_stop(step)  # no alarm yet
    watching.observe(3, bad, {})
    watching.check_stop(3)  # alarm raised, only warned
    stopping.observe(3, bad, {})
    with pytest.raises(HealthAlarmStop, match=r"^training stopped at step 3 by a health alarm "
                       r"\(trainer.health.stop_on_alarm\): broken_tags 0.500 rose from its start 0.000 "
                       r"\(by more than 0.2\) for 2 steps; no_answer 0.500 rose"):
        stopping.check_stop(3)
    stopping.observe(4, bad, {})
    stopping.check_stop(4)  # the alarm holds, but it was raised at step 3: a resumed run goes on
