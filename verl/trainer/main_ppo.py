"""Entry point of PPO/GRPO training: ``python -m verl.trainer.main_ppo key=value ...``.

The overrides are Hydra's grammar over ``config/ppo_trainer.yaml`` (:mod:`verl.trainer.overrides`);
:func:`verl.trainer.ppo.config.load_config` names an unknown key, a wrong type or a bad combination
in one line, before Ray starts or any model is loaded (exit status 2).
"""

from __future__ import annotations

import sys
from typing import Sequence

from verl.trainer.overrides import compose
from verl.trainer.ppo.config import PPOConfig, load_config
from verl.utils.config import ConfigError


def parse_config(overrides: Sequence[str], config_name: str = "ppo_trainer") -> PPOConfig:
    """Compose ``config/<config_name>.yaml`` with command-line ``overrides`` and type it.

    Raises:
        ConfigError: a malformed override, an unknown key, a wrong type or a bad combination.
    """
    return load_config(compose(config_name, overrides))


def run_ppo(config: PPOConfig) -> dict:
    """Build the trainer and train (or only validate). Returns the last metrics."""
    from verl.trainer.ppo.trainer_setup import build_trainer

    trainer = build_trainer(config)
    try:
        return trainer.fit()
    finally:
        trainer.shutdown()


def main(argv: Sequence[str] | None = None, defaults: Sequence[str] = ()) -> None:
    """Parse ``defaults`` then ``argv`` (later overrides win), check, and train."""
    overrides = [*defaults, *(sys.argv[1:] if argv is None else argv)]
    try:
        config = parse_config(overrides)
    except ConfigError as error:
        # The message names the culprit key; a traceback would only hide it.
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    run_ppo(config)


if __name__ == "__main__":
    main()
