#!/bin/bash
# The Python client (examples/python) against live services on 127.0.0.1: stubs generated from
# protos/weft/v1, a coordinator, a checkpointd and two CPU workers, secured as in production
# (mutual TLS everywhere, a bearer token on every coordinator call); the client submits a small
# job, watches it to SUCCEEDED and lists its checkpoints (also across a checkpointd restart),
# and weft_model.py reads the trained model's file; bad input gets the servers' errors,
# and so does a client without a token or without a certificate.
#   tests/python/python_client_test.sh BIN_DIR
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$(cd "${1:?bin dir}" && pwd)
WORK=$(mktemp -d "${TEST_TMPDIR:-/tmp}/weft-python-test.XXXXXX")
source "$ROOT/scripts/procs.sh"
weft_stop_at_exit KILL "$WORK"
fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/*.log; do echo "--- $f" >&2; tail -n 20 "$f" >&2; done
  exit 1
}

"$ROOT/examples/python/generate.sh" "$WORK/stubs"
export WEFT_PYTHON_STUBS=$WORK/stubs
# Debian's interpreter, which has python3-grpcio and python3-protobuf (not a pyenv one).
PYTHON=${WEFT_PYTHON:-/usr/bin/python3}

# A CA, a certificate for the servers (127.0.0.1) and one for the clients.
PKI=$WORK/pki
mkdir -p "$PKI"
ssl() { openssl "$@" 2>>"$PKI/openssl.log" || fail "openssl $1 failed: $(cat "$PKI/openssl.log")"; }
ssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$PKI/ca.key" \
  -out "$PKI/ca.pem" -days 2 -subj /CN=weft-python-test-ca
for name in server client; do
  ssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$PKI/$name.key" \
    -out "$PKI/$name.csr" -subj "/CN=weft-python-test-$name"
  echo "subjectAltName=IP:127.0.0.1" >"$PKI/$name.ext"
  ssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.pem" -CAkey "$PKI/ca.key" -CAcreateserial \
    -out "$PKI/$name.pem" -days 2 -extfile "$PKI/$name.ext"
done
SERVER_TLS=(--tls-cert="$PKI/server.pem" --tls-key="$PKI/server.key" --tls-ca="$PKI/ca.pem")
CLIENT_TLS=(--tls-cert="$PKI/client.pem" --tls-key="$PKI/client.key" --tls-ca="$PKI/ca.pem")
TOKEN=python-test-token-0c7f1e2d
echo "$TOKEN" >"$WORK/tokens"
export WEFT_TOKEN=$TOKEN  # for the workers and the client
CLIENT=("$PYTHON" "$ROOT/examples/python/weft_client.py" "${CLIENT_TLS[@]}")

weft_serve "$WORK/coordinator" "$BIN/weft-coordinator" --data-dir="$WORK/coordinator" \
  --metrics-address=none "${SERVER_TLS[@]}" --auth-tokens-file="$WORK/tokens" ||
  fail "weft-coordinator did not start"
weft_serve "$WORK/checkpointd" "$BIN/weft-checkpointd" --data-dir="$WORK/checkpoints" \
  --metrics-address=none "${SERVER_TLS[@]}" --auth-tokens-file="$WORK/tokens" ||
  fail "weft-checkpointd did not start"
CHECKPOINTD_PID=$WEFT_SPAWNED_PID
for i in 0 1; do
  weft_spawn "$WORK/worker$i.log" "$BIN/weft-worker" --device="cpu:$i" --metrics-address=none \
    --output-dir="$WORK/models" "${CLIENT_TLS[@]}"
done

# Every method service_config.json names exists (gRPC ignores a name that matches nothing).
PYTHONPATH=$WEFT_PYTHON_STUBS "$PYTHON" - <<'PY' || fail "service_config.json: see above"
import json, os, sys
import weft.v1
from weft.v1 import checkpoint_pb2, coordinator_pb2
services = {}
for module in (checkpoint_pb2, coordinator_pb2):
    for s in module.DESCRIPTOR.services_by_name.values():
        services[s.full_name] = set(s.methods_by_name)
config = json.load(open(os.path.join(os.path.dirname(weft.v1.__file__), "service_config.json")))
bad = [n for c in config["methodConfig"] for n in c["name"]
       if n.get("method") not in services.get(n["service"], ())]
if bad:
    sys.exit(f"service_config.json names methods the protos do not have: {bad}")
PY

"$PYTHON" -c "print('the quick brown fox jumps over the lazy dog. ' * 400)" >"$WORK/corpus.txt"
cat >"$WORK/job.pb.txt" <<SPEC
name: "python"
model { num_layers: 2 hidden_size: 32 num_heads: 2 vocab_size: 256 context_length: 32 }
data { train_path: "$WORK/corpus.txt" format: DATA_FORMAT_TEXT_BYTES }
optimizer { learning_rate: 0.01 }
training { total_steps: 30 micro_batch_size: 4 }
zero_stage: 3
resources { device_kind: DEVICE_KIND_CPU min_workers: 2 }
checkpoint { interval_steps: 10 keep_last: 2 }
SPEC

# The whole flow: submit, watch to the end, list checkpoints.
out=$(timeout 120 "${CLIENT[@]}" run "$WORK/job.pb.txt") || fail "run exited $?: $out"
job=$(sed -n 's/^submitted //p' <<<"$out")
[[ -n $job ]] || fail "no job id in: $out"
grep -q "^$job SUCCEEDED step 30/30 loss" <<<"$out" || fail "no SUCCEEDED line in: $out"
grep -q "^checkpoint $job step 30 world 2" <<<"$out" || fail "step-30 checkpoint not listed: $out"
# The other one kept is the step-20 save, or the step it was deferred to when step 10's upload
# was still in flight at step 20 (a loaded machine; Checkpointer::ShouldSave).
before=$(sed -n "s/^checkpoint $job step \([0-9]*\) world 2\$/\1/p" <<<"$out" | sed -n 2p)
[[ -n $before && $before -ge 20 && $before -lt 30 ]] ||
  fail "expected the checkpoint before step 30 at step 20-29 (keep_last 2): $out"

# The pieces on their own.
[[ $("${CLIENT[@]}" checkpoints "$job" | wc -l) == 2 ]] || fail "keep_last 2: expected 2 checkpoints"
"${CLIENT[@]}" watch "$job" | grep -q "SUCCEEDED" || fail "watch of an ended job"

# checkpointd is killed, and started again on its port and data while a client lists: the
# client waits for it (a client that called at once would fail with UNAVAILABLE).
kill -KILL "$CHECKPOINTD_PID"
wait "$CHECKPOINTD_PID" 2>/dev/null || true
WEFT_RECONNECT_WAIT_S=60 "${CLIENT[@]}" checkpoints "$job" >"$WORK/listed.txt" 2>&1 &
lister=$!
sleep 2  # the interpreter's start, then the client finds nothing listening
weft_spawn "$WORK/checkpointd-restarted.log" "$BIN/weft-checkpointd" \
  --listen="${WEFT_CHECKPOINTD}" --data-dir="$WORK/checkpoints" --metrics-address=none \
  "${SERVER_TLS[@]}" --auth-tokens-file="$WORK/tokens"
wait "$lister" || fail "listing across a checkpointd restart: $(cat "$WORK/listed.txt")"
[[ $(grep -c "^checkpoint $job step" "$WORK/listed.txt") == 2 ]] ||
  fail "the restarted checkpointd did not list both checkpoints: $(cat "$WORK/listed.txt")"

# The trained model's file: weft_model.py reads its spec and tokenizer (bytes: no .model).
MODEL=$WORK/models/$job/model.safetensors
info=$("$PYTHON" "$ROOT/examples/python/weft_model.py" "$MODEL") || fail "weft_model.py: $info"
grep -q '"kind": "bytes"' <<<"$info" || fail "the bytes tokenizer is not recorded: $info"
grep -q 'name: \\"python\\"' <<<"$info" || fail "no job spec in: $info"
if err=$("$PYTHON" "$ROOT/examples/python/weft_model.py" "$MODEL" \
    --tokenizer-out "$WORK/x.model" 2>&1); then
  fail "a bytes model wrote a SentencePiece model"
fi
grep -q "no SentencePiece tokenizer to write (tokenizer: bytes)" <<<"$err" || fail "unclear: $err"
if err=$("$PYTHON" "$ROOT/examples/python/weft_model.py" "$WORK/job.pb.txt" 2>&1); then
  fail "a job spec was read as a model file"
fi
grep -q "job.pb.txt: not a safetensors file" <<<"$err" || fail "the file is not named: $err"

# Bad input: the servers' own errors come back, naming what is wrong.
sed 's/learning_rate: 0.01/learning_rate: -1/' "$WORK/job.pb.txt" >"$WORK/bad.pb.txt"
if err=$("${CLIENT[@]}" submit "$WORK/bad.pb.txt" 2>&1); then fail "a negative learning rate was accepted"; fi
grep -q "INVALID_ARGUMENT" <<<"$err" || fail "no INVALID_ARGUMENT: $err"
grep -q "optimizer.learning_rate" <<<"$err" || fail "the field is not named: $err"
for wait in soon -1 nan; do
  if err=$(WEFT_RECONNECT_WAIT_S=$wait "${CLIENT[@]}" watch "$job" 2>&1); then
    fail "WEFT_RECONNECT_WAIT_S=$wait was accepted"
  fi
  grep -q "WEFT_RECONNECT_WAIT_S: '$wait' is not a number of seconds" <<<"$err" ||
    fail "WEFT_RECONNECT_WAIT_S=$wait: unclear: $err"
done
if err=$("${CLIENT[@]}" watch no-such-job-1 2>&1); then fail "watching an unknown job succeeded"; fi
grep -q "NOT_FOUND" <<<"$err" || fail "no NOT_FOUND: $err"
printf 'name: "x"\nmodel { num_layers: }\n' >"$WORK/syntax.pb.txt"
if err=$("${CLIENT[@]}" submit "$WORK/syntax.pb.txt" 2>&1); then fail "a syntax error was accepted"; fi
grep -q "2:" <<<"$err" || fail "the syntax error does not name its line: $err"
# Security: the coordinator refuses a client without the token, and the servers one without a
# certificate from the CA.
if err=$(WEFT_TOKEN= "${CLIENT[@]}" watch "$job" 2>&1); then fail "a client without a token got in"; fi
grep -q "UNAUTHENTICATED" <<<"$err" || fail "no UNAUTHENTICATED without a token: $err"
if err=$(timeout 60 "$PYTHON" "$ROOT/examples/python/weft_client.py" --tls-ca="$PKI/ca.pem" \
    checkpoints "$job" 2>&1); then
  fail "a client without a certificate got in"
fi
grep -q "UNAVAILABLE" <<<"$err" || fail "no UNAVAILABLE without a client certificate: $err"
echo "PASS: python client (job $job), over mutual TLS with a token"
