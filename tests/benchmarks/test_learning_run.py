"""The learning-run wrapper (benchmarks/learning_run.py): its recipes pass the start-up check, and on CPU
a PPO run goes evaluate -> train -> stop -> resume -> evaluate through the user entry points."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("SEARCH_R1_SHARED_DATA", ROOT.parent / "shared" / "data"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import learning_report  # noqa: E402
import learning_run  # noqa: E402

from verl.trainer.main_ppo import parse_config  # noqa: E402
from verl.trainer.ppo.run_plan import make_run_plan  # noqa: E402


@pytest.mark.parametrize("profile", ["gpu", "cpu"])
@pytest.mark.parametrize("algo", ["grpo", "gae"])
def test_recipes_pass_the_start_up_check(algo, profile, tmp_path):
    """The overrides the wrapper gives train_*.sh and evaluate.sh are valid keys and batch sizes
    (the train scripts' algorithm keys included), so no device call is lost to a typo."""
    args = learning_run.parse_args(["--algo", algo, "--profile", profile, "--work_dir", str(tmp_path)])
    run = learning_run.Run(tmp_path, algo)
    algorithm = {"grpo": ["algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false",
                          "actor_rollout_ref.actor.use_kl_loss=true"],
                 "gae": ["algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true"]}[algo]
    cfg = parse_config([*algorithm, "trainer.n_gpus_per_node=1", *learning_run.train_overrides(args, run)])
    assert cfg.trainer.total_training_steps == 150 and cfg.trainer.save_freq == 10
    assert cfg.trainer.log_dir == str(run.logs) and cfg.reward_model.structure_format_score == 0.2
    evaluation = parse_config([*learning_run.rollout_overrides(args), *learning_run.EVAL[profile]])
    for section, key in (("data", "max_response_length"), ("data", "max_obs_length")):
        assert getattr(getattr(evaluation, section), key) == getattr(getattr(cfg, section), key), key
    assert evaluation.max_turns == cfg.max_turns  # evaluation sees the training's rollout
    assert make_run_plan(evaluation, 1).engine_max_model_len == make_run_plan(cfg, 1).engine_max_model_len


def test_extra_recipes_search_r1pp_and_llds_pass_the_start_up_check(tmp_path):
    """``--recipes`` stacks presets on training and evaluation alike; a recipe's reward replaces
    ``--reward``; the run and its result are named after them. LLDS needs two mini-batches a step."""
    from verl.utils.config import ConfigError

    args = learning_run.parse_args(["--algo", "grpo", "--recipes", "search_r1pp", "--work_dir", str(tmp_path)])
    assert args.label == "grpo+search_r1pp"
    assert learning_run.parse_args(["--algo", "gae", "--warm_start_searches", "2"]).label == "gae+2hop"
    grpo = ["algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false", "actor_rollout_ref.actor.use_kl_loss=true"]
    cfg = parse_config([*grpo, "trainer.n_gpus_per_node=1",
                        *learning_run.train_overrides(args, learning_run.Run(tmp_path, args.label))])
    assert (cfg.algorithm.adv_estimator, cfg.reward_model.style, cfg.prompt.template) == ("reinforce", "f1", "fast")
    assert cfg.reward_model.structure_format_score == 0.0 and cfg.trainer.experiment_name == "learning-grpo+search_r1pp"
    evaluation = parse_config([*learning_run.rollout_overrides(args), *learning_run.EVAL["gpu"]])
    assert evaluation.prompt.template == "fast" and evaluation.reward_model.style == "f1"
    llds = learning_run.parse_args(["--algo", "grpo", "--recipes", "llds", "--work_dir", str(tmp_path)])
    with pytest.raises(ConfigError, match="llds.coef=0.2 has no effect with one update per step"):
        parse_config([*grpo, *learning_run.train_overrides(llds, learning_run.Run(tmp_path, llds.label))])
    halves = learning_run.parse_args(["--algo", "grpo", "--recipes", "llds", "--work_dir", str(tmp_path),
                                      "actor_rollout_ref.actor.ppo_mini_batch_size=32"])
    cfg = parse_config([*grpo, *learning_run.train_overrides(halves, learning_run.Run(tmp_path, halves.label))])
    assert cfg.actor_rollout_ref.actor.llds.coef == 0.2 and cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 32
    # PPO (GAE + critic) with the one-step off-policy recipe: the next device run of issue 33
    ppo = learning_run.parse_args(["--algo", "gae", "--recipes", "one_step_off_policy", "--work_dir", str(tmp_path)])
    cfg = parse_config(["algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true", "trainer.n_gpus_per_node=1",
                        *learning_run.train_overrides(ppo, learning_run.Run(tmp_path, ppo.label))])
    plan = make_run_plan(cfg, 1)
    assert ppo.label == "gae+one_step_off_policy" and cfg.actor_rollout_ref.rollout.staleness == 1
    assert plan.needs_critic and not plan.on_policy_update
    assert plan.rollout_log_probs  # its truncated importance sampling reads the engine's log-probs


def test_gpu_profile_is_the_learning_recipe(tmp_path):
    """The GPU profile's overrides are the learning recipe's YAML (verl/trainer/config/recipe/):
    stacked on the GRPO script's recipe they give the same run as the recipes themselves."""
    args = learning_run.parse_args(["--algo", "grpo", "--profile", "gpu", "--work_dir", str(tmp_path)])
    given = parse_config(["+recipe=search_r1_grpo", *learning_run.TRAIN["gpu"], *learning_run.rollout_overrides(args)])
    stacked = parse_config(["+recipe=search_r1_grpo", "+recipe=learning_gpu", "+recipe=format_reward"])
    assert given == stacked
    assert (stacked.data.train_batch_size, stacked.actor_rollout_ref.rollout.n) == (64, 8)
    assert stacked.actor_rollout_ref.actor.optim.lr == 2e-5 and stacked.data.max_prompt_length == 2048
    # issue 30: its rollout is async, the engine core apart (the faster whole step at its shape)
    assert (stacked.actor_rollout_ref.rollout.mode, stacked.actor_rollout_ref.rollout.engine_process) == ("async", True)
    assert not make_run_plan(stacked, 1).rollout_log_probs  # nothing reads them: vLLM computes none
    # staleness 1 stacked on it: the one-step-off recipe's front end serves the sync loop, which it sets
    lagged = parse_config(["+recipe=search_r1_grpo", "+recipe=learning_gpu", "+recipe=one_step_off_policy"])
    assert (lagged.actor_rollout_ref.rollout.mode, lagged.actor_rollout_ref.rollout.staleness) == ("sync", 1)
    assert lagged.actor_rollout_ref.rollout.frontend_process


def test_training_keeps_the_time_of_the_evaluations_due(tmp_path):
    """The budget a call keeps from training: one measured evaluation time for each evaluation step
    reached and not evaluated, one for the next evaluation step, and the stop grace."""
    args = learning_run.parse_args(["--steps", "150", "--eval_steps", "0,50,100,150", "--save_freq", "10",
                                    "--work_dir", str(tmp_path)])
    run = learning_run.Run(tmp_path, "grpo")
    run.root.mkdir(parents=True)
    assert learning_run.reserved_s(args, run) == 0.0  # no evaluation measured yet
    run.record_eval_seconds(60.0)  # step 0's
    grace = learning_run.STOP_GRACE_S
    assert learning_run.reserved_s(args, run) == 60.0 + grace  # step 50 may be reached
    run.ckpt.mkdir()
    (run.ckpt / "latest_checkpointed_iteration.txt").write_text("50")
    assert learning_run.reserved_s(args, run) == 2 * 60.0 + grace  # step 50 due, step 100 ahead
    run.evaluation(50).parent.mkdir(parents=True)
    run.evaluation(50).write_text("{}")
    run.record_eval_seconds(45.0)  # a shorter one does not lower the estimate
    assert run.eval_seconds() == 60.0 and learning_run.reserved_s(args, run) == 60.0 + grace
    (run.ckpt / "latest_checkpointed_iteration.txt").write_text("150")
    assert learning_run.reserved_s(args, run) == 2 * 60.0 + grace  # steps 100 and 150 due, none ahead


def test_eval_steps_must_be_checkpoints():
    with pytest.raises(SystemExit):
        learning_run.parse_args(["--eval_steps", "0,15", "--save_freq", "10"])


def test_tag_names_a_run_with_extra_overrides(tmp_path):
    """A lever tried through extra overrides gets its own name, so its files sit beside the run
    without it; a tag that cannot name a file is refused."""
    args = learning_run.parse_args(["--algo", "grpo", "--recipes", "one_step_off_policy", "--tag", "mb32",
                                    "--work_dir", str(tmp_path), "actor_rollout_ref.actor.ppo_mini_batch_size=32"])
    assert args.label == "grpo+one_step_off_policy+mb32"
    overrides = learning_run.train_overrides(args, learning_run.Run(tmp_path, args.label))
    cfg = parse_config(["algorithm.adv_estimator=grpo", "trainer.n_gpus_per_node=1", *overrides])
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 32
    assert cfg.trainer.experiment_name == "learning-grpo+one_step_off_policy+mb32"
    with pytest.raises(SystemExit):
        learning_run.parse_args(["--tag", "mb/32"])


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "qa").is_dir(), reason=f"shared data not found at {SHARED}")
def test_ppo_run_stops_resumes_and_evaluates_on_cpu(tmp_path, tiny_qwen_path, learning_data_seed_19, capfd):
    shutil.copytree(learning_data_seed_19, tmp_path / "data")  # learning_data.build(SHARED, ..., seed=19)
    argv = ["--algo", "gae", "--steps", "2", "--eval_steps", "0,2", "--save_freq", "1", "--profile", "cpu",
            "--model", tiny_qwen_path, "--eval_max_per_source", "1", "--work_dir", str(tmp_path / "work"),
            "--out_dir", str(tmp_path / "out"), "--data", str(tmp_path / "data"), "--budget_s", "1500",
            "--min_train_s", "0", "--retriever", "bm25"]
    assert learning_run.main([*argv, "--max_new_steps", "1"]) == 3  # stopped after one checkpointed step
    run = learning_run.Run(tmp_path / "work", "gae")
    assert run.latest_step() == 1 and run.evaluation(0).exists() and not run.evaluation(2).exists()
    first = json.loads((tmp_path / "out" / "learning_gae.json").read_text())
    assert first["algorithm"] == "gae" and first["steps"] == 1 and list(first["evaluations"]) == ["0"]

    assert run.eval_seconds() > 0  # step 0's evaluation, measured and kept in the run state
    measured = run.eval_seconds()

    def expect(seconds: float) -> None:
        run.state.write_text(json.dumps({"eval_s": seconds}) + "\n")

    expect(10 ** 6)  # evaluations that cannot fit in this call: training does not start
    capfd.readouterr()
    assert learning_run.main(argv) == 3
    assert "train: not started: " in capfd.readouterr().out and run.latest_step() == 1

    expect(measured)
    assert learning_run.main(argv) == 0
    assert "resumed from" in capfd.readouterr().out
    result = json.loads((tmp_path / "out" / "learning_gae.json").read_text())
    assert result["steps"] == 2 and sorted(result["evaluations"]) == ["0", "2"]
    table = result["evaluations"]["2"]["table"]
    assert len(table["sources"]) == 7 and table["pooled"]["count"] == 7
    assert "2_vs_0" in result["comparisons"] and result["comparisons"]["2_vs_0"]["sources"]["nq"]["paired"]
    assert [row["step"] for row in result["curves"]] == [1, 2] and "critic/score/mean" in result["curves"][0]
    assert "update_critic" in result["step_time_s"] and len(result["calls"]) == 3
    assert result["calls"][2]["steps"] == [1, 2] and "train_ppo.sh" in result["train_command"]
    assert not run.export(1).parent.exists() and run.export(2).exists()  # pruned: only the latest stays
    assert (tmp_path / "out" / "learning_gae.png").stat().st_size > 0
    text = learning_report.report([str(tmp_path / "out" / "learning_gae.json")])
    assert "Step 2:" in text and "| **average** |" in text

    run.evaluation(2).unlink()  # a result lost: step 2 is due again, but cannot fit in this call
    expect(10 ** 6)
    assert learning_run.main(argv) == 3
    out = capfd.readouterr().out
    assert "evaluate step 2: not run: it takes ~1000000 s and " in out and "the next call runs it first" in out


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "qa").is_dir(), reason=f"shared data not found at {SHARED}")
def test_run_evaluates_inside_training_on_cpu(tmp_path, tiny_qwen_path, learning_data_seed_19, capfd):
    """--eval_in_trainer: the trainer validates at the evaluation steps (before training, then every
    gcd of them) and the run's tables come from its per-question dumps: no evaluate.sh process. A
    call whose time runs out (here ``trainer.max_time_s=1``) ends training at a validated step, which
    the JSON reports; the next call goes on from it."""
    import pyarrow.parquet as pq

    shutil.copytree(learning_data_seed_19, tmp_path / "data")  # learning_data.build(SHARED, ..., seed=19)
    test = pq.read_table(tmp_path / "data" / "test.parquet")
    sources = test.column("data_source").to_pylist()
    pq.write_table(test.take([sources.index(s) for s in dict.fromkeys(sources)]), tmp_path / "data" / "test.parquet")
    argv = ["--algo", "gae", "--steps", "2", "--eval_steps", "0,2", "--save_freq", "1", "--profile", "cpu",
            "--model", tiny_qwen_path, "--eval_in_trainer", "--work_dir", str(tmp_path / "work"),
            "--out_dir", str(tmp_path / "out"), "--data", str(tmp_path / "data"), "--budget_s", "1500",
            "--min_train_s", "0", "--retriever", "bm25"]
    assert learning_run.main([*argv, "trainer.max_time_s=1"]) == 3
    out = capfd.readouterr().out
    assert "trainer.max_time_s: step 1 of 2 is the last" in out
    assert "evaluate step 0: the trainer's validation (7 questions)" in out
    assert "evaluate step 1: the trainer's validation (7 questions)" in out
    result = json.loads((tmp_path / "out" / "learning_gae.json").read_text())
    assert result["steps"] == 1 and sorted(result["evaluations"]) == ["0", "1"] and result["goal"]["final_step"] == 1
    assert learning_run.main(argv) == 0
    out = capfd.readouterr().out
    assert "evaluate.sh" not in out and "resumed from" in out
    assert "evaluate step 2: the trainer's validation (7 questions)" in out
    run = learning_run.Run(tmp_path / "work", "gae")
    assert sorted(p.name for p in run.validations.glob("*.jsonl")) == ["0.jsonl", "1.jsonl", "2.jsonl"]
    result = json.loads((tmp_path / "out" / "learning_gae.json").read_text())
    assert result["steps"] == 2 and sorted(result["evaluations"], key=int) == ["0", "1", "2"]
    assert result["evaluations"]["2"]["table"]["pooled"]["count"] == 7 and "2_vs_0" in result["comparisons"]
    # what a device poll sends back (benchmarks/device/learning_run.sh) rebuilds the same tables
    import gzip
    import tarfile

    returned = tmp_path / "returned"
    returned.mkdir()
    (returned / "metrics_gae.jsonl.gz").write_bytes(gzip.compress((run.logs / "metrics.jsonl").read_bytes()))
    with tarfile.open(returned / "val_gae.tgz", "w:gz") as tar:
        tar.add(run.validations, arcname="val")
    # the run's log names the machine it ran on: the rebuilt JSON reports that one, not this
    line = [x for x in out.splitlines() if x.startswith(learning_run.PROVENANCE_LINE)][-1]
    device = {**json.loads(line[len(learning_run.PROVENANCE_LINE):]), "machine": {"gpu": "the device's"}}
    (returned / "run.log.txt").write_text(f"noise\n{learning_run.PROVENANCE_LINE}{json.dumps(device)}\nstep:2\n")
    assert learning_run.main([*argv, "--out_dir", str(tmp_path / "rebuilt"), "--returned", str(returned)]) == 0
    rebuilt = json.loads((tmp_path / "rebuilt" / "learning_gae.json").read_text())
    assert rebuilt["machine"] == {"gpu": "the device's"} and rebuilt["host_probe_ms"] == device["host_probe_ms"] > 0
    assert rebuilt["status"].startswith("partial: rebuilt from metrics_gae.jsonl.gz and val_gae.tgz")
    assert rebuilt["steps"] == rebuilt["steps_seen"] == 2
    assert {s: e["table"] for s, e in rebuilt["evaluations"].items()} == \
        {s: e["table"] for s, e in result["evaluations"].items()}
    with pytest.raises(FileNotFoundError, match="no metrics_grpo.jsonl.gz"):
        learning_run.main(["--algo", "grpo", "--returned", str(returned)])


def test_side_by_side_pairs_common_steps_and_each_runs_last_evaluation():
    """--report_json (issue 29's recipes_learning.json) on two committed device runs that ended a step
    apart (GRPO at 100, GRPO + LLDS at 99 when its time ran out): steps both evaluated are paired as
    they are, and ``final`` pairs each run's last evaluation, naming both steps."""
    results = ROOT / "benchmarks" / "results"
    paths = [str(results / "learning_grpo.json"), str(results / "learning_grpo+llds.json")]
    out = learning_report.side_by_side(paths)
    assert out["against"] == "grpo" and sorted(out["runs"]) == ["grpo", "grpo+llds"]
    pairs = out["comparisons"]["grpo+llds"]
    assert sorted(pairs) == ["0", "50", "final"] and pairs["final"]["steps"] == [100, 99]
    first, second = (json.loads(Path(p).read_text())["evaluations"] for p in paths)
    assert pairs["final"]["a"] == pytest.approx(first["100"]["table"]["average"]["em"])
    assert pairs["final"]["b"] == pytest.approx(second["99"]["table"]["average"]["em"])
    assert pairs["final"]["diff"] == pytest.approx(pairs["final"]["b"] - pairs["final"]["a"])
    low, high = pairs["final"]["diff_ci"]
    assert low <= pairs["final"]["diff"] <= high
