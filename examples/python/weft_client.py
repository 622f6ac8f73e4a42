#!/usr/bin/python3
"""A Weft client in Python over the generated weft.v1 stubs (examples/python/generate.sh).

    weft_client.py --coordinator HOST:PORT submit job.pb.txt      # prints the job id
    weft_client.py --coordinator HOST:PORT watch JOB              # until the job ends
    weft_client.py --checkpointd HOST:PORT checkpoints JOB
    weft_client.py --coordinator ... --checkpointd ... run job.pb.txt   # all three

Exit status: 0 on success (watch: the job SUCCEEDED), 1 on an error, which is printed as
"weft_client: <gRPC code>: <the server's message>" (the servers name the offending fields).
"""
import argparse
import os
import sys

import grpc
from google.protobuf import text_format

sys.path.insert(0, os.environ.get("WEFT_PYTHON_STUBS", os.path.dirname(__file__)))
from weft.v1 import checkpoint_pb2, checkpoint_pb2_grpc  # noqa: E402
from weft.v1 import coordinator_pb2, coordinator_pb2_grpc, job_pb2  # noqa: E402

TERMINAL = {job_pb2.SUCCEEDED, job_pb2.FAILED, job_pb2.CANCELLED}


def state_name(state):
    return job_pb2.JobState.Name(state)


def submit(coordinator, path):
    spec = job_pb2.JobSpec()
    with open(path) as f:
        text_format.Parse(f.read(), spec)  # raises ParseError naming line:column
    stub = coordinator_pb2_grpc.CoordinatorStub(coordinator)
    response = stub.SubmitJob(coordinator_pb2.SubmitJobRequest(spec=spec), timeout=30)
    return response.job_id


def watch(coordinator, job_id):
    """Prints each state change and step until the job ends; returns the final status."""
    stub = coordinator_pb2_grpc.CoordinatorStub(coordinator)
    last = None
    for status in stub.WatchJob(coordinator_pb2.WatchJobRequest(job_id=job_id)):
        line = f"{status.job_id} {state_name(status.state)} step {status.step}/{status.total_steps}"
        if status.HasField("last_metrics") and status.last_metrics.step > 0:
            line += f" loss {status.last_metrics.loss:.4f}"
        print(line, flush=True)
        last = status
        if status.state in TERMINAL:
            break
    return last


def checkpoints(checkpointd, job_id):
    stub = checkpoint_pb2_grpc.CheckpointStub(checkpointd)
    response = stub.ListCheckpoints(checkpoint_pb2.ListCheckpointsRequest(job_id=job_id),
                                    timeout=30)
    for m in response.checkpoints:
        print(f"checkpoint {m.job_id} step {m.step} world {m.world_size}"
              f"{' pinned' if m.pinned else ''}", flush=True)
    return list(response.checkpoints)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", default=os.environ.get("WEFT_COORDINATOR", "127.0.0.1:7070"))
    parser.add_argument("--checkpointd", default=os.environ.get("WEFT_CHECKPOINTD", "127.0.0.1:7071"))
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("submit").add_argument("spec")
    sub.add_parser("watch").add_argument("job")
    sub.add_parser("checkpoints").add_argument("job")
    sub.add_parser("run").add_argument("spec")
    args = parser.parse_args(argv)

    coordinator = grpc.insecure_channel(args.coordinator)
    checkpointd = grpc.insecure_channel(args.checkpointd)
    try:
        if args.command == "submit":
            print(submit(coordinator, args.spec))
            return 0
        if args.command == "checkpoints":
            checkpoints(checkpointd, args.job)
            return 0
        job_id = args.job if args.command == "watch" else submit(coordinator, args.spec)
        if args.command == "run":
            print(f"submitted {job_id}", flush=True)
        final = watch(coordinator, job_id)
        if args.command == "run":
            checkpoints(checkpointd, job_id)
        if final is None or final.state != job_pb2.SUCCEEDED:
            why = final.error if final is not None else "the watch ended without a status"
            print(f"weft_client: job {job_id} did not succeed: {why}", file=sys.stderr)
            return 1
        return 0
    except grpc.RpcError as e:
        print(f"weft_client: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    except (OSError, text_format.ParseError) as e:
        print(f"weft_client: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
