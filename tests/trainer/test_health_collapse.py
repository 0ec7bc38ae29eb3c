"""Provoked collapse: the health alarm fires steps before the validation score falls.

A tiny model warm-started to answer the test questions (a small byte-level BPE tokenizer keeps it
cheap), then GRPO through the real entry point (local backend, transformers engine) on a reward
that pays for broken trajectories (``tests/trainer/collapse_env.py``): the sampled training
responses break first, and the health signals with them; greedy validation holds its answers
until the policy has moved far enough. The alarm must come first. ``trainer.keep_best`` keeps the
checkpoint of the best validation, from before the fall.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from verl.trainer.ppo import checkpointing

from .conftest import CORPUS, QA
from .helpers import read_metrics, run_main

pytestmark = pytest.mark.slow

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def small_tokenizer(folder: Path) -> str:
    """A 600-id byte-level BPE (every text encodable) trained on the prompts, passages and answers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from search_r1.envs.search_r1.prompts import INVALID_ACTION_MESSAGE, TEMPLATES

    texts = [*TEMPLATES.values(), INVALID_ACTION_MESSAGE, *CORPUS, *(q for q, _ in QA), *(a for _, g in QA for a in g),
             "<think> </think> <search> </search> <answer> </answer> <information> </information> Doc 1(Title: "]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIAL,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return str(folder)


def warm_start(folder: Path, tokenizer_dir: str, steps: int = 120, lr: float = 3e-3) -> str:
    """The tiny model trained to answer every QA question with ``<answer> gold </answer>`` + EOS."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.save_random_model import build_tiny_causal_lm
    from search_r1.envs.search_r1.prompts import make_prefix
    from verl.utils.dataset.rl_dataset import render_prompt

    path = build_tiny_causal_lm(folder, tokenizer_dir=tokenizer_dir)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rows = []
    for question, golds in QA:
        prompt = tokenizer(render_prompt(tokenizer, [{"role": "user", "content": make_prefix(question)}]),
                           add_special_tokens=False)["input_ids"]
        target = tokenizer(f"<answer> {golds[0]} </answer>", add_special_tokens=False)["input_ids"]
        rows.append((prompt, target + [tokenizer.eos_token_id]))
    width = max(len(p) + len(t) for p, t in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for row, (prompt, target) in enumerate(rows):
        ids[row, :len(prompt) + len(target)] = torch.tensor(prompt + target)
        labels[row, len(prompt):len(prompt) + len(target)] = torch.tensor(target)
    attention = (labels != -100) | (torch.arange(width) < torch.tensor([len(p) for p, _ in rows])[:, None])
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    torch.manual_seed(0)
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=attention.long(), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05, f"the warm start did not learn the answers (loss {loss.item():.3f})"
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def answering_model(tmp_path_factory) -> str:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 2-layer model: more threads only contend on a shared machine
    try:
        root = tmp_path_factory.mktemp("collapse")
        return warm_start(root / "model", small_tokenizer(root / "tokenizer"))
    finally:
        torch.set_num_threads(threads)


def collapse_overrides(model: str, data: dict, out: Path, steps: int) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model}", f"data.train_files={data['train']}", f"data.val_files={data['test']}",
        f"trainer.default_local_dir={out}", "env.module=tests.trainer.collapse_env", "env.name=search_r1_broken_reward",
        "do_search=false", "trainer.backend=local", "trainer.n_gpus_per_node=1", "trainer.logger=[console,jsonl]",
        f"trainer.total_training_steps={steps}", "trainer.save_freq=-1", "trainer.test_freq=1",
        "trainer.val_before_train=true", "trainer.health.baseline_steps=1", "trainer.health.patience=1",
        "trainer.keep_best=val/test_em/all", "trainer.export_hf=false",
        "data.train_batch_size=3", "data.val_batch_size=4", "data.max_prompt_length=512", "data.max_start_length=256",
        "data.max_response_length=24", "data.max_obs_length=32", "max_turns=1",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.n=4",
        # sampling hot enough that a few responses break from the start (the reward has something to pay)
        "actor_rollout_ref.rollout.temperature=1.4", "actor_rollout_ref.rollout.top_p=1.0",
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false", "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.actor.ppo_mini_batch_size=3",
        "actor_rollout_ref.actor.ppo_micro_batch_size=12", "actor_rollout_ref.rollout.log_prob_micro_batch_size=12",
        "actor_rollout_ref.actor.optim.lr=5e-4", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false", "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.actor.fsdp_config.param_offload=false", "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32"]


def first_step(rows: list[dict], holds) -> int | None:
    return next((row["step"] for row in rows if holds(row)), None)


def test_health_alarm_fires_before_the_validation_em_falls(answering_model, qa_parquet, tmp_path):
    out = tmp_path / "run"
    result = run_main(collapse_overrides(answering_model, qa_parquet, out, steps=12), timeout=1200,
                      extra_env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + "\n" + result.stderr[-5000:]
    rows = read_metrics(out)
    start = next(row["val/test_em/all"] for row in rows if row["step"] == 0)
    assert start >= 0.75, f"the warm start answers only {start:.2f} of the validation questions"
    alarm = first_step(rows, lambda row: row.get("health/alarm") == 1.0)
    first_drop = first_step(rows, lambda row: row["step"] > 0 and row.get("val/test_em/all", start) < start)
    fall = first_step(rows, lambda row: row["step"] > 0 and row.get("val/test_em/all", start) <= start - 0.5)
    timeline = [(row["step"], row.get("health/broken_tags"), row.get("health/no_answer"),
                 row.get("health/lld/pos_logprob"), row.get("val/test_em/all")) for row in rows]
    assert alarm is not None and fall is not None, timeline
    # the collapse's pace follows the host's float rounding (sampling at temperature 1.4): at lr 2e-4 one
    # host collapsed by step 8 and another not in 12 steps; on the latter, with patience 1 (a provoked
    # collapse has no healthy phase to guard against false alarms), the alarm came 2 steps before the
    # first lost question at 5e-4 and with it at 3e-4 (docs/recipes.md)
    assert alarm <= first_drop and alarm < fall, timeline
    warning = next(line for line in result.stdout.splitlines() if line.startswith("WARNING health alarm at step"))
    assert f"at step {alarm}:" in warning
    assert any(name in warning for name in ("broken_tags", "no_answer", "lld/pos_logprob", "think_"))
    summary = result.stdout[result.stdout.index("training done"):]
    assert "health:       alarm at step" in summary
    # keep_best: the best validation (the first step's, before the collapse) is the checkpoint kept
    best = checkpointing.read_best(out)
    assert best is not None and best["value"] == max(row.get("val/test_em/all", 0) for row in rows if row["step"] > 0)
    assert best["step"] < fall and f"best:         {checkpointing.step_dir(out, best['step'])}" in summary
    assert "the run went on to step 12 without saving" in summary  # save_freq=-1: the best is the latest


def test_stop_on_alarm_ends_the_run_at_the_alarm_without_its_checkpoint(answering_model, qa_parquet, tmp_path):
    """``trainer.health.stop_on_alarm``: the same provoked collapse ends at the alarm's step, in one
    line naming the alarm and the latest checkpoint, which is the step before (the alarm's step is
    logged, not saved)."""
    out = tmp_path / "run"
    overrides = collapse_overrides(answering_model, qa_parquet, out, steps=12) + [
        "trainer.health.stop_on_alarm=true", "trainer.save_freq=1", "trainer.test_freq=-1", "trainer.val_before_train=false",
        "trainer.keep_best=null"]
    result = run_main(overrides, timeout=1200, extra_env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 1, result.stdout[-3000:] + "\n" + result.stderr[-5000:]
    rows = read_metrics(out)
    alarm = rows[-1]["step"]
    assert rows[-1]["health/alarm"] == 1.0 and all(row.get("health/alarm") == 0.0 for row in rows[:-1])
    assert 1 < alarm < 12
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"error: training stopped at step {alarm} by a health alarm "
                                "(trainer.health.stop_on_alarm): "), last_line
    assert f"the latest checkpoint is {checkpointing.step_dir(out, alarm - 1)}" in last_line
    assert checkpointing.find_latest(out) == checkpointing.step_dir(out, alarm - 1)
    assert not checkpointing.step_dir(out, alarm).exists()
    assert "Traceback" not in result.stderr
