#!/usr/bin/env bash
# Builds Weft and runs its test suite (unit, integration, e2e; GPU tests skip without a GPU).
#   scripts/test.sh              everything
#   scripts/test.sh -L unit      only a label (any ctest arguments pass through)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

weft_install_missing
weft_build
cd "$WEFT_BUILD"
# Two tests at a time: each integration test runs several processes of its own.
ctest --output-on-failure --timeout 600 -j2 "$@"
