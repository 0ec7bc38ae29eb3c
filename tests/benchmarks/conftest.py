"""Shared fixtures of the benchmark tests: the learning run's data, built once; the peers' wheels (issue 27)."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("SEARCH_R1_SHARED_DATA", ROOT.parent / "shared" / "data"))
PEER_WHEELS = ROOT / ".whl-peers"
NO_WHEEL = "not in .whl-peers/ (bash benchmarks/device/peer_wheels.sh downloads it; a clean clone has none)"


@pytest.fixture(scope="session")
def learning_data_seed_19(tmp_path_factory) -> Path:
    """``benchmarks/learning_data.py``'s build of the shared data with seed 19 (~7 s), read by the data
    tests and copied by the learning-run tests (a test that changes it works on its own copy)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import learning_data

    out = tmp_path_factory.mktemp("learning_data_seed_19")
    learning_data.build(SHARED, out, seed=19)
    return out


def _peer_wheel(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path.name} {NO_WHEEL}")
    return path


@pytest.fixture(scope="session")
def verl_code(tmp_path_factory) -> Path:
    """veRL 0.9.1 unpacked from its wheel (code and configs), for child processes."""
    out = tmp_path_factory.mktemp("verl091_site")
    with zipfile.ZipFile(_peer_wheel(PEER_WHEELS / "verl" / "verl-0.9.1-py3-none-any.whl")) as wheel:
        wheel.extractall(out)
    return out


@pytest.fixture(scope="session")
def trl_wheel() -> Path:
    """TRL 1.16.0's wheel."""
    return _peer_wheel(PEER_WHEELS / "trl" / "trl-1.16.0-py3-none-any.whl")
