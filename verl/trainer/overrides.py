"""Command-line overrides of the trainers: Hydra's grammar over a YAML in ``verl/trainer/config``.

``key=value`` and Search-R1's ``+key=value`` both set a key whether or not the YAML declares it:
whether it exists is the typed schema's question, which names an unknown key in one line
(:func:`verl.utils.config.to_typed`), instead of Hydra's struct error or its "already at" refusal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig

from verl.utils.config import ConfigError

CONFIG_DIR = Path(__file__).resolve().parent / "config"


def _as_set(override: str) -> str:
    """``key=v`` / ``+key=v`` -> ``++key=v`` (set or add); deletions (``~key``) pass unchanged."""
    if override.startswith(("~", "++")) or "=" not in override:
        return override
    return "++" + override.lstrip("+")


def compose(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """``config/<config_name>.yaml`` with ``overrides`` applied (not yet typed).

    Raises:
        ConfigError: a malformed override, with Hydra's message.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return hydra_compose(config_name=config_name, overrides=[_as_set(o) for o in overrides])
    except (HydraException, OmegaConfBaseException) as error:
        raise ConfigError(str(error).strip().splitlines()[0]) from None
