"""Download Search-R1's e5 wiki-18 index and the wiki-18 corpus from the Hugging Face hub.

    python scripts/download.py --save_path /data/wiki18          # then: FILE_PATH=/data/wiki18 bash retrieval_launch.sh

Does what Search-R1's quickstart does by hand: fetches the index parts (``part_aa``, ``part_ab`` of
the dataset repo ``PeterJinGo/wiki-18-e5-index``) and ``wiki-18.jsonl.gz`` (``PeterJinGo/wiki-18-corpus``)
with ``huggingface_hub`` (progress bars; an interrupted run resumes where it stopped), joins the
parts into ``e5_Flat.index`` and decompresses the corpus into ``wiki-18.jsonl``. Both outputs are
written under a temporary name and renamed when complete, so a half-written file is never taken for
a finished one; a rerun skips what is already complete. The parts and the archive are removed once
joined / decompressed unless ``--keep_parts`` (they double the ~75 GB on disk).

``--repo_id`` / ``--corpus_repo_id`` / ``--index_parts`` / ``--revision`` point elsewhere (a mirror, a
fork); ``HF_ENDPOINT`` and ``HF_TOKEN`` work as for any ``huggingface_hub`` call.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
from pathlib import Path

INDEX_REPO = "PeterJinGo/wiki-18-e5-index"
INDEX_PARTS = ("part_aa", "part_ab")
INDEX_FILE = "e5_Flat.index"
CORPUS_REPO = "PeterJinGo/wiki-18-corpus"
CORPUS_ARCHIVE = "wiki-18.jsonl.gz"
CORPUS_FILE = "wiki-18.jsonl"
CHUNK_BYTES = 16 << 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Download the e5 wiki-18 index and the wiki-18 corpus (Search-R1's).")
    p.add_argument("--save_path", required=True, help="folder for e5_Flat.index and wiki-18.jsonl")
    p.add_argument("--repo_id", default=INDEX_REPO, help="dataset repo holding the index parts")
    p.add_argument("--index_parts", nargs="+", default=list(INDEX_PARTS), help="part files, in join order")
    p.add_argument("--index_name", default=INDEX_FILE, help="name of the joined index")
    p.add_argument("--corpus_repo_id", default=CORPUS_REPO, help="dataset repo holding the corpus")
    p.add_argument("--corpus_file", default=CORPUS_ARCHIVE, help="the corpus file in that repo (.gz or plain)")
    p.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
    p.add_argument("--skip_index", action="store_true")
    p.add_argument("--skip_corpus", action="store_true")
    p.add_argument("--keep_parts", action="store_true", help="keep the parts and the archive after joining")
    return p.parse_args(argv)


def fetch(repo_id: str, filename: str, save_path: Path, revision: str | None) -> Path:
    """One file of a dataset repo into ``save_path`` (resumable; skipped when already complete)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id=repo_id, filename=filename, repo_type="dataset",
                                    revision=revision, local_dir=save_path))
    except (HfHubHTTPError, LocalEntryNotFoundError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RuntimeError(f"download: {repo_id}/{filename} (dataset) failed: {first_line}") from err


def _done_marker(target: Path) -> Path:
    return target.with_name(target.name + ".done.json")


def is_complete(target: Path) -> bool:
    """``target`` exists with the size recorded when it was finished."""
    marker = _done_marker(target)
    if not (target.exists() and marker.exists()):
        return False
    return json.loads(marker.read_text()).get("bytes") == target.stat().st_size


def _finish(tmp: Path, target: Path, sources: list[str]) -> None:
    os.replace(tmp, target)
    _done_marker(target).write_text(json.dumps({"bytes": target.stat().st_size, "from": sources}) + "\n")


def join_parts(parts: list[Path], target: Path) -> None:
    """Concatenate ``parts`` in order into ``target`` (``cat part_* > target``, written atomically)."""
    tmp = target.with_name(target.name + ".partial")
    with open(tmp, "wb") as out:
        for part in parts:
            with open(part, "rb") as handle:
                shutil.copyfileobj(handle, out, CHUNK_BYTES)
    _finish(tmp, target, [p.name for p in parts])


def decompress(archive: Path, target: Path) -> None:
    """``gzip -d`` of ``archive`` into ``target`` (written atomically); a plain file is copied."""
    tmp = target.with_name(target.name + ".partial")
    opener = gzip.open if archive.suffix == ".gz" else open
    with opener(archive, "rb") as handle, open(tmp, "wb") as out:
        shutil.copyfileobj(handle, out, CHUNK_BYTES)
    _finish(tmp, target, [archive.name])


def download_index(args: argparse.Namespace, save_path: Path) -> Path:
    target = save_path / args.index_name
    if is_complete(target):
        print(f"download: {target} is complete, skipped")
        return target
    parts = [fetch(args.repo_id, name, save_path, args.revision) for name in args.index_parts]
    print(f"download: joining {len(parts)} parts into {target}", flush=True)
    join_parts(parts, target)
    if not args.keep_parts:
        for part in parts:
            part.unlink()
    return target


def download_corpus(args: argparse.Namespace, save_path: Path) -> Path:
    name = args.corpus_file[:-3] if args.corpus_file.endswith(".gz") else args.corpus_file
    target = save_path / Path(name).name
    if is_complete(target):
        print(f"download: {target} is complete, skipped")
        return target
    archive = fetch(args.corpus_repo_id, args.corpus_file, save_path, args.revision)
    if archive.resolve() == target.resolve():  # an uncompressed corpus needs no second copy
        _done_marker(target).write_text(json.dumps({"bytes": target.stat().st_size, "from": [archive.name]}) + "\n")
        return target
    print(f"download: decompressing {archive.name} into {target}", flush=True)
    decompress(archive, target)
    if not args.keep_parts:
        archive.unlink()
    return target


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    save_path = Path(args.save_path).expanduser()
    save_path.mkdir(parents=True, exist_ok=True)
    written = []
    if not args.skip_index:
        written.append(download_index(args, save_path))
    if not args.skip_corpus:
        written.append(download_corpus(args, save_path))
    for path in written:
        print(f"download: {path} ({path.stat().st_size:,} bytes)")
    if not args.skip_index and not args.skip_corpus:
        print(f"serve it with: FILE_PATH={save_path} bash retrieval_launch.sh")


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as err:
        sys.exit(str(err))
    except KeyboardInterrupt:
        sys.exit("download: interrupted; run the same command again to resume")
