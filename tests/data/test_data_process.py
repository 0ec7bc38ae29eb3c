"""QA processing scripts: prompt bytes, parquet schema, uids, split choice, malformed rows."""

import importlib
import json
import logging
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_QA = REPO / "example" / "qa"
sys.path.insert(0, str(REPO / "scripts" / "data_process"))
import qa_common  # noqa: E402

# Search-R1 scripts/data_process/nq_search.py make_prefix (base), written out independently.
REFERENCE_PREFIX = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every "
    "time you get new information. After reasoning, if you find you lack some knowledge, you can call "
    "a search engine by <search> query </search> and it will return the top searched results between "
    "<information> and </information>. You can search as many times as your want. If you find no "
    "further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {}\n")


def write_source(root, source, split, rows):
    folder = root / source
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{split}.jsonl", "w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def test_prefix_is_byte_exact():
    row = qa_common.make_row({"question": "  who wrote hamlet ", "golden_answers": ["Shakespeare"]},
                             3, "nq", "train", "base")
    assert row["prompt"][0]["content"] == REFERENCE_PREFIX.format("who wrote hamlet?")
    row = qa_common.make_row({"question": "Is it?", "golden_answers": ["x"]}, 0, "nq", "test", "base")
    assert row["prompt"][0]["content"].encode() == REFERENCE_PREFIX.format("Is it?").encode()


def test_instruct_template_differs_only_in_wording():
    row = qa_common.make_row({"question": "q", "golden_answers": ["a"]}, 0, "nq", "train", "instruct")
    content = row["prompt"][0]["content"]
    assert "as you want" in content and content.endswith("Question: q?\n")


def test_cli_outputs_exact_schema(tmp_path):
    cmd = [sys.executable, str(REPO / "scripts/data_process/nq_search.py"),
           "--input_dir", str(EXAMPLE_QA), "--local_dir", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, cwd=tmp_path)
    train = pq.read_table(tmp_path / "train.parquet").to_pylist()
    test = pq.read_table(tmp_path / "test.parquet").to_pylist()
    assert len(train) == 320 and len(test) == 30
    row = train[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == "nq" and row["ability"] == "fact-reasoning"
    assert row["prompt"] == [{"role": "user", "content": row["prompt"][0]["content"]}]
    assert row["reward_model"]["style"] == "rule"
    assert set(row["reward_model"]["ground_truth"]) == {"target"}
    assert row["extra_info"] == {"split": "train", "index": 0, "uid": "nq-train-0"}
    first = json.loads((EXAMPLE_QA / "nq/train.jsonl").open().readline())
    assert row["reward_model"]["ground_truth"]["target"] == first["golden_answers"]
    assert row["prompt"][0]["content"] == REFERENCE_PREFIX.format(first["question"].strip()
                                                                  .rstrip("?") + "?")
    assert {r["extra_info"]["split"] for r in test} == {"test"}


def test_merged_uids_unique_across_sources(processed_example):
    train = pq.read_table(processed_example / "train.parquet").to_pylist()
    uids = [r["extra_info"]["uid"] for r in train]
    assert len(set(uids)) == len(uids) == 520
    indices = [(r["extra_info"]["index"]) for r in train]
    assert len(set(indices)) < len(indices)   # per-source indices repeat, uids do not
    assert {r["data_source"] for r in train} == {"nq", "hotpotqa"}


def test_test_merge_split_choice(processed_example):
    test = pq.read_table(processed_example / "test.parquet").to_pylist()
    splits = {r["data_source"]: r["extra_info"]["split"] for r in test}
    assert splits == {"nq": "test", "triviaqa": "test", "popqa": "test", "bamboogle": "test",
                      "hotpotqa": "dev", "2wikimultihopqa": "dev", "musique": "dev"}
    assert len(test) == 210


def test_test_split_falls_back_to_train(tmp_path):
    write_source(tmp_path, "mine", "train", [{"id": "a", "question": "q", "golden_answers": ["x"]}])
    assert qa_common.QASource("mine", str(tmp_path)).test_split() == "train"
    write_source(tmp_path, "mine", "dev", [{"id": "b", "question": "q", "golden_answers": ["x"]}])
    assert qa_common.QASource("mine", str(tmp_path)).test_split() == "dev"


MALFORMED = [
    {"id": "ok1", "question": "fine", "golden_answers": ["x"]},
    {"id": "noq", "question": "   ", "golden_answers": ["x"]},
    {"id": "noa", "question": "q2", "golden_answers": []},
    {"id": "missing", "question": "q3"},
    {"id": "emptyans", "question": "q4", "golden_answers": [""]},
    {"id": "ok2", "question": "fine too", "golden_answers": "single"},
]


def test_malformed_rows_reported_and_skipped(tmp_path, caplog):
    write_source(tmp_path, "nq", "train", MALFORMED)
    module = importlib.import_module("qa_search_train_merge")
    with caplog.at_level(logging.WARNING):
        module.main(["--input_dir", str(tmp_path), "--local_dir", str(tmp_path / "out"),
                     "--data_sources", "nq"])
    rows = pq.read_table(tmp_path / "out/train.parquet").to_pylist()
    assert [r["extra_info"]["index"] for r in rows] == [0, 5]
    assert rows[1]["reward_model"]["ground_truth"]["target"] == ["single"]
    assert "4 of 6 rows" in caplog.text and "['noq', 'noa', 'missing', 'emptyans']" in caplog.text


def test_strict_rejects_malformed_rows(tmp_path):
    write_source(tmp_path, "nq", "train", MALFORMED)
    module = importlib.import_module("qa_search_train_merge")
    with pytest.raises(qa_common.MalformedRowsError, match="noq"):
        module.main(["--input_dir", str(tmp_path), "--local_dir", str(tmp_path / "out"),
                     "--data_sources", "nq", "--strict"])


def test_bad_inputs_raise_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="more than once"):
        qa_common.split_sources("nq,hotpotqa,nq")
    with pytest.raises(FileNotFoundError, match="nosuch"):
        qa_common.QASource("nosuch", str(tmp_path))
    (tmp_path / "nq").mkdir()
    (tmp_path / "nq/train.jsonl").write_text('{"id": 1, "question": "q"\n')
    with pytest.raises(ValueError, match=r"train.jsonl:1: invalid JSON"):
        qa_common.QASource("nq", str(tmp_path)).rows("train")


def test_hub_dataset_rows_and_split_choice():
    """The no --input_dir path reads a ``datasets.DatasetDict`` (as load_dataset returns it)."""
    import datasets

    source = qa_common.QASource("nq", None)
    source._hub = datasets.DatasetDict({
        "train": datasets.Dataset.from_list([{"id": "t0", "question": "q", "golden_answers": ["a"]}]),
        "dev": datasets.Dataset.from_list([{"id": "d0", "question": "r", "golden_answers": ["b", "c"]}]),
    })
    assert source.test_split() == "dev"
    rows = qa_common.process_split(source, source.test_split(), "base", strict=True)
    assert rows[0]["reward_model"]["ground_truth"]["target"] == ["b", "c"]
    assert rows[0]["extra_info"] == {"split": "dev", "index": 0, "uid": "nq-dev-0"}
