#!/usr/bin/env bash
# Download the FAISS GPU build for the H200 device (CUDA 13: faiss-gpu-cuvs and its cuVS/RAFT/RMM
# libraries; the CUDA runtime, cuBLAS, cuSOLVER, cuSPARSE, nvJitLink and NCCL come with the device's
# torch 2.11+cu130), plus httptools/uvloop (uvicorn's fast HTTP parser and event loop), and the
# uncased BERT tokenizer files the scale benchmark's random e5-base-shaped encoder borrows.
# Files over 58 MiB are split so each device call carries one group of at most 60 MiB.
# Usage (repo root, here, not on the device): bash benchmarks/device/fetch_faiss_gpu_wheels.sh [OUT_DIR]
#   OUT_DIR default .whl-faiss (git-ignored through .git/info/exclude); prints the carry plan.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
out=${1:-.whl-faiss}
exclude="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
for pattern in /.whl-faiss/ /.bench/; do grep -qxF "$pattern" "$exclude" 2>/dev/null || echo "$pattern" >> "$exclude"; done
rm -rf "$out"
mkdir -p "$out/parts" "$out/small"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
         "${plat[@]}" -d "$1" "${@:2}"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# faiss-gpu-cuvs 1.15.1 is the CUDA 13 build (faiss-gpu 1.15.1 is CUDA 12 and would need ~600 MB of
# CUDA 12 cuBLAS; faiss-gpu-cu13-cuvs 1.15.0 is listed but has no wheel pip resolves for cp312).
dl "$tmp" faiss-gpu-cuvs==1.15.1 "libcuvs-cu13==26.6.*" "libraft-cu13==26.6.*" "librmm-cu13==26.6.*" "rapids-logger==0.2.*"
dl "$out/small" httptools uvloop
for f in "$tmp"/*.whl; do
  name=$(basename "$f")
  if [ "$(stat -c %s "$f")" -gt $((58*1024*1024)) ]; then
    split -b 58M -d "$f" "$out/parts/$name.part"
  else
    mv "$f" "$out/parts/$name"
  fi
done
# The tokenizer of all-MiniLM-L6-v2 is bert-base-uncased's, the vocabulary e5-base-v2 uses.
tok=$(python3 -c "from verl.utils.model_zoo import minilm_dir; print(minilm_dir())")
mkdir -p .bench/bert-tokenizer
for name in tokenizer.json vocab.txt tokenizer_config.json special_tokens_map.json; do
  cp "$tok/$name" .bench/bert-tokenizer/
done
# Carry plan: groups of parts of at most 60 MiB, one device call each.
python3 - "$out" <<'PY'
import os, sys
out = sys.argv[1]
files = sorted(os.listdir(os.path.join(out, "parts")), key=lambda n: -os.path.getsize(os.path.join(out, "parts", n)))
groups = []
for name in files:
    size = os.path.getsize(os.path.join(out, "parts", name))
    for g in groups:
        if g[0] + size <= 60 << 20:
            g[0] += size; g[1].append(name); break
    else:
        groups.append([size, [name]])
print(f"{len(groups)} transfer calls (each: command 'mkdir -p /tmp/parts-faiss && cp {out}/parts/* /tmp/parts-faiss/'):")
for size, names in groups:
    print(f"  {size / 2**20:5.1f} MiB carry {[os.path.join(out, 'parts', n) for n in names]}")
small = sum(os.path.getsize(os.path.join(out, "small", n)) for n in os.listdir(os.path.join(out, "small")))
print(f"final call also carries '{out}/small' ({small / 2**20:.1f} MiB) and '.bench' (tokenizer)")
PY
