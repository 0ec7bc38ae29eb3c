"""Install the wheels of a folder whose distributions this interpreter cannot find, into a target site.

Usage: python3 benchmarks/device/install_missing.py WHEEL_DIR TARGET (with PYTHONPATH as the runs will have it)

A peer's extra dependencies are downloaded here with their own dependencies, many of which the device
already has; installing only the missing ones keeps the device's versions of the rest (a newer pydantic
in the peer's site would shadow the one its other packages were built against). Offline: ``--no-index``.
"""
from __future__ import annotations

import importlib.metadata as metadata
import subprocess
import sys
from pathlib import Path


def distribution(wheel: Path) -> str:
    """The distribution a wheel file installs (its name's first field, PEP 427)."""
    return wheel.name.split("-", 1)[0]


def missing(wheels: list[Path]) -> list[Path]:
    """The wheels whose distribution is not installed anywhere on sys.path."""
    absent = []
    for wheel in wheels:
        try:
            metadata.version(distribution(wheel))
        except metadata.PackageNotFoundError:
            absent.append(wheel)
    return absent


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: install_missing.py WHEEL_DIR TARGET", file=sys.stderr)
        return 2
    folder, target = Path(args[0]), args[1]
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        print(f"install_missing: no wheels in {folder}", file=sys.stderr)
        return 1
    todo = missing(wheels)
    print(f"install_missing: {len(todo)} of {len(wheels)} into {target}: {' '.join(distribution(w) for w in todo)}")
    if not todo:
        return 0
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                           "--target", target, *map(str, todo)]).returncode


if __name__ == "__main__":
    sys.exit(main())
