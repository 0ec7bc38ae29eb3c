#!/usr/bin/env bash
# Device-side driver of benchmarks/retriever_scale.py (issue 21, part 1) on one H200, repo root.
# Carried: .whl (bash ../shared/device/wheels.sh), .whl-faiss/small and .bench
# (benchmarks/device/fetch_faiss_gpu_wheels.sh); optionally the FAISS GPU parts, copied to
# /tmp/parts-faiss by earlier calls (without them only the torch search backend is measured).
#   SEARCH_R1_COMMIT=<sha> bash benchmarks/device/retriever_scale.sh          # all stages, one call
#   STAGES=load,ann bash benchmarks/device/retriever_scale.sh                  # rerun stages, warm machine
# /tmp/scale keeps the data and the report between calls; each call's $OUT gets the whole report so far.
# Env: NUM_VECTORS (default 10,000,000, lowered to what the disk holds), SEARCH_R1_COMMIT, TIME_BUDGET_S.
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
out=${OUT:-benchmarks/results}
mkdir -p "$out"
[ -d /tmp/site/fastapi ] || bash .whl/install.sh
if [ -d .whl-faiss/small ] && [ ! -d /tmp/site/uvloop ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-faiss/small/*.whl
fi
if [ -d /tmp/parts-faiss ] && [ ! -d /tmp/site-faiss/faiss ]; then
  mkdir -p /tmp/faiss-whl
  for first in /tmp/parts-faiss/*.part00; do
    [ -e "$first" ] || continue
    name=$(basename "${first%.part00}")
    cat /tmp/parts-faiss/"$name".part* > /tmp/faiss-whl/"$name"
  done
  cp /tmp/parts-faiss/*.whl /tmp/faiss-whl/ 2>/dev/null || true
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-faiss /tmp/faiss-whl/*.whl \
    && rm -rf /tmp/faiss-whl /tmp/parts-faiss
fi
export PYTHONPATH=/tmp/site:$PWD
# libcuvs resolves cuSOLVER/cuSPARSE/NCCL through the loader: point it at torch's CUDA 13 wheels.
nv=$(python3 -c "import glob, site; print(':'.join(sorted({d for s in site.getsitepackages() for d in glob.glob(s + '/nvidia/*/lib')})))")
export LD_LIBRARY_PATH=${nv}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
df -h /tmp | tail -1
num=${NUM_VECTORS:-10000000}
if [ ! -f /tmp/scale/data.json ]; then
  free=$(df --output=avail -B1 /tmp | tail -1)
  fit=$(( (free - 4*1024*1024*1024) / (768*4 + 1600) ))
  if [ "$fit" -lt "$num" ]; then echo "only ${fit} vectors fit on /tmp: using that many"; num=$fit; fi
else
  num=$(python3 -c "import json; print(json.load(open('/tmp/scale/data.json'))['config']['num_vectors'])")
fi
timeout -k 10 "${TIMEOUT_S:-570}" python3 benchmarks/retriever_scale.py --data_dir /tmp/scale --num_vectors "$num" \
    --output "$out/paper_scale_retriever.json" --stages "${STAGES:-gen,start,load,ann}" \
    --faiss_gpu_site /tmp/site-faiss --tokenizer .bench/bert-tokenizer --time_budget_s "${TIME_BUDGET_S:-480}"
echo "retriever_scale exit: $?"
df -h /tmp | tail -1
