#!/usr/bin/env python3
# Writes the Weft Grafana dashboards (job view, cluster view) as JSON. The JSON files are
# committed; edit this file and rerun it rather than editing them, and
# tests/deploy/prometheus_dashboards_test.sh checks that they match and that every query
# returns data on a live job.
import json
import os
import sys

# Where the JSON goes: deploy/grafana/dashboards next to this file, or the first argument.
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "dashboards")
DS = {"type": "prometheus", "uid": "weft-prometheus"}
RANK = 'on(worker_id) group_left(rank) weft_worker_job_info{job_id="$job"}'

def panel(pid, title, exprs, x, y, w=12, h=8, kind="timeseries", unit=None, desc="", stack=False):
    targets = []
    for i, (expr, legend) in enumerate(exprs):
        targets.append({"datasource": DS, "expr": expr, "legendFormat": legend,
                        "refId": chr(ord("A") + i)})
    p = {"id": pid, "type": kind, "title": title, "description": desc, "datasource": DS,
         "gridPos": {"x": x, "y": y, "w": w, "h": h}, "targets": targets,
         "fieldConfig": {"defaults": {}, "overrides": []}, "options": {}}
    if unit:
        p["fieldConfig"]["defaults"]["unit"] = unit
    if stack:
        p["fieldConfig"]["defaults"]["custom"] = {"stacking": {"mode": "normal"}, "fillOpacity": 60}
    if kind == "heatmap":
        p["options"] = {"calculate": False, "yAxis": {"unit": unit or "s"},
                        "cellGap": 1, "color": {"scheme": "Oranges", "mode": "scheme"}}
    if kind == "stat":
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"}
    if kind == "bargauge":
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "displayMode": "basic",
                        "orientation": "horizontal"}
    return p

def dashboard(uid, title, desc, panels, templating=None):
    return {"uid": uid, "title": title, "description": desc, "tags": ["weft"],
            "timezone": "browser", "schemaVersion": 37, "version": 1, "editable": True,
            "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
            "templating": {"list": templating or []}, "panels": panels, "annotations": {"list": []}}

job_var = {"name": "job", "label": "Job", "type": "query", "datasource": DS,
           "query": {"query": "label_values(weft_coordinator_job_step, job_id)", "refId": "jobs"},
           "definition": "label_values(weft_coordinator_job_step, job_id)",
           "refresh": 2, "sort": 2, "includeAll": False, "multi": False}

job = dashboard("weft-job", "Weft job", "One training job: progress, speed, where a step's time goes, its ranks, checkpoints and events. Pick the job above.", [
    panel(1, "Step", [('weft_coordinator_job_step{job_id="$job"}', "step")], 0, 0, 4, 4, "stat"),
    panel(2, "Recoveries", [('weft_coordinator_recoveries_total{job_id="$job"}', "recoveries")], 4, 0, 4, 4, "stat",
          desc="Generation failures this job recovered from (each used a restart)."),
    panel(3, "Last checkpoint: stall / save", [
        ('weft_coordinator_job_checkpoint_stall_seconds{job_id="$job"}', "training stalled"),
        ('weft_coordinator_job_checkpoint_save_seconds{job_id="$job"}', "saved in")], 8, 0, 8, 4, "stat", "s",
        desc="Stall: training time the snapshot took. Save: snapshot to commit, overlapped with training."),
    panel(4, "Events", [('sum by (type) (weft_coordinator_job_events_total{job_id="$job"})', "{{type}}")], 16, 0, 8, 4, "bargauge",
          desc="Every transition is also listed, with times and reasons, by `trainctl events JOB`."),
    panel(5, "Loss", [('weft_coordinator_job_loss{job_id="$job"}', "train"),
                      ('weft_worker_val_loss * ' + RANK.replace('job_id="$job"', 'job_id="$job", rank="0"'), "validation")],
          0, 4, 12, 8),
    panel(6, "Tokens per second", [('weft_coordinator_job_tokens_per_second{job_id="$job"}', "job")], 12, 4, 12, 8, unit="short"),
    panel(7, "MFU", [('weft_coordinator_job_mfu_ratio{job_id="$job"}', "job (rank 0)"),
                     ('weft_worker_mfu_ratio * ' + RANK, "rank {{rank}}")], 0, 12, 12, 8, unit="percentunit",
          desc="6 x params + 12 x layers x width x context FLOPs per token against each worker's --peak-tflops."),
    panel(8, "Step time split (mean over ranks)", [
        ('avg by (phase) (weft_worker_step_phase_seconds{phase!="total"} * ' + RANK + ')', "{{phase}}")],
          12, 12, 12, 8, unit="s", stack=True,
          desc="Forward, backward, optimizer and the communication the engine could not hide behind compute."),
    panel(9, "Per-rank compute time", [('weft_worker_compute_seconds * ' + RANK, "rank {{rank}}")], 0, 20, 12, 8, "heatmap", "s",
          desc="Forward + backward + optimizer per rank: a slow rank stands out as a hot row."),
    panel(10, "Stragglers: slowest rank / median", [
        ('job_id:weft_worker_compute_seconds:max_over_median{job_id="$job"}', "slowest / median")],
          12, 20, 12, 8, unit="short",
          desc="Compute time of the slowest rank over the median rank's (recording rule of deploy/prometheus/rules.yml). 1.0: balanced. Every rank waits for the slowest at each collective."),
    panel(11, "Heartbeat age of the job's workers", [
        ('weft_coordinator_worker_heartbeat_age_seconds * ' + RANK, "rank {{rank}}")], 0, 28, 12, 8, unit="s",
          desc="Past the job's heartbeat timeout the worker is declared dead."),
    panel(12, "Checkpoint stall per rank", [('weft_worker_checkpoint_stall_seconds * ' + RANK, "rank {{rank}}")], 12, 28, 12, 8, unit="s"),
    panel(13, "Age of the newest checkpoint", [
        ('time() - weft_coordinator_job_checkpoint_timestamp_seconds{job_id="$job"}', "age"),
        ('clamp_min(3 * job_id:weft_checkpoint_interval_seconds:estimated{job_id="$job"}, 300)', "alert above")],
          0, 36, 24, 8, unit="s",
          desc="How much training a crash now would lose. Alert WeftCheckpointStale (deploy/prometheus/rules.yml) fires past three checkpoint intervals (at least 5 min) while the job runs."),
    panel(14, "Collective traffic by link", [
        ('sum by (link) (rate(weft_worker_collective_bytes_total[$__rate_interval]) * ' + RANK + ')', "{{link}}")],
          0, 44, 24, 8, unit="Bps",
          desc="Bytes per second the job's ranks send in collectives during steps, as ring algorithms send them: within a host, and over communicators that span hosts. Across hosts, sharding HOST keeps only the replica all-reduce on the network; sharding.replica_reduce_format WIRE_BF16 or WIRE_INT8 halves or quarters it (docs/deploy.md 7.4)."),
    panel(15, "Skipped steps (rank 0)", [
        ('increase(weft_worker_steps_skipped_total[$__rate_interval]) * ' + RANK.replace('job_id="$job"', 'job_id="$job", rank="0"'), "skipped")],
          0, 52, 12, 8, unit="short",
          desc="Steps whose gradient was not finite: skipped, weights and optimizer state left as they were. fault.max_skipped_steps in a row fail the job. Every rank skips the same steps."),
    panel(16, "FP8 casts: share underflowing to zero", [
        ('sum by (format) (rate(weft_worker_fp8_values_total{outcome="underflow"}[$__rate_interval]) * ' + RANK + ') / '
         'clamp_min(sum by (format) (rate(weft_worker_fp8_values_total{outcome="cast"}[$__rate_interval]) * ' + RANK + '), 1e-9)', "{{format}} underflow"),
        ('sum by (format) (rate(weft_worker_fp8_values_total{outcome="saturated"}[$__rate_interval]) * ' + RANK + ') / '
         'clamp_min(sum by (format) (rate(weft_worker_fp8_values_total{outcome="cast"}[$__rate_interval]) * ' + RANK + '), 1e-9)', "{{format}} saturated")],
          12, 52, 12, 8, unit="percentunit",
          desc="precision FP8: of the values the blocks' Linear layers cast (e4m3: inputs and weights; e5m2: output gradients), the share that was not zero but became zero, and the share beyond the format's largest value. 0 for BF16 jobs. A growing e5m2 underflow means gradients too small for their scale."),
], [job_var])

cluster = dashboard("weft-cluster", "Weft cluster", "Workers, jobs, failures and recoveries across the cluster.", [
    panel(1, "Workers by state", [("weft_coordinator_workers", "{{state}}")], 0, 0, 12, 8, stack=True),
    panel(2, "Jobs by state", [("weft_coordinator_jobs", "{{state}}")], 12, 0, 12, 8, stack=True),
    panel(3, "Failures detected", [("sum by (kind) (increase(weft_coordinator_failures_detected_total[$__rate_interval]))", "{{kind}}")],
          0, 8, 12, 8, desc="Worker deaths and hangs, stalls, rendezvous timeouts, rank errors."),
    panel(4, "Recoveries", [("sum(increase(weft_coordinator_recoveries_total[$__rate_interval]))", "recoveries"),
                            ("sum(weft_coordinator_recoveries_total)", "total")], 12, 8, 12, 8),
    panel(5, "Heartbeat age", [("weft_coordinator_worker_heartbeat_age_seconds", "{{worker_id}}")], 0, 16, 12, 8, unit="s"),
    panel(6, "Busy workers", [("sum(weft_worker_busy)", "busy"), ('count(up{job="weft-worker"} == 1)', "up")], 12, 16, 12, 8),
    panel(7, "Generations started and rendezvous time", [
        ("increase(weft_coordinator_generations_started_total[$__rate_interval])", "generations"),
        ("weft_coordinator_rendezvous_latency_seconds_sum / weft_coordinator_rendezvous_latency_seconds_count", "mean rendezvous (s)")],
          0, 24, 12, 8),
    panel(8, "Heartbeats per second", [("rate(weft_coordinator_heartbeats_total[$__rate_interval])", "heartbeats/s")], 12, 24, 12, 8, unit="short"),
    panel(9, "Checkpoint store", [("weft_checkpointd_store_bytes", "stored"),
                                   ("rate(weft_checkpointd_bytes_written_total[$__rate_interval])", "written/s")], 0, 32, 12, 8, unit="bytes"),
    panel(10, "Checkpoints committed", [("weft_checkpointd_checkpoints_committed_total", "committed"),
                                         ("weft_checkpointd_checkpoints_failed_total", "failed")], 12, 32, 12, 8, "stat"),
    panel(11, "Age of each job's newest checkpoint", [
        ("time() - weft_coordinator_job_checkpoint_timestamp_seconds", "{{job_id}}")], 0, 40, 12, 8, unit="s",
          desc="Alert WeftCheckpointStale fires for a running job past three checkpoint intervals."),
    panel(12, "Straggler ratio by job", [("job_id:weft_worker_compute_seconds:max_over_median", "{{job_id}}")],
          12, 40, 12, 8, unit="short", desc="Slowest rank's compute time over the median rank's, per running job. 1.0: balanced."),
])

os.makedirs(OUT, exist_ok=True)
for name, d in (("weft-job.json", job), ("weft-cluster.json", cluster)):
    with open(os.path.join(OUT, name), "w") as f:
        json.dump(d, f, indent=2)
        f.write("\n")

