"""Environments by name: registered in-process, by a module the config names, or by entry points.

An environment package registers its :class:`~verl.envs.base.Environment` subclasses with
:func:`register_environment` when imported. :func:`load_environment` finds a name in that order:

1. ``env.module``: the module path the configuration names is imported (it registers; the default
   is this project's ``search_r1.envs``, so a source checkout on ``PYTHONPATH`` needs no install);
2. already registered in this process;
3. the ``verl.environments`` entry points of the installed packages (``name = "pkg.module:Class"``;
   this project's ``pyproject.toml`` declares ``search_r1`` and ``tool_call``).

Either way ``python -m verl.trainer.main_ppo`` finds Search-R1's environment without any import of
it in ``verl``.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Optional

from verl.utils.config import ConfigError

ENTRY_POINT_GROUP = "verl.environments"
_REGISTRY: dict[str, type] = {}


def register_environment(cls: type) -> type:
    """Register an ``Environment`` subclass under its ``name`` (usable as a class decorator).

    Raises:
        ValueError: another class is registered under that name.
    """
    known = _REGISTRY.get(cls.name)
    if known is not None and known.__qualname__ != cls.__qualname__:
        raise ValueError(f"environment {cls.name!r} is registered twice: {known.__module__}.{known.__qualname__} "
                         f"and {cls.__module__}.{cls.__qualname__}")
    _REGISTRY[cls.name] = cls
    return cls


def _entry_points() -> dict:
    return {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}


def load_environment(name: str, module: Optional[str] = None) -> type:
    """The environment class registered as ``name``.

    Args:
        name: ``env.name``.
        module: ``env.module``, imported first when given.
    Raises:
        ConfigError: the module cannot be imported, or no environment has that name (one line
            naming it and the names known).
    """
    if module:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ConfigError(f"env.module: cannot import {module!r} ({error})") from None
    if name not in _REGISTRY:
        point = _entry_points().get(name)
        if point is not None:
            register_environment(point.load())
    if name not in _REGISTRY:
        known = sorted(set(_REGISTRY) | set(_entry_points()))
        raise ConfigError(f"env.name: no environment {name!r} (known: {', '.join(known) or 'none'}; an environment "
                          f"registers through the {ENTRY_POINT_GROUP!r} entry points or a module given as env.module)")
    return _REGISTRY[name]

