"""Hydra entry point of PPO/GRPO training: ``python -m verl.trainer.main_ppo key=value ...``.

The configuration is checked (types against ``config/ppo_trainer.yaml``, batch-size arithmetic,
algorithm choices) before Ray starts or any model is loaded, so a typo fails in seconds with the
key's name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from verl.trainer.ppo.config_check import check_config, needs_critic, rollout_n
from verl.trainer.ppo.run_summary import closing_summary
from verl.utils.model_path import check_model_path


def run_ppo(cfg: DictConfig) -> dict:
    """Build the trainer and train (or only validate) on a checked config, then print where the
    outputs are (:func:`closing_summary`). Returns the last metrics."""
    OmegaConf.resolve(cfg)
    with open_dict(cfg):
        # Workers read rollout.n; Search-R1 scripts set n_agent instead.
        cfg.actor_rollout_ref.rollout.n = rollout_n(cfg)
    from verl.trainer.ppo.trainer_setup import build_trainer

    trainer = build_trainer(cfg)
    try:
        metrics = trainer.fit()
    finally:
        trainer.shutdown()
    print("\n" + closing_summary(cfg, trainer.global_step, trainer.total_steps, metrics), flush=True)
    return metrics


def check_paths(cfg: DictConfig) -> None:
    """The models the run loads exist (a folder, or a hub id that can be fetched), and so do its
    data files; ValueError naming the key otherwise. Runs after :func:`check_config`, before Ray or
    any model starts."""
    check_model_path(cfg.actor_rollout_ref.model.path, "actor_rollout_ref.model.path")
    if cfg.data.tokenizer:
        check_model_path(cfg.data.tokenizer, "data.tokenizer")
    if needs_critic(cfg):
        check_model_path(cfg.critic.model.path, "critic.model.path")
    for key in ("train_files", "val_files"):
        files = cfg.data[key]
        for path in [files] if isinstance(files, str) else list(files):
            if not Path(path).expanduser().is_file():
                raise ValueError(f"data.{key}={path}: no such file; write the parquet files with "
                                 f"scripts/data_process/ (README, Data) or point data.{key} at them")


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        check_config(cfg)
        check_paths(cfg)
    except ValueError as error:
        # The message names the culprit key; a traceback would only hide it.
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    run_ppo(cfg)


if __name__ == "__main__":
    main()
