#!/usr/bin/env bash
# The tests whose GPU paths no CPU here can take (the host<->GPU moves of fsdp_config.param_offload, among
# others), run on the device after any driver's copy and prepare stages: pytest and its plugins travel in
# .whl-extra (pip download --no-deps pytest==9.2.0 iniconfig==2.3.1 pluggy==1.7.0 pygments==2.21.0
# pytest-timeout==2.4.0 -d .whl-extra), which prepare installs with .whl. One call, from the repo root:
#   bash benchmarks/device/gpu_tests.sh        # TESTS: the pytest arguments (default: the offload tests, the
#                                              # page-locked optimizer buffer among them, and the bf16
#                                              # reference against the actor's log-probs);
#                                              # PYTHON: the interpreter (python3)
# $OUT gets gpu_tests.xml (JUnit) and the exit status is pytest's. On a machine of two GPUs or more (nvidia-h200-x2):
#   TESTS="tests/workers/test_weight_sync.py tests/trainer/test_split_pools.py" bash benchmarks/device/gpu_tests.sh
# (split pools' NCCL weight broadcast, and the trainer's split runs with the engine on the second GPU).
set -uo pipefail
work=${WORK_DIR:-/tmp/gpu_tests}
source benchmarks/device/common.sh
read -r -a tests <<< "${TESTS:-tests/workers/test_param_offload.py tests/workers/test_device_placement.py tests/utils/test_optimizer_offload.py tests/workers/test_fsdp_workers.py::test_log_probs_ref_and_update}"
"${PYTHON:-python3}" -m pytest -q -p no:cacheprovider --junitxml="$out/gpu_tests.xml" "${tests[@]}" 2>&1 | tail -n 60
exit "${PIPESTATUS[0]}"
