#!/bin/bash
# Packs what a run on the GPU machine needs into one file for the device tool's `carry`: the
# GPU binaries of this build (debug info stripped) with the Debian libraries they load
# (../shared/device/bundle.sh), iproute2's ip and tc and openssl (the GPU machine lacks the
# first two; the simulated cluster of bench/sim_cluster.sh needs all three: put the bundle's bin/
# on PATH), device-env.sh, the PyTorch peer and this repo's scripts/ and bench/.
# libweft_sentencepiece.so goes into bin/ beside the programs, which load it (dlopen, so ldd
# does not see it) for a SentencePiece tokenizer: `trainctl data prepare` and the workers of a
# job whose manifest names one; Debian's libsentencepiece it loads goes into lib/.
#   scripts/device_payload.sh [BUILD_DIR]     -> .device/payload.tar.gz (about 30 MB)
# EXTRA_BINS="weft-checkpointd ..." adds binaries. On the GPU machine:
#   mkdir -p /tmp/p && tar xzf .device/payload.tar.gz -C /tmp/p &&
#   source /tmp/p/device-env.sh /tmp/p/bundle && cd /tmp/p/repo &&
#   bash scripts/gpu_tests.sh /tmp/p/bundle/bin $OUT/logs
# WEFT_PAYLOAD_DEEPSPEED=1 adds deepspeed-wheels/ (about 21 MB more), for the DeepSpeed peers of
# bench/peers: DeepSpeed and its dependencies as wheels (bench/peers/deepspeed_wheels.sh, kept
# in ~/.cache/weft-deepspeed-wheels between payloads, not in .device/, which the device tool
# carries whole; needs the package index the first time). There:
#   export PYTHONPATH=$(bash /tmp/p/repo/bench/peers/install_deepspeed.sh \
#     /tmp/p/deepspeed-wheels /tmp/ds --build-ops)
# WEFT_PAYLOAD_DEEPSPEED_SKIP="numpy" leaves those wheels out (numpy is 16 of the 21 MB), for a
# machine that has them, when the payload must stay under the device tool's 64 MiB.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:-$repo/build}" && pwd)
shared=$(cd "$repo/../shared" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
bins="weft-worker weft-coordinator trainctl engine_cuda_bf16_ops_test
      engine_cuda_flash_attention_test engine_cuda_llama_ops_test engine_cuda_wire_codec_test
      nccl_communicator_test
      in_process_cuda_communicator_test
      zero_cuda_test gpu_worker_e2e_test cuda_ops_bench fp8_bench libweft_sentencepiece.so
      ${EXTRA_BINS:-}"
mkdir -p "$stage/stripped" "$stage/repo"
paths=()
for b in $bins; do
  f="$build/bin/$b"
  [[ -x "$f" ]] || { echo "device_payload: $f is missing (a CUDA build?)" >&2; exit 1; }
  strip --strip-debug -o "$stage/stripped/$b" "$f"
  paths+=("$stage/stripped/$b")
done
for tool in /usr/sbin/ip /usr/sbin/tc /usr/bin/openssl; do
  [[ -x $tool ]] && paths+=("$tool") || echo "device_payload: $tool missing (apt-get install iproute2 openssl)" >&2
done
bash "$shared/device/bundle.sh" "$stage/bundle" "${paths[@]}" >/dev/null
cp "$shared/device/device-env.sh" "$shared/bench/peer_fsdp_gpt.py" "$stage/"
cp -r "$repo/scripts" "$repo/bench" "$stage/repo/"
mkdir -p "$repo/.device"
extra=()
if [[ ${WEFT_PAYLOAD_DEEPSPEED:-0} == 1 ]]; then
  wheels=${XDG_CACHE_HOME:-$HOME/.cache}/weft-deepspeed-wheels
  cmp -s "$repo/bench/peers/deepspeed-requirements.txt" "$wheels/requirements.txt" || {
    rm -rf "$wheels"
    bash "$repo/bench/peers/deepspeed_wheels.sh" "$wheels"
  }
  cp -r "$wheels" "$stage/deepspeed-wheels"
  for skip in ${WEFT_PAYLOAD_DEEPSPEED_SKIP:-}; do rm -f "$stage/deepspeed-wheels/$skip"-*.whl; done
  extra=(deepspeed-wheels)
fi
tar czf "$repo/.device/payload.tar.gz" -C "$stage" bundle device-env.sh peer_fsdp_gpt.py repo \
  "${extra[@]}"
du -h "$repo/.device/payload.tar.gz" | cut -f1
