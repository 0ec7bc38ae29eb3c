"""The real entry point end to end: PPO and GRPO steps through Ray, resume equivalence, val_only.

A tiny random-init Qwen2 model with the real Qwen tokenizer, a real BM25 retrieval server on
127.0.0.1, real FSDP workers (gloo), the transformers rollout engine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import straight_run_overrides
from .helpers import REPO, read_metrics, run_main, tiny_overrides, wait_for

pytestmark = pytest.mark.slow

NONDETERMINISTIC = ("timing_s/", "perf/")


def _check_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + "\n" + result.stderr[-5000:]


def _hf_state(folder: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()


@pytest.mark.parametrize("algo,engine", [("ppo", "hf"), ("grpo", "vllm")])
def test_full_step_through_ray(algo, engine, tiny_qwen_path, qa_parquet, retriever_url, tmp_path):
    """One step through Ray; GRPO runs the real vLLM CPU engine colocated in the actor worker
    (generation with the async loop there, then the weight push after the update)."""
    out = tmp_path / "run"
    overrides = tiny_overrides(tiny_qwen_path, qa_parquet, retriever_url, out, algo) + [
        f"actor_rollout_ref.rollout.name={engine}", "trainer.backend=ray", "trainer.total_training_steps=1", "trainer.save_freq=1", "trainer.test_freq=1",
        f"trainer.validation_data_dir={tmp_path / 'val'}"]
    if engine == "vllm":
        overrides += ["actor_rollout_ref.rollout.mode=async", "retriever.max_concurrency=2"]
    result = run_main(overrides)
    _check_ok(result)
    metrics = read_metrics(out)[-1]
    assert metrics["step"] == 1
    summary = result.stdout[result.stdout.index("training done"):]  # the run's closing lines
    assert summary.startswith("training done: global step 1 of 1; last critic/score/mean")
    assert f"checkpoint:   {out / 'global_step_1'}" in summary
    assert f"HF export:    {out / 'global_step_1' / 'huggingface'}" in summary
    assert f"metrics:      {out / 'logs' / 'metrics.jsonl'}" in summary
    for key in ("critic/score/mean", "critic/rewards/mean", "critic/advantages/mean", "actor/pg_loss",
                "actor/grad_norm", "response_length/mean", "response_length/clip_ratio", "env/number_of_actions/mean",
                "env/finish_ratio", "timing_s/gen", "timing_s/update_actor", "perf/throughput_tokens_per_s",
                "perf/mfu/actor", "val/test_score/nq"):
        assert key in metrics, key
    if algo == "ppo":
        assert "critic/values/mean" in metrics and "timing_s/update_critic" in metrics
        # the fresh value head starts at zero (step 1's values come before any critic update)
        assert metrics["critic/values/max"] == metrics["critic/values/min"] == 0.0
        assert "actor/reward_kl_penalty" in metrics
        assert (out / "global_step_1" / "critic").is_dir()
    else:
        assert "critic/values/mean" not in metrics and not (out / "global_step_1" / "critic").exists()
        assert "actor/kl_loss" in metrics
        # the async loop ran in the worker (its environment sent without the tokenizer and bound
        # there) and reported its own time beside its engine calls' (values are the benchmarks' business)
        assert {"timing_s/gen_engine", "timing_s/gen_loop"} <= set(metrics)
    assert (out / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert sum(1 for _ in open(tmp_path / "val" / "1.jsonl")) == 4
    assert "at step 1" in (tmp_path / "val" / "1.html").read_text()  # the dump's trajectory report
    exported = _hf_state(out / "global_step_1" / "huggingface")
    initial = _hf_state(Path(tiny_qwen_path))
    assert any(not torch.equal(exported[k], initial[k]) for k in initial), "the actor update changed nothing"


def _comparable(rows: list[dict]) -> dict[int, dict]:
    return {row["step"]: {k: v for k, v in row.items() if not k.startswith(NONDETERMINISTIC)} for row in rows}


def test_resume_after_kill_equals_straight_run(straight_run, tiny_qwen_path, qa_parquet, retriever_url, tmp_path):
    """4 straight steps (the session's ``straight_run``) == 2 steps, SIGKILL, resume_mode=auto, 2 more.
    6 rows / batch 3: the resume point is exactly an epoch boundary and the run crosses it."""
    _, straight = straight_run
    base = straight_run_overrides(tiny_qwen_path, qa_parquet, retriever_url, tmp_path)
    resumed = tmp_path / "resumed"

    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *base,
                             f"trainer.default_local_dir={resumed}"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pointer = resumed / "latest_checkpointed_iteration.txt"
    try:
        wait_for(lambda: pointer.exists() and pointer.read_text() == "2", timeout=600, proc=proc)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    result = run_main(base + [f"trainer.default_local_dir={resumed}", "trainer.resume_mode=auto"])
    _check_ok(result)
    assert "resumed from" in result.stdout and "global step 2" in result.stdout

    a, b = _hf_state(straight / "global_step_4" / "huggingface"), _hf_state(resumed / "global_step_4" / "huggingface")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    straight_rows, resumed_rows = _comparable(read_metrics(straight)), _comparable(read_metrics(resumed))
    for step in (3, 4):
        assert resumed_rows[step] == straight_rows[step], f"step {step} differs after resume"

    # val_only evaluates the chosen checkpoint and exits without training.
    result = run_main(base + [f"trainer.default_local_dir={resumed}", "trainer.val_only=true",
                              f"trainer.resume_mode={resumed / 'global_step_4'}"])
    _check_ok(result)
    last = read_metrics(resumed)[-1]
    assert last["step"] == 4 and "val/test_score/nq" in last and "critic/score/mean" not in last


def test_tool_call_environment_trains_through_the_entry_point(tiny_qwen_path, qa_parquet, retriever_url, tmp_path):
    """``env.name=tool_call``: the same entry point, data and retriever; the prompts are the chat
    template's with the search tool, the rollout stops at ``</tool_call>``, the reward is EM."""
    out = tmp_path / "run"
    overrides = tiny_overrides(tiny_qwen_path, qa_parquet, retriever_url, out, "grpo") + [
        "env.name=tool_call", "trainer.backend=local", "trainer.total_training_steps=1", "trainer.save_freq=-1",
        "trainer.test_freq=1", "data.max_start_length=640", "data.max_prompt_length=1024",
        f"trainer.validation_data_dir={tmp_path / 'val'}"]
    result = run_main(overrides)
    _check_ok(result)
    metrics = read_metrics(out)[-1]
    assert metrics["step"] == 1 and "reward_extra/em" in metrics and "env/number_of_valid_search" in metrics
    records = [__import__("json").loads(line) for line in open(tmp_path / "val" / "1.jsonl")]
    assert len(records) == 4 and all('"name": "search"' in r["input"] for r in records)  # the tool in the prompt
    assert not (tmp_path / "val" / "1.html").exists()  # tool_call has no trajectory report


def test_max_time_ends_at_a_validated_checkpoint(tiny_qwen_path, qa_parquet, retriever_url, tmp_path):
    """``trainer.max_time_s`` shorter than the process start-up: step 1 becomes the last of 3, with its
    validation and checkpoint although neither frequency falls on it, and the run exits 0 (the next
    one resumes from that checkpoint as from any: test_resume_after_kill_equals_straight_run)."""
    out, dumps = tmp_path / "run", tmp_path / "val"
    result = run_main(tiny_overrides(tiny_qwen_path, qa_parquet, retriever_url, out, "grpo") + [
        "trainer.backend=local", "trainer.save_freq=10", "trainer.test_freq=10", "trainer.export_hf=false",
        f"trainer.validation_data_dir={dumps}", "trainer.total_training_steps=3", "trainer.max_time_s=1"])
    _check_ok(result)
    assert "trainer.max_time_s: step 1 of 3 is the last" in result.stdout
    assert (out / "latest_checkpointed_iteration.txt").read_text() == "1" and (dumps / "1.jsonl").exists()
    assert "val/test_score/nq" in read_metrics(out)[-1] and read_metrics(out)[-1]["step"] == 1
