"""Typed configuration: dataclass schemas loaded through OmegaConf structured configs.

Every component declares its settings as a frozen dataclass next to its code, each field followed by
its docstring (the reference in docs/configuration.md is generated from those). Values arrive as
YAML/Hydra trees or plain mappings; :func:`to_typed` merges them into the schema, so OmegaConf checks
types and unknown keys, and returns the dataclass instance. Frozen instances cannot be mutated after
loading: values derived from the configuration are computed by pure functions into their own objects.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import textwrap
from functools import lru_cache
from typing import Any, Iterator, Mapping, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is wrong; the message starts with the dotted key."""


def _unfreeze(node: Any) -> None:
    # A frozen dataclass makes its structured config read-only; the schema must accept the merge.
    OmegaConf.set_readonly(node, None)
    if isinstance(node, DictConfig):
        for key in node.keys():
            child = node._get_node(key)
            if isinstance(child, (DictConfig, ListConfig)):
                _unfreeze(child)
            elif child is not None:
                child._set_flag("readonly", None)


def schema(cls: type) -> DictConfig:
    """The writable structured config of dataclass ``cls`` with its defaults."""
    node = OmegaConf.structured(cls)
    _unfreeze(node)
    return node


def _one_line(error: OmegaConfBaseException, prefix: str) -> str:
    key = getattr(error, "full_key", None) or ""
    key = f"{prefix}.{key}" if prefix and key else (prefix or key)
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    message += _did_you_mean(error)
    return f"{key}: {message}" if key else message


def _did_you_mean(error: OmegaConfBaseException) -> str:
    """``"; did you mean 'total_epochs'?"`` for an unknown key close to a field of its section."""
    section, unknown = getattr(error, "object_type", None), getattr(error, "key", None)
    if not (isinstance(error, ConfigKeyError) and dataclasses.is_dataclass(section) and isinstance(unknown, str)):
        return ""
    close = difflib.get_close_matches(unknown, [f.name for f in dataclasses.fields(section)], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def to_typed(cls: type[T], value: Any, prefix: str = "") -> T:
    """Merge ``value`` (a mapping, DictConfig, or an instance of ``cls``) into ``cls``'s schema.

    Args:
        cls: a dataclass whose fields are OmegaConf-supported types.
        value: the user's settings; missing keys take the dataclass defaults.
        prefix: dotted path of ``value`` in the whole configuration, used in error messages.
    Returns:
        An instance of ``cls`` with interpolations resolved.
    Raises:
        ConfigError: an unknown key, a value of the wrong type, or an unresolvable interpolation,
            named by its dotted key.
    """
    if isinstance(value, cls):
        return value
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    try:
        merged = OmegaConf.merge(schema(cls), value if value is not None else {})
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        raise ConfigError(_one_line(error, prefix)) from None


def fields_of(obj: Any, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """``(dotted key, field, value)`` for every leaf field of a dataclass instance, depth first."""
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        key = f"{prefix}.{field.name}" if prefix else field.name
        if dataclasses.is_dataclass(value):
            yield from fields_of(value, key)
        else:
            yield key, field, value


@lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of dataclass ``cls`` or of the dataclass it extends
    (attribute docstrings; a subclass's own text wins).

    Raises:
        ValueError: a field of ``cls`` has no docstring (every setting must say what it does).
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass) and "__dataclass_fields__" in vars(klass):
            docs.update(_own_field_docs(klass))
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in docs]
    if missing:
        raise ValueError(f"{cls.__qualname__}: fields without a docstring: {missing}")
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for statement, following in zip(body, body[1:]):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def to_plain(value: Any) -> Any:
    """A dataclass tree (or mapping) as plain dicts and lists, e.g. for loggers and printing."""
    if dataclasses.is_dataclass(value):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def replace_key(obj: T, key: str, value: Any) -> T:
    """A copy of dataclass ``obj`` with the dotted ``key`` set to ``value`` (frozen configs are not
    changed in place; derived configs are new objects).

    Raises:
        AttributeError: ``key`` names no field.
    """
    head, _, rest = key.partition(".")
    if not any(f.name == head for f in dataclasses.fields(obj)):
        raise AttributeError(f"{type(obj).__name__} has no field {head!r}")
    new = replace_key(getattr(obj, head), rest, value) if rest else value
    return dataclasses.replace(obj, **{head: new})


def delete_key(tree: DictConfig, key: str) -> None:
    """Remove the dotted ``key`` from ``tree`` in place, and the parents it leaves empty."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(tree, parent_key) if parent_key else tree
    with open_dict(parent):
        del parent[leaf]
    if parent_key and len(parent) == 0:
        delete_key(tree, parent_key)


def leaf_defaults(cls: type) -> dict[str, Any]:
    """``{dotted key: default}`` of every leaf field of dataclass ``cls`` (interpolations unresolved;
    a mapping or list field is one leaf)."""
    def walk(node: DictConfig, prefix: str) -> Iterator[tuple[str, Any]]:
        for key in node.keys():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            child = node._get_node(key)
            if isinstance(child, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(child)):
                yield from walk(child, dotted)
            elif isinstance(child, (DictConfig, ListConfig)):
                yield dotted, OmegaConf.to_container(child, resolve=False)
            else:
                yield dotted, child._value()

    return dict(walk(schema(cls), ""))
