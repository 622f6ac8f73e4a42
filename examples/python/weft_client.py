#!/usr/bin/python3
"""A Weft client in Python over the generated weft.v1 stubs (examples/python/generate.sh).

    weft_client.py --coordinator HOST:PORT submit job.pb.txt      # prints the job id
    weft_client.py --coordinator HOST:PORT watch JOB              # until the job ends
    weft_client.py --checkpointd HOST:PORT checkpoints JOB
    weft_client.py --coordinator ... --checkpointd ... run job.pb.txt   # all three

Security, as for trainctl: --tls-ca CA.pem (TLS), plus --tls-cert/--tls-key (mutual TLS), and
--token or WEFT_TOKEN (a bearer token on every call).

Exit status: 0 on success (watch: the job SUCCEEDED), 1 on an error, which is printed as
"weft_client: <gRPC code>: <the server's message>" (the servers name the offending fields).

Like trainctl, each call first waits up to 3 s (WEFT_RECONNECT_WAIT_S) for an unreachable
server (a restart, one lost connection attempt), and the calls that are safe to send twice go
again after UNAVAILABLE (service_config.json, copied beside the stubs from protos/weft/v1).
"""
import argparse
import collections
import json
import os
import sys

import grpc
from google.protobuf import text_format

sys.path.insert(0, os.environ.get("WEFT_PYTHON_STUBS", os.path.dirname(__file__)))
from weft.v1 import checkpoint_pb2, checkpoint_pb2_grpc  # noqa: E402
from weft.v1 import coordinator_pb2, coordinator_pb2_grpc, job_pb2  # noqa: E402

TERMINAL = {job_pb2.SUCCEEDED, job_pb2.FAILED, job_pb2.CANCELLED}
# How long a call waits for an unreachable server before it is sent anyway (and fails with
# gRPC's reason): 3 s, as trainctl, unless WEFT_RECONNECT_WAIT_S says otherwise (main checks it).
RECONNECT_WAIT_S = 3.0


def reconnect_wait_s(text):
    """WEFT_RECONNECT_WAIT_S as seconds; ValueError naming the variable if it is not >= 0."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # also refuses NaN
        raise ValueError(f"WEFT_RECONNECT_WAIT_S: {text!r} is not a number of seconds >= 0")
    return seconds


def service_config():
    """The retry policy of the weft.v1 calls that are safe to send twice, as one JSON string."""
    path = os.path.join(os.path.dirname(job_pb2.__file__), "service_config.json")
    with open(path) as f:
        return json.dumps(json.load(f))


def wait_until_connected(ch):
    """Gives a server that is restarting, or a first connection attempt that failed, time to
    answer: a call made on a channel that is not connected fails at once."""
    try:
        grpc.channel_ready_future(ch).result(timeout=RECONNECT_WAIT_S)
    except grpc.FutureTimeoutError:
        pass  # the call goes anyway and its error says why the server is unreachable


def state_name(state):
    return job_pb2.JobState.Name(state)


def submit(coordinator, path):
    spec = job_pb2.JobSpec()
    with open(path) as f:
        text_format.Parse(f.read(), spec)  # raises ParseError naming line:column
    wait_until_connected(coordinator)
    stub = coordinator_pb2_grpc.CoordinatorStub(coordinator)
    response = stub.SubmitJob(coordinator_pb2.SubmitJobRequest(spec=spec), timeout=30)
    return response.job_id


def watch(coordinator, job_id):
    """Prints each state change and step until the job ends; returns the final status."""
    wait_until_connected(coordinator)
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
    wait_until_connected(checkpointd)
    stub = checkpoint_pb2_grpc.CheckpointStub(checkpointd)
    response = stub.ListCheckpoints(checkpoint_pb2.ListCheckpointsRequest(job_id=job_id),
                                    timeout=30)
    for m in response.checkpoints:
        print(f"checkpoint {m.job_id} step {m.step} world {m.world_size}"
              f"{' pinned' if m.pinned else ''}", flush=True)
    return list(response.checkpoints)


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds "authorization: Bearer <token>" to every call (what the coordinator and checkpointd
    check when they run with --auth-tokens-file). An interceptor rather than call credentials, which gRPC
    sends only over TLS: plaintext is fine on loopback."""

    def __init__(self, token):
        self._metadata = (("authorization", f"Bearer {token}"),)

    def _with_token(self, details):
        return _CallDetails(details.method, details.timeout,
                            tuple(details.metadata or ()) + self._metadata, details.credentials,
                            getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)


class _CallDetails(
        collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                "wait_for_ready", "compression")),
        grpc.ClientCallDetails):
    pass


def channel(target, args):
    """A channel to target with the same security flags as the C++ binaries: TLS verified
    against --tls-ca (presenting --tls-cert/--tls-key for mutual TLS), and the bearer token."""
    options = [("grpc.enable_retries", 1), ("grpc.service_config", service_config())]
    if args.tls_ca or args.tls_cert:
        def read(path):
            with open(path, "rb") as f:
                return f.read()
        credentials = grpc.ssl_channel_credentials(
            root_certificates=read(args.tls_ca) if args.tls_ca else None,
            private_key=read(args.tls_key) if args.tls_key else None,
            certificate_chain=read(args.tls_cert) if args.tls_cert else None)
        ch = grpc.secure_channel(target, credentials, options=options)
    else:
        ch = grpc.insecure_channel(target, options=options)
    token = (args.token or "").strip()
    return grpc.intercept_channel(ch, _BearerToken(token)) if token else ch


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", default=os.environ.get("WEFT_COORDINATOR", "127.0.0.1:7070"))
    parser.add_argument("--checkpointd", default=os.environ.get("WEFT_CHECKPOINTD", "127.0.0.1:7071"))
    parser.add_argument("--tls-ca", help="PEM CA to verify the servers against (enables TLS)")
    parser.add_argument("--tls-cert", help="PEM client certificate, for mutual TLS")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--token", default=os.environ.get("WEFT_TOKEN", ""),
                        help="bearer token (default: env WEFT_TOKEN)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("submit").add_argument("spec")
    sub.add_parser("watch").add_argument("job")
    sub.add_parser("checkpoints").add_argument("job")
    sub.add_parser("run").add_argument("spec")
    args = parser.parse_args(argv)
    global RECONNECT_WAIT_S
    try:
        RECONNECT_WAIT_S = reconnect_wait_s(os.environ.get("WEFT_RECONNECT_WAIT_S", "3"))
    except ValueError as e:
        print(f"weft_client: {e}", file=sys.stderr)
        return 1

    try:
        coordinator = channel(args.coordinator, args)
        checkpointd = channel(args.checkpointd, args)
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
