#!/bin/bash
# Installs DeepSpeed offline from the wheels of bench/peers/deepspeed_wheels.sh (carried in the
# payload as deepspeed-wheels/ with WEFT_PAYLOAD_DEEPSPEED=1) into TARGET, a folder of its own,
# and prints TARGET: the PYTHONPATH entry that makes `import deepspeed` work.
#   export PYTHONPATH=$(bash bench/peers/install_deepspeed.sh WHEEL_DIR TARGET [--build-ops])${PYTHONPATH:+:$PYTHONPATH}
# The interpreter's own packages are never touched: everything goes into TARGET, torch is never
# installed (the deepspeed wheel's requirements are not followed), and a wheel whose package the
# interpreter already has at the same or a newer version is left out, so TARGET does not shadow
# it. --build-ops compiles the CUDA ops the peer uses (ZeRO++'s quantizer, FusedAdam) into
# TORCH_EXTENSIONS_DIR now rather than inside the first timed run; they need nvcc (CUDA_HOME or
# /usr/local/cuda), ninja and a C++ compiler, not a GPU.
# PYTHON picks the interpreter (default python3: on the GPU machine, the torch venv's).
set -euo pipefail
wheels=$(cd "${1:?usage: install_deepspeed.sh WHEEL_DIR TARGET [--build-ops]}" && pwd)
mkdir -p "${2:?target folder}"
target=$(cd "$2" && pwd)
py=${PYTHON:-python3}
# The same defaults as bench/peers/deepspeed_zeropp.py, so ops built here are the ones it loads.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/weft-torch-extensions}
# DeepSpeed's op builder parses each entry as numbers: "9.0a" (which the GPU machine's
# environment may set) fails it, so the arch-specific suffix goes.
TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST//a/}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$CUDA_HOME/bin:$target/bin:$PATH"

# Which wheels the interpreter lacks (or has older).
mapfile -t todo < <("$py" - "$wheels" <<'PY'
import glob, os, sys
from importlib import metadata
try:
    from packaging.version import Version
except ImportError:
    try:
        from pip._vendor.packaging.version import Version
    except ImportError:  # plain numeric versions are all this list has
        def Version(v):
            return tuple(int(p) if p.isdigit() else 0 for p in v.split("."))
for whl in sorted(glob.glob(os.path.join(sys.argv[1], "*.whl"))):
    name, version = os.path.basename(whl).split("-")[:2]
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have is not None and name != "deepspeed" and Version(have) >= Version(version):
        print(f"install_deepspeed: {name} {have} already there (wheel {version})", file=sys.stderr)
        continue
    print(whl)
PY
)
((${#todo[@]} > 0)) || { echo "install_deepspeed: no wheels in $wheels" >&2; exit 1; }

if "$py" -m pip --version >/dev/null 2>&1; then
  "$py" -m pip install --quiet --no-index --no-deps --no-warn-script-location --upgrade \
    --target "$target" "${todo[@]}" >&2
else
  # No pip in this interpreter: a wheel is a zip of its files laid out for site-packages (its
  # .data/ scripts aside, which the peers do not need).
  "$py" - "$target" "${todo[@]}" <<'PY'
import sys, zipfile
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        z.extractall(sys.argv[1], [n for n in z.namelist() if not n.split("/")[0].endswith(".data")])
PY
fi

export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
"$py" -c 'import deepspeed, torch; print("install_deepspeed: deepspeed", deepspeed.__version__,
    "with torch", torch.__version__, "from", deepspeed.__file__)' >&2
if [[ ${3:-} == --build-ops ]]; then
  "$py" - <<'PY' >&2
import time
from deepspeed.ops.op_builder import FusedAdamBuilder, QuantizerBuilder
for builder in (QuantizerBuilder(), FusedAdamBuilder()):
    t = time.time()
    builder.load(verbose=False)
    print(f"install_deepspeed: op {builder.name} ready in {time.time() - t:.0f} s")
PY
fi
echo "$target"
