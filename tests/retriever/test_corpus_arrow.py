"""The memory-mapped Arrow copy of a JSONL corpus: written on first load, mapped after, rebuilt when
stale or damaged, refused with a clear error when given directly and invalid."""

import json
import logging
import os
import subprocess
import sys

import pyarrow as pa
import pytest

from search_r1.search import corpus as corpus_module
from search_r1.search.corpus import (CorpusFormatError, arrow_path_for, load_corpus,
                                     open_arrow_corpus)


def _jsonl(path, num=50, int_ids=False):
    rows = [{"id": i if int_ids else f"doc-{i}", "contents": f'"Title {i}"\nPassage {i} \u00e9 text', "title": "x"}
            for i in range(num)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [{"id": str(r["id"]), "contents": r["contents"]} for r in rows]


def _all(corpus):
    return corpus.take(range(len(corpus)))


def test_first_load_writes_arrow_second_maps_it(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_module, "JSON_BLOCK_BYTES", 1024)  # many record batches
    path = tmp_path / "c.jsonl"
    rows = _jsonl(path, 300)
    first = load_corpus(path)
    arrow = tmp_path / "c.jsonl.arrow"
    assert first.arrow_path == str(arrow) and arrow.is_file() and first.path == str(path)
    assert _all(first) == rows and len(first._ids) > 1
    stamp = arrow.stat().st_mtime_ns
    second = load_corpus(path)
    assert arrow.stat().st_mtime_ns == stamp  # mapped, not rewritten
    assert _all(second) == rows == _all(load_corpus(path, arrow_cache=False))
    assert second.take([299, 0, 150]) == [rows[299], rows[0], rows[150]]
    assert second.fingerprint() == {"num_rows": 300, "first_id": "doc-0", "last_id": "doc-299"}
    with pytest.raises(IndexError, match="row 300 outside corpus"):
        second.take([300])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "c.jsonl.arrow"]


def test_changed_jsonl_rebuilds_the_arrow_copy(tmp_path):
    path = tmp_path / "c.jsonl"
    _jsonl(path, 10)
    load_corpus(path)
    rows = _jsonl(path, 12)
    assert _all(load_corpus(path)) == rows


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "foreign"])
def test_damaged_arrow_copy_is_rebuilt(tmp_path, damage, caplog):
    path = tmp_path / "c.jsonl"
    rows = _jsonl(path, 40)
    load_corpus(path)
    arrow = tmp_path / "c.jsonl.arrow"
    data = arrow.read_bytes()
    if damage == "truncate":
        arrow.write_bytes(data[:len(data) // 2])
    elif damage == "garbage":
        arrow.write_bytes(os.urandom(len(data)))
    elif damage == "empty":
        arrow.write_bytes(b"")
    else:  # a valid Arrow file that is not one of ours
        with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("x", pa.int64())])) as w:
            w.write_batch(pa.record_batch([pa.array([1])], names=["x"]))
    with caplog.at_level(logging.WARNING, logger="search_r1.search.corpus"):
        assert _all(load_corpus(path)) == rows
    assert "rebuilding the Arrow copy" in caplog.text and "c.jsonl.arrow" in caplog.text
    assert _all(open_arrow_corpus(str(arrow), source=str(path))) == rows


def test_invalid_arrow_corpus_given_directly_is_rejected(tmp_path):
    bad = tmp_path / "corpus.arrow"
    bad.write_bytes(b"not arrow at all")
    with pytest.raises(CorpusFormatError, match="corpus.arrow: not a valid Arrow corpus file"):
        load_corpus(bad)


def test_arrow_corpus_can_be_served_directly(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = _jsonl(path, 5)
    arrow = load_corpus(path).arrow_path
    os.unlink(path)
    assert _all(load_corpus(arrow)) == rows


def test_int_ids_and_bad_lines_go_through_the_line_by_line_path(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = _jsonl(path, 20, int_ids=True)
    assert _all(load_corpus(path)) == rows
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "contents": "x"}\n{"id": "b"}\n')
    with pytest.raises(CorpusFormatError, match=r"bad.jsonl:2: missing field 'contents'"):
        load_corpus(bad)
    assert not any(p.name.startswith("bad.jsonl.arrow") for p in tmp_path.iterdir())


def test_read_only_folder_puts_the_copy_in_the_cache(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    path = data / "c.jsonl"
    rows = _jsonl(path, 8)
    data.chmod(0o555)
    monkeypatch.setenv("SEARCH_R1_CACHE", str(tmp_path / "cache"))
    try:
        corpus = load_corpus(path)
        assert corpus.arrow_path == arrow_path_for(str(path))
        assert corpus.arrow_path.startswith(str(tmp_path / "cache" / "corpus_arrow"))
        assert _all(corpus) == rows and sorted(os.listdir(data)) == ["c.jsonl"]
    finally:
        data.chmod(0o755)


def test_concurrent_first_loads_agree(tmp_path):
    """Two processes loading a new corpus at once: one converts, the other waits and maps it."""
    path = tmp_path / "c.jsonl"
    rows = _jsonl(path, 2000)
    code = ("import json, sys; from search_r1.search.corpus import load_corpus; "
            "c = load_corpus(sys.argv[1]); print(json.dumps([c.arrow_path, len(c), c[1999]]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outputs[0] == outputs[1] == [str(path) + ".arrow", 2000, rows[1999]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "c.jsonl.arrow"]
