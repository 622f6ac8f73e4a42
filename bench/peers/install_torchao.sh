#!/bin/bash
# Installs torchao offline from its carried wheel (.device/wheels/, for peer_fsdp_families.py's
# --float8: the GPU machine's torch has no torchao and no network) into TARGET, a folder of its
# own, and prints TARGET: the PYTHONPATH entry that makes `import torchao` work.
#   export PYTHONPATH=$(bash bench/peers/install_torchao.sh WHEEL_DIR TARGET)${PYTHONPATH:+:$PYTHONPATH}
# The interpreter's own packages are never touched: the wheel goes into TARGET alone, with no
# index and no dependencies (torchao's float8 training needs only torch, which is there).
# PYTHON picks the interpreter (default python3: on the GPU machine, the torch venv's).
set -euo pipefail
wheels=$(cd "${1:?usage: install_torchao.sh WHEEL_DIR TARGET}" && pwd)
mkdir -p "${2:?target folder}"
target=$(cd "$2" && pwd)
py=${PYTHON:-python3}

shopt -s nullglob
whl=("$wheels"/torchao-*.whl)
((${#whl[@]} == 1)) || { echo "install_torchao: want one torchao-*.whl in $wheels, found ${#whl[@]}" >&2; exit 1; }

if "$py" -m pip --version >/dev/null 2>&1; then
  "$py" -m pip install --quiet --no-index --no-deps --no-warn-script-location --upgrade \
    --target "$target" "${whl[0]}" >&2
else
  # No pip in this interpreter: a wheel is a zip of its files laid out for site-packages.
  "$py" - "$target" "${whl[0]}" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[2]) as z:
    z.extractall(sys.argv[1], [n for n in z.namelist() if not n.split("/")[0].endswith(".data")])
PY
fi

export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
"$py" -c 'import torch, torchao
from torchao.float8 import convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp
print("install_torchao: torchao", torchao.__version__, "with torch", torch.__version__,
      "from", torchao.__file__)' >&2
echo "$target"
