"""Fixtures of the data tests: real tokenizers, the data scripts as modules, processed example data."""

import importlib
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "data_process"
EXAMPLE_QA = REPO / "example" / "qa"


def load_script(name: str):
    """Import ``scripts/data_process/<name>.py`` as the scripts do (top-level modules on sys.path),
    so ``qa_common`` is one module shared by the tests and the scripts."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    return importlib.import_module(name)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from transformers import AutoTokenizer

    from verl.utils.model_zoo import qwen_tokenizer_dir

    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir())


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2's tokenizer (pad == eos == <|im_end|>); the model folder is converted once."""
    from transformers import AutoTokenizer

    from verl.utils.model_zoo import smollm2_dir

    return AutoTokenizer.from_pretrained(smollm2_dir())


@pytest.fixture(scope="session")
def processed_example(tmp_path_factory) -> Path:
    """train.parquet and test.parquet made from example/qa by the merge scripts."""
    out = tmp_path_factory.mktemp("processed")
    load_script("qa_search_train_merge").main(["--input_dir", str(EXAMPLE_QA), "--local_dir", str(out)])
    load_script("qa_search_test_merge").main(["--input_dir", str(EXAMPLE_QA), "--local_dir", str(out)])
    return out
