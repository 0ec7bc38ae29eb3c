"""Configuration mistakes fail at start, naming the key, before any model is loaded."""

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from verl.trainer.ppo.config_check import check_config, load_default_config


def _run_main(*overrides: str) -> subprocess.CompletedProcess:
    # A model path that does not exist proves the failure comes before any model loading.
    return subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo",
                           "actor_rollout_ref.model.path=/nonexistent/model", *overrides],
                          capture_output=True, text=True, timeout=120)


def test_defaults_pass_checks():
    check_config(load_default_config())


def test_wrong_type_named_from_command_line():
    result = _run_main("trainer.total_epochs=abc")
    assert result.returncode != 0
    assert "trainer.total_epochs: expected int, got str 'abc'" in result.stderr


def test_unknown_key_named_from_command_line():
    result = _run_main("trainer.total_epoch=3")
    assert result.returncode != 0
    assert "total_epoch" in result.stderr


def test_batch_arithmetic_names_numbers_from_command_line():
    result = _run_main("data.train_batch_size=100")
    assert result.returncode != 0
    assert "data.train_batch_size (100) is not divisible by actor.ppo_mini_batch_size (256)" in result.stderr


@pytest.mark.parametrize("overrides, message", [
    ({"actor_rollout_ref": {"actor": {"ppo_micro_batch_size": 12}}},
     "actor.ppo_micro_batch_size (12) is not divisible by data-parallel size (nnodes x n_gpus_per_node) (8)"),
    ({"actor_rollout_ref": {"actor": {"ppo_micro_batch_size": 48}}},
     "actor.ppo_mini_batch_size x rollout.n rows (256 x 1) (256) is not divisible by actor.ppo_micro_batch_size (48)"),
    ({"critic": {"ppo_micro_batch_size": 3}}, "critic.ppo_micro_batch_size (3) is not divisible by data-parallel size (nnodes x n_gpus_per_node) (8)"),
    ({"algorithm": {"adv_estimator": "grpo"}}, "algorithm.adv_estimator=grpo needs groups"),
    ({"actor_rollout_ref": {"rollout": {"name": "sglang"}}}, "actor_rollout_ref.rollout.name='sglang'"),
    ({"actor_rollout_ref": {"rollout": {"temperature": "hot"}}},
     "actor_rollout_ref.rollout.temperature: expected float, got str 'hot'"),
    ({"trainer": {"resume_mode": "/no/such/checkpoint"}}, "trainer.resume_mode='/no/such/checkpoint'"),
])
def test_check_config_names_culprit(overrides, message):
    cfg = OmegaConf.merge(load_default_config(), overrides)
    with pytest.raises(ValueError) as error:
        check_config(cfg)
    assert message in str(error.value)


def test_per_gpu_micro_batch_checked_against_rows():
    cfg = OmegaConf.merge(load_default_config(), {"actor_rollout_ref": {"actor": {"ppo_micro_batch_size_per_gpu": 5}}})
    with pytest.raises(ValueError, match=r"actor.ppo_micro_batch_size_per_gpu x data-parallel size \(5 x 8\) \(40\)"):
        check_config(cfg)


def test_int_accepted_for_float_and_null_default_accepts_anything():
    cfg = OmegaConf.merge(load_default_config(), {"actor_rollout_ref": {"actor": {"optim": {"lr": 1}}},
                                                  "data": {"train_data_num": 100}})
    check_config(cfg)


@pytest.mark.parametrize("lora", [{"lora_rank": 16, "lora_alpha": 32},
                                  {"lora_rank": 8, "target_modules": ["q_proj", "v_proj"]}])
def test_lora_keys_are_part_of_the_rl_config(lora):
    config = OmegaConf.merge(load_default_config(), {"actor_rollout_ref": {"model": lora}})
    check_config(config)
    assert config.actor_rollout_ref.model.lora_rank == lora["lora_rank"]
