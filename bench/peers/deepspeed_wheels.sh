#!/bin/bash
# Fills OUT_DIR with the wheels of bench/peers/deepspeed-requirements.txt, for a GPU machine
# without network (CPython 3.12, x86_64 Linux): DeepSpeed built here as a pure-Python wheel, and
# its dependencies downloaded as wheels for that interpreter. Needs pip and the package index.
#   bench/peers/deepspeed_wheels.sh OUT_DIR
# scripts/device_payload.sh runs it for WEFT_PAYLOAD_DEEPSPEED=1; bench/peers/install_deepspeed.sh
# installs the result on the GPU machine.
set -euo pipefail
out=${1:?usage: deepspeed_wheels.sh OUT_DIR}
req="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/deepspeed-requirements.txt"
py=${PYTHON:-python3}
mkdir -p "$out"
ds=$(grep -E '^deepspeed==' "$req")
# DeepSpeed is published as an sdist only. Its setup.py compiles ops only when it can import
# torch; pip's isolated build environment has no torch, so the wheel holds the Python code and
# the C++/CUDA sources, and the ops build just in time on the GPU machine (DS_BUILD_OPS=0 says
# the same explicitly). The wheel is py3-none-any: this machine's Python version does not matter.
DS_BUILD_OPS=0 "$py" -m pip wheel --quiet --no-deps --no-binary deepspeed -w "$out" "$ds"
# The rest as binary wheels for the GPU machine's interpreter. --no-deps: the file is the whole
# closure already (pip would otherwise want torch and its CUDA wheels, gigabytes).
grep -vE '^(#|deepspeed==|$)' "$req" >"$out/deps.txt"
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 -d "$out" -r "$out/deps.txt"
rm "$out/deps.txt"
cp "$req" "$out/requirements.txt"  # what these wheels are; device_payload.sh compares it
