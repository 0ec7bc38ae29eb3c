"""Shared fixture of the benchmark tests: the learning run's data, built once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("SEARCH_R1_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def learning_data_seed_19(tmp_path_factory) -> Path:
    """``benchmarks/learning_data.py``'s build of the shared data with seed 19 (~7 s), read by the data
    tests and copied by the learning-run tests (a test that changes it works on its own copy)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import learning_data

    out = tmp_path_factory.mktemp("learning_data_seed_19")
    learning_data.build(SHARED, out, seed=19)
    return out
