"""The top-level ``setup.py`` of the layout Search-R1 and veRL users know.

Everything (name, version, dependencies, extras, packages) is declared in ``pyproject.toml``, which
pip and setuptools read; this file adds nothing, so ``pip install -e .`` and
``pip install -e .[gpu,retriever,logging]`` behave exactly as without it.
"""

from setuptools import setup

setup()
