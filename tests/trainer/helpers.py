"""Helpers of the end-to-end trainer tests: run the real entry point, tiny-run overrides, metric logs."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main_env(extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the entry point runs in here: offline, quiet, this checkout first (plus ``extra_env``)."""
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH=str(REPO), **(extra_env or {}))


def run_main(overrides: list[str], timeout: int = 600, extra_env: dict[str, str] | None = None,
             **popen) -> subprocess.CompletedProcess:
    """``python -m verl.trainer.main_ppo`` with overrides, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], cwd=REPO,
                          env=main_env(extra_env), capture_output=True, text=True, timeout=timeout, **popen)


def tiny_overrides(model: str, data: dict, url: str, out: Path, algo: str) -> list[str]:
    """A complete, tiny run: 1 rank, short turns, batch of 3 prompts."""
    common = [
        f"actor_rollout_ref.model.path={model}", f"data.train_files={data['train']}", f"data.val_files={data['test']}",
        f"retriever.url={url}", f"trainer.default_local_dir={out}", "trainer.n_gpus_per_node=1",
        "data.train_batch_size=3", "data.val_batch_size=4", "data.max_prompt_length=768", "data.max_start_length=256",
        "data.max_response_length=12", "data.max_obs_length=64", "max_turns=2",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=3", "actor_rollout_ref.actor.ppo_micro_batch_size=3",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size=6", "actor_rollout_ref.ref.log_prob_micro_batch_size=6",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false", "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.actor.fsdp_config.param_offload=false",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false", "actor_rollout_ref.ref.fsdp_config.param_offload=false",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32", "trainer.logger=[console,jsonl]",
        "trainer.val_before_train=false", "trainer.test_freq=-1",
    ]
    if algo == "grpo":
        return common + ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
                         "algorithm.use_kl_in_reward=false", "actor_rollout_ref.actor.use_kl_loss=true"]
    return common + [
        "algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true", "critic.ppo_micro_batch_size=3",
        "critic.optim.lr=1e-3", "critic.optim.lr_warmup_steps_ratio=0.0",
        "critic.model.enable_gradient_checkpointing=false", "critic.model.use_remove_padding=false",
        "critic.model.fsdp_config.param_offload=false",
        "critic.model.fsdp_config.optimizer_offload=false", "critic.model.fsdp_config.mixed_precision=fp32"]


def read_metrics(out: Path) -> list[dict]:
    path = Path(out) / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited early with code {proc.returncode}")
        if time.time() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.2)


def search_r1_script(path: Path, values: dict[str, str]) -> tuple[str, list[str]]:
    """A Search-R1 script's entry module and overrides (``tests/trainer/data/search_r1_scripts/*.args``)
    as its shell would pass them, with ``values`` (``{"$BASE_MODEL": ...}``) substituted."""
    lines = Path(path).read_text().splitlines()
    module = lines[0].rsplit(": ", 1)[1]
    overrides = []
    for line in lines[1:]:
        for name, value in values.items():
            line = line.replace(name, value)
        overrides += shlex.split(line)
    return module, overrides
