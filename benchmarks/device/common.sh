# Sourced by the device drivers (learning_run.sh, learning_step_speed.sh) with $work set: the device's
# environment and the two stages they share. /tmp/parts and $work last while the machine is held.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 SEARCH_R1_CACHE=$work/cache
export PYTHONPATH=/tmp/site:$PWD
out=${OUT:-benchmarks/results}
mkdir -p "$out" /tmp/parts "$work"

copy_carried() {  # the wheel parts and the learning data this call carried
  cp .whl-big/* /tmp/parts/ 2>/dev/null
  [ -d data/learning ] && mkdir -p "$work/data" && cp -r data/learning/* "$work/data/"
  ls /tmp/parts "$work/data" 2>/dev/null | tr '\n' ' '; echo
}

install_wheels() {  # the parts copied so far and .whl (carried by this call), into /tmp/site once
  mkdir -p .whl-big && cp /tmp/parts/* .whl-big/
  local started
  started=$(date +%s)
  [ -d /tmp/site/vllm ] || bash .whl/install.sh >/dev/null || return 1
  echo "install: $(( $(date +%s) - started )) s"
}
