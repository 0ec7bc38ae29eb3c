"""Name -> entry registries of the algorithms, with the errors every registry shares."""

from __future__ import annotations

from typing import Any


def add(registry: dict[str, Any], kind: str, name: str, entry: Any) -> None:
    """Register ``entry`` (a dataclass with an ``fn`` field) as ``name``.

    Raises:
        ValueError: ``name`` is already registered to a different function.
    """
    existing = registry.get(name)
    if existing is not None and existing.fn is not entry.fn:
        raise ValueError(f"{kind} {name!r} is already registered ({existing.fn.__qualname__})")
    registry[name] = entry


def lookup(registry: dict[str, Any], kind: str, name: str) -> Any:
    """The entry registered as ``name``.

    Raises:
        ValueError: unknown name, listing the known ones.
    """
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; known: {sorted(registry)}")
    return registry[name]
