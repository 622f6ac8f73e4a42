#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang and runs each for a bounded time; exits
# non-zero on any finding. See docs/fuzzing.md.
#   scripts/fuzz.sh              30 s per fuzzer
#   scripts/fuzz.sh 3600         an hour per fuzzer
# Environment:
#   WEFT_FUZZ_BUILD   build directory (default build-fuzz); findings and the grown corpus are
#                     kept under its fuzz/ directory
#   WEFT_FUZZ_JOBS    ninja -j (default: all cores)
#   WEFT_FUZZERS      which fuzzers, space-separated (default: all)
#   WEFT_FUZZ_ARGS    extra libFuzzer flags for every fuzzer, e.g. "-seed=1 -use_value_profile=1"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

seconds="${1:-30}"
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -gt 0 ]] || { weft_log "usage: $0 [SECONDS]"; exit 2; }
build="${WEFT_FUZZ_BUILD:-$WEFT_ROOT/build-fuzz}"
read -r -a fuzzers <<<"${WEFT_FUZZERS:-job_spec_fuzzer checkpoint_chunk_fuzzer}"
read -r -a extra_args <<<"${WEFT_FUZZ_ARGS:-}"

# llvm: llvm-symbolizer, so that sanitizer reports name functions and lines.
weft_install_missing clang libclang-rt-14-dev llvm

# Its own build: clang, sanitizers, and no CUDA (nvcc would want its own host compiler, and
# nothing fuzzed is CUDA code). Configured once, then incremental.
if [[ ! -f "$build/build.ninja" ]] || ! grep -qs '^WEFT_FUZZ:BOOL=ON$' "$build/CMakeCache.txt"; then
  weft_log "configuring $build (clang, WEFT_FUZZ=ON)"
  CC=clang CXX=clang++ weft_configure "$build" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWEFT_FUZZ=ON -DWEFT_ENABLE_CUDA=OFF
fi
weft_log "building ${fuzzers[*]}"
ninja -C "$build" -j"${WEFT_FUZZ_JOBS:-$(nproc)}" "${fuzzers[@]}"
weft_log "configured and built in ${SECONDS}s"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

failed=0
for fuzzer in "${fuzzers[@]}"; do
  name="${fuzzer%_fuzzer}"
  seeds="$WEFT_ROOT/tests/fuzz/corpus/$name"
  corpus="$build/fuzz/corpus/$name"    # new inputs land here; the checked-in seeds stay as they are
  findings="$build/fuzz/findings/$name"
  log="$build/fuzz/$name.log"
  mkdir -p "$corpus" "$findings"
  stamp="$build/fuzz/$name.started"  # tells this run's findings from earlier ones
  touch "$stamp"
  args=(-max_total_time="$seconds" -timeout=10 -max_len=4096 -print_final_stats=1
        -artifact_prefix="$findings/")
  [[ -f "$WEFT_ROOT/tests/fuzz/$name.dict" ]] && args+=(-dict="$WEFT_ROOT/tests/fuzz/$name.dict")
  weft_log "fuzzing $fuzzer for ${seconds}s (log: $log)"
  rc=0
  "$build/bin/$fuzzer" "${args[@]}" "${extra_args[@]}" "$corpus" "$seeds" >"$log" 2>&1 || rc=$?

  # libFuzzer's final stats and its last status line ("#N DONE cov: C ft: F corp: K/SIZE ...").
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$last")
  cov=$(sed -n 's/.* cov: \([0-9]*\) .*/\1/p' <<<"$last")
  if ((rc == 0)); then
    echo "fuzz: $fuzzer ok: ${execs:-?} executions (${rate:-?}/s) in ${seconds}s," \
      "corpus ${corp:-?} inputs, coverage ${cov:-?} edges"
  else
    failed=1
    # The report, from its first line (sanitizer, UBSan, libFuzzer or a broken invariant) on.
    first=$(grep -nm1 -E '==[0-9]+== ?ERROR|runtime error:|invariant broken|^ALARM' "$log" |
      cut -d: -f1 || true)
    tail -n +"${first:-1}" "$log" | head -n 80 >&2
    echo "fuzz: $fuzzer FAILED (exit $rc) after ${execs:-?} executions; input(s) in $findings:" \
      "$(find "$findings" -type f -newer "$stamp" -printf '%f ')- reproduce with:" \
      "$build/bin/$fuzzer FILE"
  fi
done
exit "$failed"
