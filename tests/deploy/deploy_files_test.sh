#!/bin/bash
# The deploy files match the code: every flag an ExecStart line of deploy/systemd passes is one
# the named binary accepts (its --help lists it), every ${VAR} or $VAR it uses is set in
# weft.env, and so are the flags in the example of WEFT_WORKER_NETWORK_FLAGS.
#   tests/deploy/deploy_files_test.sh BIN_DIR
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$(cd "${1:?bin dir}" && pwd)
UNITS=$ROOT/deploy/systemd
failed=0
checked=0
for unit in "$UNITS"/*.service; do
  line=$(grep '^ExecStart=' "$unit") || { echo "FAIL: $unit has no ExecStart" >&2; failed=1; continue; }
  binary=$(basename "$(sed 's/^ExecStart=\([^ ]*\).*/\1/' <<<"$line")")
  [[ -x $BIN/$binary ]] || { echo "FAIL: $unit runs $binary, which is not built" >&2; failed=1; continue; }
  help=$("$BIN/$binary" --help)
  for flag in $(grep -o -- ' --[a-z-]*' <<<"$line"); do
    checked=$((checked + 1))
    grep -q -- "$flag\b" <<<"$help" || { echo "FAIL: $unit passes $flag, which $binary does not accept" >&2; failed=1; }
  done
  # ${VAR} (one word) and $VAR (split into words by systemd).
  for var in $(grep -oE '\$\{?[A-Z_]+\}?' <<<"$line" | tr -d '${}'); do
    grep -q "^$var=" "$UNITS/weft.env" || { echo "FAIL: $unit uses \${$var}, which weft.env does not set" >&2; failed=1; }
  done
done
example=$(grep -o '^#   WEFT_WORKER_NETWORK_FLAGS=.*' "$UNITS/weft.env" | cut -d= -f2-)
[[ -n $example ]] || { echo "FAIL: weft.env shows no example of WEFT_WORKER_NETWORK_FLAGS" >&2; failed=1; }
for flag in $(grep -o -- '--[a-z-]*' <<<"$example"); do
  checked=$((checked + 1))
  grep -q -- "$flag\b" <<<"$("$BIN/weft-worker" --help)" || { echo "FAIL: weft.env's example passes $flag, which weft-worker does not accept" >&2; failed=1; }
done
# A deliberately wrong flag must be caught (the check is not vacuous).
grep -q -- "--no-such-flag\b" <<<"$("$BIN/weft-coordinator" --help)" && { echo "FAIL: the help check accepts anything" >&2; failed=1; }
((checked >= 10)) || { echo "FAIL: only $checked flags checked" >&2; failed=1; }
((failed == 0)) && echo "PASS: $checked flags in $(ls "$UNITS"/*.service | wc -l) units"
exit $failed
