# Shared by scripts/test.sh and scripts/demo.sh: install what is missing, configure, build.
# Sourced, not run. Works on a fresh Debian 12 machine as root.

WEFT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WEFT_BUILD="${WEFT_BUILD:-$WEFT_ROOT/build}"

# Debian packages the build, the tests and the demo need.
WEFT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev librocksdb-dev prometheus-cpp-dev libgtest-dev libgmock-dev
  libgloo-dev libopenblas-dev libcli11-dev libspdlog-dev nlohmann-json3-dev
  curl fortunes
  libsentencepiece-dev sentencepiece  # tokenizers; spm_encode is bench/data_prepare_bench.sh's baseline
  libpcre2-dev libutf8proc-dev  # tokenizer.json's byte-level BPE: its Unicode patterns, NFC
  python3-grpcio python3-protobuf  # examples/python and its test
  # tests/deploy/k8s_manifests_test.py: YAML lint, and the Kubernetes API models it checks
  # every manifest field against (no cluster or schema download needed).
  yamllint python3-yaml python3-kubernetes
  prometheus  # tests/deploy/prometheus_dashboards_test.sh runs it against a live job
  clang libclang-rt-14-dev llvm  # scripts/fuzz.sh: libFuzzer builds of the input decoders
)

weft_log() { printf '\033[1m[weft]\033[0m %s\n' "$*" >&2; }

weft_install_missing() {
  local missing=()
  for pkg in "${WEFT_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    weft_log "installing: ${missing[*]}"
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
}

# Configures once (CUDA is picked up when nvcc exists), then builds incrementally. A configure
# that fails stops here, with cmake's errors, rather than leaving ninja to report a missing or
# stale build.ninja.
weft_build() {
  if [[ ! -f "$WEFT_BUILD/build.ninja" ]]; then
    weft_log "configuring $WEFT_BUILD"
    weft_configure "$WEFT_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo || return 1
  elif ! ninja -C "$WEFT_BUILD" build.ninja >"$WEFT_BUILD/reconfigure.log" 2>&1; then
    # A CMakeLists.txt changed since the last configure and cmake now rejects it.
    cat "$WEFT_BUILD/reconfigure.log" >&2
    weft_log "cmake could not reconfigure $WEFT_BUILD (errors above)"
    return 1
  fi
  weft_log "building (this takes a few minutes the first time)"
  ninja -C "$WEFT_BUILD" -j"$(nproc)" "$@"
}

# weft_configure BUILD_DIR [CMAKE_ARG...]: configures the tree into BUILD_DIR with Ninja;
# cmake's errors (stderr) are shown, its progress is not. Fails if cmake does.
weft_configure() {
  local build=$1
  shift
  if ! cmake -S "$WEFT_ROOT" -B "$build" -G Ninja "$@" >/dev/null; then
    weft_log "cmake could not configure $build (errors above); nothing was built"
    return 1
  fi
}
