"""Entry point of PPO/GRPO training: ``python -m verl.trainer.main_ppo key=value ...``.

The overrides are Hydra's grammar over ``config/ppo_trainer.yaml`` (:mod:`verl.trainer.overrides`);
:func:`verl.trainer.ppo.config.load_config` names an unknown key, a wrong type or a bad combination
in one line, before Ray starts or any model is loaded (exit status 2); so do a model path that is
no model folder and a missing data file (:func:`check_paths`). A finished run ends with where its
outputs are (:func:`verl.trainer.ppo.run_summary.closing_summary`); a run stopped by SIGINT/SIGTERM,
by Ray's memory monitor or by the loss of a node ends with one line saying so
(:mod:`verl.trainer.run_exit`). ``trainer.dry_run=true`` stops before the workers start, after
printing the run plan and the placement of its ranks (:mod:`verl.trainer.ppo.placement`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from verl.trainer.overrides import compose
from verl.trainer.ppo.config import PPOConfig, environment_of, load_config
from verl.trainer.ppo.config_check import needs_critic
from verl.trainer.ppo.run_summary import closing_summary
from verl.trainer.run_exit import run_or_exit
from verl.utils.config import ConfigError
from verl.utils.model_path import check_model_path


def parse_config(overrides: Sequence[str], config_name: str = "ppo_trainer") -> PPOConfig:
    """Compose ``config/<config_name>.yaml`` with command-line ``overrides`` and type it.

    Raises:
        ConfigError: a malformed override, an unknown key, a wrong type or a bad combination.
    """
    return load_config(compose(config_name, overrides))


def run_ppo(config: PPOConfig) -> dict:
    """Build the trainer and train (or only validate; or, with ``trainer.dry_run``, only plan). Returns
    the last metrics."""
    from verl.trainer.ppo.trainer_setup import build_trainer, dry_run

    if config.trainer.dry_run:
        dry_run(config)
        return {}
    trainer = build_trainer(config)
    try:
        metrics = trainer.fit()
    finally:
        trainer.shutdown()
    print("\n" + closing_summary(config, trainer.global_step, trainer.total_steps, metrics, trainer.health.summary()),
          flush=True)
    return metrics


def check_models(config: PPOConfig) -> None:
    """The models the run loads exist (a folder, or a hub id that can be fetched).

    Raises:
        ValueError: naming the key and its value.
    """
    check_model_path(config.actor_rollout_ref.model.path, "actor_rollout_ref.model.path")
    if config.data.tokenizer:
        check_model_path(config.data.tokenizer, "data.tokenizer")
    if needs_critic(config):
        check_model_path(config.critic.model.path, "critic.model.path")


def check_data_files(config: PPOConfig) -> None:
    """``data.train_files`` and ``data.val_files`` exist.

    Raises:
        ValueError: naming the key and the missing file.
    """
    for key in ("train_files", "val_files"):
        files = getattr(config.data, key)
        for path in [files] if isinstance(files, str) else list(files):
            if not Path(path).expanduser().is_file():
                raise ValueError(f"data.{key}={path}: no such file; point data.{key} at a parquet or JSONL "
                                 f"file (README, Data; scripts/data_process/ writes Search-R1's parquet rows)")


def check_paths(config: PPOConfig) -> None:
    """The models and data files exist, and the environment's tools answer (Search-R1's: a retriever
    at ``retriever.url`` when the run searches).

    Raises:
        ValueError: naming the key and its value.
    """
    check_models(config)
    check_data_files(config)
    environment_of(config).check_ready(config)


def main(argv: Sequence[str] | None = None, defaults: Sequence[str] = ()) -> None:
    """Parse ``defaults`` then ``argv`` (later overrides win), check, and train."""
    overrides = [*defaults, *(sys.argv[1:] if argv is None else argv)]
    try:
        config = parse_config(overrides)
        check_paths(config)
    except ValueError as error:  # ConfigError is a ValueError
        # The message names the culprit key; a traceback would only hide it.
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    try:
        run_or_exit(lambda: run_ppo(config), stopped=lambda: after_stop(config))
    except ConfigError as error:  # raised while loading the data, before any worker starts
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def after_stop(config: PPOConfig) -> str:
    """The rest of the line a stopped run ends with: what was shut down and where to resume from."""
    from verl.trainer.ppo.checkpointing import find_latest

    latest = find_latest(config.trainer.default_local_dir)
    where = (f"the latest checkpoint is {latest} (the same command resumes from it)" if latest is not None
             else "no checkpoint was written")
    return f": workers and Ray shut down; {where}"


if __name__ == "__main__":
    main()
