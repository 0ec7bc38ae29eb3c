#!/usr/bin/env bash
# Issue 27: the wheels veRL 0.9.1 and TRL 1.16.0 need on the H200
# beyond its image and ../shared/device/wheels.sh's set, each peer in a site of its own so that no peer
# changes ours and ours changes no peer (veRL pins transformers <5.11 and tensordict <=0.10; the device
# has transformers 5.17 and our site tensordict 0.15).
#   here (repo root):  bash benchmarks/device/peer_wheels.sh          # fills .whl-peers/ (~47 MB: one carry)
#   device, carrying .whl-peers (after our own wheels are installed in /tmp/site):
#     STAGE=install bash benchmarks/device/peer_wheels.sh   # /tmp/site-verl and /tmp/site-trl, then an import check
#   a peer's runs: PYTHONPATH=/tmp/site-verl:/tmp/site (veRL: its transformers and tensordict first),
#                  PYTHONPATH=/tmp/site-trl:/tmp/site (TRL with the device's transformers)
set -euo pipefail
shared=(datasets dill multiprocess xxhash fsspec pandas python-dateutil pytz tzdata)
# TransferQueue: veRL 0.9.1's default trainer (trainer.use_v1=true) imports it (its extra "verl-core")
# tokenizers: transformers 5.9.0 refuses to import beside the device's tokenizers 0.23.2 (it needs <= 0.23.0)
verl=(verl==0.9.1 transformers==5.9.0 tokenizers==0.22.2 tensordict==0.10.0 codetiming torchdata TransferQueue==0.1.11)
trl=(trl==1.16.0)
# veRL's rollout is vLLM's OpenAI server, whose imports go beyond what our in-process engine needs (and so
# beyond .whl/install.sh's set): these with their dependencies, installed only where the device lacks them
vllm_server=(watchfiles "model-hosting-container-standards>=0.1.14,<1" "prometheus-fastapi-instrumentator>=8"
  python-json-logger ijson setproctitle blake3 "anthropic>=0.71" mcp diskcache==5.6.3 lark==1.2.2)
case "${STAGE:-download}" in
  download)
    root=$(git rev-parse --show-toplevel) && cd "$root"
    grep -qxF '/.whl-peers/' .git/info/exclude 2>/dev/null || echo '/.whl-peers/' >> .git/info/exclude
    rm -rf .whl-peers && mkdir -p .whl-peers/common .whl-peers/verl .whl-peers/trl .whl-peers/vllm-server
    dl_with_deps() { python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
             --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
             -d "$1" "${@:2}"; }
    dl() { dl_with_deps "$1" --no-deps "${@:2}"; }
    dl .whl-peers/verl "${verl[@]}"
    dl_with_deps .whl-peers/vllm-server "${vllm_server[@]}"
    # published as a source archive only: built here (pure Python), so the device needs no build tools
    python3 -m pip wheel -q --no-deps -w .whl-peers/verl pylatexenc==2.11
    dl .whl-peers/trl "${trl[@]}"
    dl .whl-peers/common "${shared[@]}"  # both peers' (datasets and what it imports)
    du -sh .whl-peers
    ;;
  install)
    for peer in verl trl; do
      python3 -m pip install -q --no-deps --no-index --target "/tmp/site-$peer" .whl-peers/$peer/* .whl-peers/common/*
    done
    PYTHONPATH=/tmp/site-verl:/tmp/site python3 benchmarks/device/install_missing.py .whl-peers/vllm-server /tmp/site-verl
    # from outside the repo: there `import verl` would find ours (the current folder comes first)
    cd /tmp
    # the trainer and its vLLM server (which imports the OpenAI server's whole stack)
    PYTHONPATH=/tmp/site-verl:/tmp/site python3 -c "import importlib.metadata as m, transformers, transfer_queue, \
verl.trainer.main_ppo, verl.workers.rollout.vllm_rollout.vllm_async_server
print('veRL', *(m.version(p) for p in ('verl', 'transformers', 'tensordict')))"
    PYTHONPATH=/tmp/site-trl:/tmp/site python3 -c \
      "import importlib.metadata as m; from trl import GRPOTrainer; print('TRL', *(m.version(p) for p in ('trl', 'transformers')))"
    ;;
esac
