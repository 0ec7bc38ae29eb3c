"""The config dataclasses are the single source: YAML and reference page generated from them, every
field documented where it is declared and read by the code it configures."""

import ast
import dataclasses
from pathlib import Path

from verl.trainer.ppo import config_docs
from verl.trainer.ppo.compat import COMPAT_KEYS
from verl.trainer.ppo.config import PPOConfig
from verl.utils.config import field_docs

REPO = Path(__file__).resolve().parents[2]
CONFIG_MODULES = {"config.py", "model_config.py", "config_docs.py", "compat.py"}


def _config_classes(cls=PPOConfig, seen=None):
    seen = seen if seen is not None else {}
    seen[cls] = None
    for field in dataclasses.fields(cls):
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        if dataclasses.is_dataclass(default) and type(default) not in seen:
            _config_classes(type(default), seen)
    return list(seen)


def _attributes_read_outside_config_modules() -> set[str]:
    names = set()
    for root in ("verl", "search_r1"):
        for path in (REPO / root).rglob("*.py"):
            if path.name in CONFIG_MODULES:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute):
                    names.add(node.attr)
    return names


def test_yaml_and_reference_page_are_generated_from_the_dataclasses():
    assert config_docs.YAML_PATH.read_text() == config_docs.render_yaml(), \
        "ppo_trainer.yaml is stale: python -m verl.trainer.ppo.config_docs --write"
    assert config_docs.DOC_PATH.read_text() == config_docs.render_markdown(), \
        "docs/configuration.md is stale: python -m verl.trainer.ppo.config_docs --write"
    assert config_docs.main(["--check"]) == 0  # sft_trainer.yaml too


def test_every_field_has_a_docstring_and_every_compat_key_a_reason():
    for cls in _config_classes():
        field_docs(cls)  # raises naming the undocumented fields
    assert all(key.why for key in COMPAT_KEYS.values())


def test_every_declared_field_is_read_somewhere():
    read = _attributes_read_outside_config_modules()
    unread = [f"{cls.__name__}.{field.name}" for cls in _config_classes() for field in dataclasses.fields(cls)
              if field.name not in read]
    assert not unread, f"declared but never read (remove them or move them to compat.py): {unread}"


def test_compat_keys_are_not_also_declared():
    from omegaconf import OmegaConf

    from verl.utils.config import schema

    tree = schema(PPOConfig)
    declared = [key for key in COMPAT_KEYS if OmegaConf.select(tree, key, default="<absent>") != "<absent>"]
    assert not declared
