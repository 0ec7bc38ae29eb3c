"""Synthetic wiki-18-sized retrieval data for ``retriever_scale.py``, generated fast and in chunks.

- vectors: unit vectors around random cluster centres (a crude stand-in for e5 embeddings, whose
  neighbourhoods IVF/HNSW exploit; pure Gaussian noise would make every approximate index look
  useless), written as a FAISS ``IndexFlatIP`` file by ``flat_file.write_flat_file``. Generated on
  the GPU when there is one.
- passages: ``{"id", "contents"}`` JSONL, ``"Title"\\n`` + ~100 words drawn from the tokenizer's whole
  words (wiki-18's passages are 100 words, ~670 bytes per JSONL line). Bodies come from a pool of
  distinct random passages, so writing 10M lines costs string formatting only.
- encoder: a BERT of e5-base's shape (``intfloat/e5-base-v2``: 12 layers, hidden 768, 12 heads,
  intermediate 3072, 30,522-token uncased WordPiece vocabulary) with random weights and a borrowed
  uncased BERT tokenizer (all-MiniLM-L6-v2 uses the same vocabulary).
- page-cache control for cold starts: ``evict`` (fsync + ``posix_fadvise(DONTNEED)``, no root
  needed) and ``resident_fraction`` (``mincore``).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import shutil
import time
from pathlib import Path

import numpy as np

E5_BASE = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
           "intermediate_size": 3072, "max_position_embeddings": 512, "type_vocab_size": 2}
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
VECTOR_CHUNK_ROWS = 1 << 17


def tokenizer_words(tokenizer_dir: str, min_len: int = 2, max_len: int = 8) -> list[str]:
    """Whole alphabetic words of a WordPiece ``vocab.txt`` (no ``##`` pieces, no specials), short
    enough that 100 of them take about as many bytes as a wiki-18 passage."""
    words = []
    with open(os.path.join(tokenizer_dir, "vocab.txt"), encoding="utf-8") as handle:
        for line in handle:
            word = line.rstrip("\n")
            if min_len <= len(word) <= max_len and word.isascii() and word.isalpha():
                words.append(word)
    if len(words) < 1000:
        raise ValueError(f"{tokenizer_dir}/vocab.txt: only {len(words)} whole words; not a BERT vocabulary?")
    return words


def write_vectors(path: str, num: int, dim: int, clusters: int = 4096, spread: float = 0.35,
                  seed: int = 0, device: str | None = None) -> dict:
    """Write ``num`` clustered unit vectors as a FAISS Flat IP file; returns timing and size."""
    import torch

    from search_r1.search.flat_file import write_flat_file

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=device).manual_seed(seed)
    centres = torch.randn((clusters, dim), generator=gen, device=device)
    centres /= centres.norm(dim=1, keepdim=True)

    def chunks():
        for lo in range(0, num, VECTOR_CHUNK_ROWS):
            rows = min(VECTOR_CHUNK_ROWS, num - lo)
            assign = torch.randint(0, clusters, (rows,), generator=gen, device=device)
            x = centres[assign] + spread * torch.randn((rows, dim), generator=gen, device=device) / dim ** 0.5
            yield (x / x.norm(dim=1, keepdim=True)).cpu().numpy()

    start = time.perf_counter()
    flat = write_flat_file(path, dim, num, chunks())
    return {"seconds": time.perf_counter() - start, "bytes": os.path.getsize(path), "rows": flat.ntotal,
            "clusters": clusters, "spread": spread, "device": device}


def write_passages(path: str, num: int, words: list[str], words_per_passage: int = 100,
                   pool_size: int = 65536, seed: int = 0) -> dict:
    """Write ``num`` synthetic passages as JSONL (ids ``"0"``...); returns timing and size."""
    rng = np.random.default_rng(seed)
    vocab = np.array(words, dtype=object)
    pool = []
    for _ in range(min(pool_size, num)):
        length = int(rng.integers(words_per_passage * 3 // 4, words_per_passage * 5 // 4 + 1))
        pool.append(json.dumps(" ".join(vocab[rng.integers(0, len(vocab), length)]))[1:-1])
    titles = [json.dumps(" ".join(vocab[rng.integers(0, len(vocab), 2)]).title())[1:-1] for _ in range(4096)]
    line = '{"id": "%d", "contents": "\\"%s %d\\"\\n%s"}\n'  # contents: "Title N"\nbody, JSON-escaped
    start = time.perf_counter()
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        for lo in range(0, num, 100_000):
            handle.write("".join(line % (i, titles[i % 4096], i, pool[(i * 7919) % len(pool)])
                                 for i in range(lo, min(lo + 100_000, num))))
    os.replace(tmp, path)
    return {"seconds": time.perf_counter() - start, "bytes": os.path.getsize(path), "rows": num,
            "words_per_passage": words_per_passage, "distinct_bodies": len(pool)}


def save_random_encoder(out_dir: str, tokenizer_dir: str, num_layers: int = 12, seed: int = 0) -> dict:
    """An e5-base-shaped BERT (``num_layers`` of 12 kept for CPU runs) with random weights."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(**{**E5_BASE, "num_hidden_layers": num_layers})
    model = BertModel(config, add_pooling_layer=False)
    model.save_pretrained(out_dir)
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(tokenizer_dir, name)):
            shutil.copy(os.path.join(tokenizer_dir, name), out_dir)
    return {"num_layers": num_layers, "hidden_size": config.hidden_size,
            "params": sum(p.numel() for p in model.parameters()), "weights": "random (no download)"}


def synthetic_queries(words: list[str], num: int, seed: int = 1) -> list[str]:
    """Question-like strings of 6-14 words (NQ questions average ~9 words)."""
    rng = np.random.default_rng(seed)
    vocab = np.array(words, dtype=object)
    return ["what " + " ".join(vocab[rng.integers(0, len(vocab), int(rng.integers(5, 14)))]) for _ in range(num)]


def evict(paths) -> None:
    """Drop the files' pages from the page cache (written pages are flushed first)."""
    for path in paths:
        if not os.path.exists(path):
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_fraction(path: str) -> float | None:
    """Share of a file's pages in the page cache (``mincore`` on a fresh mapping), None on failure."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    finally:
        os.close(fd)
    if address in (None, ctypes.c_void_p(-1).value):
        return None
    try:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        if libc.mincore(address, size, vec) != 0:
            return None
        return float((np.frombuffer(vec, dtype=np.uint8) & 1).mean())
    finally:
        libc.munmap(address, size)


def process_memory(pid: int) -> dict:
    """``VmHWM`` (peak RSS), ``VmRSS`` and its anonymous / file-backed / shared parts, in GiB."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = round(int(value.split()[0]) / 2**20, 3)
    except OSError:
        pass
    return out


def mapped_rss(pid: int, paths) -> float:
    """GiB of ``pid``'s resident pages that map any of ``paths`` (from ``/proc/<pid>/smaps``)."""
    wanted = {os.path.realpath(str(p)) for p in paths}
    total_kib, current = 0, None
    try:
        with open(f"/proc/{pid}/smaps") as handle:
            for line in handle:
                fields = line.split()
                if "-" in fields[0] and len(fields) >= 5:  # a mapping header: range perms offset dev inode [path]
                    current = fields[5] if len(fields) > 5 else None
                elif fields[0] == "Rss:" and current in wanted:
                    total_kib += int(fields[1])
    except OSError:
        return 0.0
    return round(total_kib / 2**20, 3)


def gpu_memory_of(pid: int) -> float | None:
    """GPU memory (GiB) used by ``pid`` per ``nvidia-smi``, None without it."""
    import subprocess

    try:
        text = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = [float(mib) for p, mib in (line.split(",") for line in text.strip().splitlines() if "," in line)
            if int(p) == pid]
    return round(sum(used) / 1024, 3) if used else None
