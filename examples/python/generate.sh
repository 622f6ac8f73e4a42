#!/bin/bash
# Generates the Python modules of the weft.v1 API (messages and gRPC stubs) from
# protos/weft/v1 into OUT_DIR, with Debian's protoc and grpc_python_plugin
# (protobuf-compiler, protobuf-compiler-grpc). Import them as `from weft.v1 import ...`.
# protos/weft/v1/service_config.json (which calls are safe to retry) goes beside them.
#   examples/python/generate.sh OUT_DIR
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${1:?output folder}
mkdir -p "$OUT"
protoc -I "$ROOT/protos" --python_out="$OUT" --grpc_python_out="$OUT" \
  --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" \
  "$ROOT"/protos/weft/v1/*.proto
touch "$OUT/weft/__init__.py" "$OUT/weft/v1/__init__.py"
cp "$ROOT/protos/weft/v1/service_config.json" "$OUT/weft/v1/"
