#!/bin/bash
# Runs the GPU test binaries (CTest label `gpu`) from a folder of built binaries — for a GPU
# machine that got a bundle instead of a build tree (see docs/performance.md).
#   scripts/gpu_tests.sh BIN_DIR [LOG_DIR]
# Prints one line per test binary and the failures; exits non-zero if any failed.
set -uo pipefail
BIN=$(cd "${1:?bin dir}" && pwd)
LOGS=${2:-$(mktemp -d)}
mkdir -p "$LOGS"
export WEFT_BIN_DIR=$BIN  # where the e2e tests find weft-worker and weft-coordinator
failed=0
for t in engine_cuda_bf16_ops_test engine_cuda_flash_attention_test engine_cuda_llama_ops_test \
         engine_cuda_wire_codec_test \
         nccl_communicator_test in_process_cuda_communicator_test zero_cuda_test \
         gpu_worker_e2e_test; do
  timeout 300 "$BIN/$t" >"$LOGS/$t.log" 2>&1
  rc=$?
  [[ $rc == 0 ]] || failed=1
  echo "TEST $t rc=$rc $(grep -E '^\[  (PASSED|FAILED)  \]' "$LOGS/$t.log" | head -2 | tr '\n' ' ')"
done
grep -h "survivor released" "$LOGS/gpu_worker_e2e_test.log" 2>/dev/null
grep -h -B2 -A8 "Failure" "$LOGS"/*.log | head -80
exit $failed
