"""Command-line overrides of the trainers: Hydra's grammar over a YAML in ``verl/trainer/config``.

``key=value`` and Search-R1's ``+key=value`` both set a key whether or not the YAML declares it:
whether it exists is the typed schema's question, which names an unknown key in one line
(:func:`verl.utils.config.to_typed`), instead of Hydra's struct error or its "already at" refusal.

``+recipe=NAME`` (or ``recipe=[A,B]``) applies presets from ``config/recipe/``: a recipe sets a
group of keys (Search-R1's PPO/GRPO scripts, the embedded CPU default, the learning recipe), later
recipes win over earlier ones and ``key=value`` overrides win over every recipe. Recipe overrides
given several times (a script's own and the user's) stack in the order given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig

from verl.utils.config import ConfigError

CONFIG_DIR = Path(__file__).resolve().parent / "config"
RECIPE_GROUP = "recipe"


def recipes_of(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(recipe names in order, the other overrides)`` of a command line."""
    names, rest = [], []
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        if key != RECIPE_GROUP:
            rest.append(override)
            continue
        value = value.strip()
        names += [v.strip() for v in value.strip("[]").split(",") if v.strip()] if value.startswith("[") else [value]
    return names, rest


def _as_set(override: str) -> str:
    """``key=v`` / ``+key=v`` -> ``++key=v`` (set or add); deletions (``~key``) pass unchanged."""
    if override.startswith(("~", "++")) or "=" not in override:
        return override
    return "++" + override.lstrip("+")


def compose(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """``config/<config_name>.yaml`` with ``overrides`` applied (not yet typed).

    Raises:
        ConfigError: a malformed override, with Hydra's message, or an unknown recipe.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    names, rest = recipes_of(overrides)
    for name in names:
        if name not in _known_recipes():
            _unknown(name)
    selected = [f"+{RECIPE_GROUP}=[{','.join(names)}]"] if names else []
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return hydra_compose(config_name=config_name, overrides=selected + [_as_set(o) for o in rest])
    except (HydraException, OmegaConfBaseException) as error:
        raise ConfigError(str(error).strip().splitlines()[0]) from None


def recipe_overrides(*names: str) -> list[str]:
    """The ``key=value`` overrides that recipes ``names`` (in order, later ones win) set: every key
    each recipe file holds, for tools that hand a recipe to a checkout older than recipes.

    Raises:
        ConfigError: an unknown recipe.
    """
    from omegaconf import OmegaConf

    def leaves(node: dict, prefix: str = ""):
        for key, value in node.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict):
                yield from leaves(value, dotted)
            else:
                yield dotted, value

    settings: dict = {}
    for name in names:
        recipe = compose(f"{RECIPE_GROUP}/{name}", []) if name in _known_recipes() else _unknown(name)
        settings.update(leaves(OmegaConf.to_container(recipe, resolve=False)))
    return [f"{key}={_hydra_value(value)}" for key, value in settings.items()]


def _known_recipes() -> list[str]:
    return sorted(path.stem for path in (CONFIG_DIR / RECIPE_GROUP).glob("*.yaml"))


def _unknown(name: str):
    raise ConfigError(f"recipe: no preset {name!r} (known: {', '.join(_known_recipes())}; verl/trainer/config/recipe/)")


def _hydra_value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    return str(value)
