"""``scripts/download.sh`` against a local server speaking the hub's file-resolve API.

The server (``HF_ENDPOINT``) answers ``HEAD``/``GET /datasets/{repo}/resolve/{revision}/{file}`` with
the headers ``huggingface_hub`` reads (``X-Repo-Commit``, ``ETag``, ``Content-Length``) and honours
``Range``. It serves a real FAISS Flat index split into two parts and the gzipped corpus it indexes;
the first download of the second part is cut off after ~14 MB, so the run must resume it (with a
``Range`` request: huggingface_hub writes in 10 MiB chunks, hence the wide vectors).
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
DIM = 8192  # 1168 rows x 8192 x 4 bytes: parts of ~19 MB
RESOLVE = re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


class FakeHub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _lookup(self):
        match = RESOLVE.match(self.path.split("?", 1)[0])
        if not match or (match["repo"], match["file"]) not in self.server.files:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("content-length", "0")
            self.end_headers()
            return None
        return match["file"], self.server.files[(match["repo"], match["file"])]

    def _headers(self, status: int, data: bytes, length: int, extra: dict | None = None):
        self.send_response(status)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", '"' + hashlib.sha1(data).hexdigest() + '"')
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()

    def do_HEAD(self):
        found = self._lookup()
        if found:
            self._headers(200, found[1], len(found[1]))

    def do_GET(self):
        found = self._lookup()
        if not found:
            return
        name, data = found
        ranged = re.match(r"bytes=(\d+)-", self.headers.get("Range", ""))
        start = int(ranged.group(1)) if ranged else 0
        self.server.gets.append((name, start))
        body = data[start:]
        if ranged:
            self._headers(206, data, len(body), {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"})
        else:
            self._headers(200, data, len(body))
        if name == self.server.cut_file and not self.server.cut_done:
            self.server.cut_done = True
            self.wfile.write(body[:len(body) * 3 // 4])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(tmp_path):
    import faiss

    corpus = (REPO / "example" / "corpus.jsonl").read_bytes()
    num_rows = corpus.count(b"\n")
    vectors = np.random.default_rng(0).standard_normal((num_rows, DIM)).astype(np.float32)
    index = faiss.IndexFlatIP(DIM)
    index.add(vectors)
    index_path = tmp_path / "source.index"
    faiss.write_index(index, str(index_path))
    index_bytes = index_path.read_bytes()
    half = len(index_bytes) // 2
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    server.daemon_threads = True
    server.files = {("PeterJinGo/wiki-18-e5-index", "part_aa"): index_bytes[:half],
                    ("PeterJinGo/wiki-18-e5-index", "part_ab"): index_bytes[half:],
                    ("PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz"): gzip.compress(corpus)}
    server.gets, server.cut_file, server.cut_done = [], "part_ab", False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.index_bytes, server.corpus, server.num_rows = index_bytes, corpus, num_rows
    yield server
    server.shutdown()
    server.server_close()
    for child in tmp_path.iterdir():  # ~120 MB of index copies: do not leave them in pytest's temp base
        shutil.rmtree(child) if child.is_dir() else child.unlink()


def run_download(hub, tmp_path, *args, check=True):
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{hub.server_address[1]}", "HF_HUB_OFFLINE": "0",
           "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    env.pop("HF_TOKEN", None)
    return subprocess.run(["bash", str(REPO / "scripts" / "download.sh"), *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=check)


def test_download_joins_decompresses_and_resumes(hub, tmp_path):
    from search_r1.search.loading import load_dense_index

    save = tmp_path / "wiki18"
    result = run_download(hub, tmp_path, str(save))
    index, corpus = save / "e5_Flat.index", save / "wiki-18.jsonl"
    assert index.read_bytes() == hub.index_bytes and corpus.read_bytes() == hub.corpus
    assert ("part_ab", 0) in hub.gets and any(name == "part_ab" and start > 0 for name, start in hub.gets), \
        f"the cut-off part was not resumed: {hub.gets}\n{result.stderr[-2000:]}"
    assert not (save / "part_aa").exists() and not (save / "wiki-18.jsonl.gz").exists()
    assert len(load_dense_index(str(index), str(corpus))) == hub.num_rows
    gets = len(hub.gets)
    again = run_download(hub, tmp_path, str(save))
    assert len(hub.gets) == gets and again.stdout.count("is complete, skipped") == 2


def test_repo_id_override_and_missing_file(hub, tmp_path):
    hub.files[("mirror/e5-index", "part_aa")] = hub.index_bytes
    save = tmp_path / "mirror"
    run_download(hub, tmp_path, str(save), "--repo_id", "mirror/e5-index", "--index_parts", "part_aa",
                 "--skip_corpus", "--keep_parts")
    assert (save / "e5_Flat.index").read_bytes() == hub.index_bytes and (save / "part_aa").exists()
    failed = run_download(hub, tmp_path, str(save), "--repo_id", "mirror/absent", "--skip_corpus",
                          "--index_name", "other.index", check=False)
    assert failed.returncode != 0
    assert failed.stderr.strip().splitlines()[-1].startswith("download: mirror/absent/part_aa (dataset) failed")
