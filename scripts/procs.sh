# Starting Weft's processes from a script and ending them when it exits: shared by
# scripts/demo.sh, the benches (bench/*.sh) and the script tests (tests/deploy, tests/python).
# Sourced, not run; the caller sets -euo pipefail.

WEFT_PIDS=()           # what weft_spawn started; weft_stop_all ends them
WEFT_STOP_SIGNAL=TERM  # TERM lets a worker finish its step; tests pick KILL, they keep nothing
WEFT_REMOVE_AT_EXIT=() # folders removed once the processes are gone

# weft_stop_all: ends every process weft_spawn started and waits for them (and for any other
# child the script left running), then removes WEFT_REMOVE_AT_EXIT.
weft_stop_all() {
  local pid
  for pid in "${WEFT_PIDS[@]}"; do kill -s "$WEFT_STOP_SIGNAL" "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if ((${#WEFT_REMOVE_AT_EXIT[@]})); then rm -rf "${WEFT_REMOVE_AT_EXIT[@]}"; fi
}

# weft_stop PID...: ends those processes (TERM) and waits until they are gone.
weft_stop() {
  local pid
  for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
  for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
}

# weft_stop_at_exit SIGNAL [FOLDER...]: weft_stop_all with SIGNAL when the script exits, however
# it exits, then removes the FOLDERs.
weft_stop_at_exit() {
  WEFT_STOP_SIGNAL=$1
  shift
  WEFT_REMOVE_AT_EXIT=("$@")
  trap weft_stop_all EXIT
}

# weft_spawn LOG COMMAND [ARG...]: runs COMMAND in the background with its output in LOG; its
# pid is in WEFT_SPAWNED_PID. A function, not a $(...), so the process stays this shell's child.
weft_spawn() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  WEFT_SPAWNED_PID=$!
  WEFT_PIDS+=("$WEFT_SPAWNED_PID")
}

# weft_wait_for_file FILE [SECONDS]: until FILE is non-empty (a port file is written once the
# port is bound); 20 s by default. Says which file on a timeout, and fails.
weft_wait_for_file() {
  local tries=$((${2:-20} * 20)) i
  for ((i = 0; i < tries; i++)); do
    [[ -s $1 ]] && return 0
    sleep 0.05
  done
  echo "timed out waiting for $1" >&2
  return 1
}

# weft_serve PREFIX PROGRAM [ARG...]: starts a server (weft-coordinator or weft-checkpointd) on
# a port it picks, logging to PREFIX.log and writing the port to PREFIX.port;
# waits for the port, then exports the address as the variable the clients and workers read
# (WEFT_COORDINATOR or WEFT_CHECKPOINTD). Its pid is in WEFT_SPAWNED_PID. If the port does not
# come, prints the end of the log and fails.
# WEFT_SERVE_HOST (default 127.0.0.1) is the address it listens on: 0.0.0.0 also serves the
# network namespaces of a simulated cluster (bench/sim_cluster.sh); the exported address stays
# 127.0.0.1 either way.
weft_serve() {
  local prefix=$1 program=$2
  shift 2
  local name
  name=$(basename "$program")
  name=${name#weft-}
  rm -f "$prefix.port"
  weft_spawn "$prefix.log" "$program" --listen="${WEFT_SERVE_HOST:-127.0.0.1}:0" \
    --port-file="$prefix.port" "$@"
  weft_wait_for_file "$prefix.port" || { tail -n 20 "$prefix.log" >&2; return 1; }
  export "WEFT_${name^^}=127.0.0.1:$(cat "$prefix.port")"
}

# weft_run_job TRAINCTL SPEC_FILE OUT_JSONL LOG...: submits the spec, follows the job to its end
# keeping every status update (`trainctl watch -o json`) in OUT_JSONL, and prints the job's id.
# If the job does not succeed, prints the end of each LOG and fails.
weft_run_job() {
  local trainctl=$1 spec=$2 out=$3 job
  shift 3
  job=$("$trainctl" submit "$spec")
  "$trainctl" watch "$job" -o json >"$out" || {
    echo "job $job did not succeed; worker logs:" >&2
    tail -n 20 "$@" >&2
    return 1
  }
  echo "$job"
}
