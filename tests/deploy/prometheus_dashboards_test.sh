#!/bin/bash
# Every query of every panel of deploy/grafana/dashboards returns data from a real Prometheus
# (Debian's `prometheus`, run with deploy/prometheus/prometheus.yml) scraping a live CPU job of
# the demo's shape: coordinator, checkpointd and two workers on 127.0.0.1, with the rules of
# deploy/prometheus/rules.yml loaded and healthy. Also: the config and rules pass promtool,
# every weft_ metric the rules and panels name is one the code registers, and the committed
# dashboard JSON is what deploy/grafana/dashboards.py writes.
#   tests/deploy/prometheus_dashboards_test.sh BIN_DIR
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$(cd "${1:?bin dir}" && pwd)
for tool in /usr/bin/prometheus /usr/bin/promtool; do
  [[ -x $tool ]] || { echo "FAIL: $tool is missing (apt-get install prometheus; scripts/lib.sh installs it)" >&2; exit 1; }
done
[[ -r /usr/share/games/fortunes/cookie ]] || { echo "FAIL: the demo corpus is missing (apt-get install fortunes)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/weft-prometheus-test.XXXXXX)
source "$ROOT/scripts/procs.sh"
weft_stop_at_exit KILL "$WORK"
fail_with_logs() {
  echo "FAIL: $1" >&2
  tail -n 20 "$WORK"/*.log >&2 || true
  exit 1
}

promtool check config "$ROOT/deploy/prometheus/prometheus.yml" >/dev/null 2>"$WORK/promtool.err" ||
  { cat "$WORK/promtool.err" >&2; fail_with_logs "promtool rejects deploy/prometheus/prometheus.yml"; }
promtool check rules "$ROOT/deploy/prometheus/rules.yml" >/dev/null 2>"$WORK/promtool.err" ||
  { cat "$WORK/promtool.err" >&2; fail_with_logs "promtool rejects deploy/prometheus/rules.yml"; }
python3 "$ROOT/deploy/grafana/dashboards.py" "$WORK/dashboards"
diff -r "$WORK/dashboards" "$ROOT/deploy/grafana/dashboards" >&2 ||
  fail_with_logs "deploy/grafana/dashboards differs from what deploy/grafana/dashboards.py writes: rerun it"

# Every metric the rules and panels name exists: a weft_ name is registered by the code (a string
# literal in a daemon's sources; _bucket/_sum/_count are a histogram's series), a level:metric:op
# name is recorded by rules.yml. Names are found by pattern, so a renamed metric fails here
# rather than as an empty panel in production.
python3 - "$ROOT" <<'PY' || fail_with_logs "the rules or dashboards name metrics that do not exist"
import glob, json, os, re, sys
root = sys.argv[1]
code = ""
for d in ("coordinator", "worker", "checkpointd", "common"):
    for path in glob.glob(os.path.join(root, d, "**", "*.cc"), recursive=True):
        code += open(path).read()
rules_text = open(os.path.join(root, "deploy/prometheus/rules.yml")).read()
recorded = set(re.findall(r"^\s*- record: (\S+)", rules_text, re.M))
exprs = [("rules.yml", rules_text)]
for name in sorted(os.listdir(os.path.join(root, "deploy/grafana/dashboards"))):
    d = json.load(open(os.path.join(root, "deploy/grafana/dashboards", name)))
    exprs += [(f"{name} / {p['title']}", t["expr"]) for p in d["panels"] for t in p["targets"]]
missing, named = [], 0
for where, expr in exprs:
    for metric in set(re.findall(r"[a-z_]*:[a-z_:]+|weft_[a-z0-9_]+", expr)):
        named += 1
        if ":" in metric:
            ok = metric in recorded
        else:
            ok = f'"{re.sub(r"_(bucket|sum|count)$", "", metric)}"' in code
        if not ok:
            missing.append(f"{where}: {metric}")
for m in missing:
    print("FAIL: no such metric:", m, file=sys.stderr)
if named < 30 or len(recorded) < 2:
    print(f"FAIL: only {named} metric names and {len(recorded)} recording rules found", file=sys.stderr)
    sys.exit(1)
# Not vacuous: a made-up name is caught.
if '"weft_no_such_metric"' in code:
    sys.exit(1)
sys.exit(1 if missing else 0)
PY

# Each server, then its metrics port (what Prometheus scrapes).
weft_serve "$WORK/coordinator" "$BIN/weft-coordinator" --data-dir="$WORK/coordinator" \
  --metrics-address=127.0.0.1:0 --metrics-port-file="$WORK/coordinator-metrics.port" ||
  fail_with_logs "weft-coordinator did not start"
weft_serve "$WORK/checkpointd" "$BIN/weft-checkpointd" --data-dir="$WORK/checkpoints" \
  --metrics-address=127.0.0.1:0 --metrics-port-file="$WORK/checkpointd-metrics.port" ||
  fail_with_logs "weft-checkpointd did not start"
for i in 0 1; do
  weft_spawn "$WORK/worker$i.log" "$BIN/weft-worker" --device="cpu:$i" --output-dir="$WORK/models" \
    --metrics-address=127.0.0.1:0 --metrics-port-file="$WORK/worker$i-metrics.port"
done
for name in coordinator checkpointd worker0 worker1; do
  weft_wait_for_file "$WORK/$name-metrics.port" || fail_with_logs "$name reports no metrics port"
done

# The deploy config with its file_sd targets pointed at this run's ports, scraping every second.
mkdir -p "$WORK/sd"
echo "- targets: [127.0.0.1:$(cat "$WORK/coordinator-metrics.port")]" >"$WORK/sd/coordinator.yml"
echo "- targets: [127.0.0.1:$(cat "$WORK/checkpointd-metrics.port")]" >"$WORK/sd/checkpointd.yml"
echo "- targets: [127.0.0.1:$(cat "$WORK/worker0-metrics.port"), 127.0.0.1:$(cat "$WORK/worker1-metrics.port")]" >"$WORK/sd/workers.yml"
sed -e "s|/etc/prometheus/weft/|$WORK/sd/|" -e 's|interval: 5s|interval: 1s|' \
  "$ROOT/deploy/prometheus/prometheus.yml" >"$WORK/prometheus.yml"
cp "$ROOT/deploy/prometheus/rules.yml" "$WORK/rules.yml"  # rule_files is relative to the config
# Prometheus cannot report a port it picked, so take a free one just before it binds.
PROM_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
weft_spawn "$WORK/prometheus.log" /usr/bin/prometheus --config.file="$WORK/prometheus.yml" \
  --storage.tsdb.path="$WORK/tsdb" --web.listen-address="127.0.0.1:$PROM_PORT"

# The demo job, long enough to still be training when the queries run, checkpointing often.
sed -e 's/total_steps: [0-9]*/total_steps: 5000/' -e 's/interval_steps: 150/interval_steps: 40/' \
  "$ROOT/examples/fortunes-char.pb.txt" >"$WORK/job.pb.txt"
JOB=$("$BIN/trainctl" submit "$WORK/job.pb.txt")
# Until two checkpoints have committed (so rates over them have data).
for _ in $(seq 240); do
  ckpt=$("$BIN/trainctl" status "$JOB" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"]["checkpoint_step"])')
  ((ckpt >= 80)) && break
  sleep 0.5
done
((ckpt >= 80)) || fail_with_logs "job $JOB committed no second checkpoint"

python3 - "$ROOT/deploy/grafana/dashboards" "127.0.0.1:$PROM_PORT" "$JOB" <<'PY'
import json, os, sys, time, urllib.parse, urllib.request
dash_dir, prom, job = sys.argv[1:4]

def query(expr):
    url = f"http://{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]

def substitute(expr):
    return (expr.replace("$job", job).replace("$__rate_interval", "1m")
            .replace("$__range", "1h").replace("$__interval", "5s"))

failures, checked = [], 0
for name in sorted(os.listdir(dash_dir)):
    dashboard = json.load(open(os.path.join(dash_dir, name)))
    for var in dashboard.get("templating", {}).get("list", []):
        # label_values(metric, label): the job must be among the choices.
        q = var["query"]["query"]
        metric, label = q[len("label_values("):-1].split(", ")
        url = f"http://{prom}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": metric})
        deadline = time.time() + 30
        while True:
            values = json.load(urllib.request.urlopen(url, timeout=10))["data"]
            if job in values or time.time() > deadline:
                break
            time.sleep(1)
        checked += 1
        if job not in values:
            failures.append(f"{name}: variable {var['name']}: {job} not in {values}")
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = substitute(target["expr"])
            deadline = time.time() + 30  # rates need two scrapes inside their window
            while True:
                result = query(expr)
                if result or time.time() > deadline:
                    break
                time.sleep(1)
            checked += 1
            status = f"{len(result)} series" if result else "NO DATA"
            print(f"{name} / {panel['title']} / {target['refId']}: {status}: {expr}")
            if not result:
                failures.append(f"{name} / {panel['title']}: no data for {expr}")
for f in failures:
    print("FAIL:", f, file=sys.stderr)
if checked < 20:
    print(f"FAIL: only {checked} queries found", file=sys.stderr)
    sys.exit(1)
# Not vacuous: a query for a job that does not exist must come back empty.
if query(substitute('weft_coordinator_job_step{job_id="no-such-job"}')):
    print("FAIL: a query for a missing job returned data", file=sys.stderr)
    sys.exit(1)
# The rules loaded and evaluate without errors (an alert that cannot evaluate never fires).
with urllib.request.urlopen(f"http://{prom}/api/v1/rules", timeout=10) as r:
    groups = json.load(r)["data"]["groups"]
rules = [rule for g in groups for rule in g["rules"]]
rule_failures = [f"rule {rule['name']}: health {rule.get('health')}: {rule.get('lastError')}"
                 for rule in rules if rule.get("health") != "ok"]
if len(rules) < 3 or not any(rule["type"] == "alerting" for rule in rules):
    rule_failures.append(f"rules.yml not loaded: {[rule['name'] for rule in rules]}")
for f in rule_failures:
    print("FAIL:", f, file=sys.stderr)
if failures or rule_failures:
    sys.exit(1)
print(f"PASS: {checked} dashboard queries returned data for job {job}; {len(rules)} rules healthy")
PY
"$BIN/trainctl" cancel "$JOB" >/dev/null
