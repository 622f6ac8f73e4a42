#!/usr/bin/python3
"""deploy/k8s holds together and matches the code.

No cluster and no schema download are needed (neither is available in CI); the checks are:
  - yamllint --strict on every manifest;
  - every field of every object is one the Kubernetes API knows, with the right type, using
    the API models shipped in python3-kubernetes (Debian; Kubernetes 1.22 API);
  - structure: names, selectors matching pod labels, Services whose targetPorts exist,
    probes on the metrics port, state on persistent volumes, one GPU per worker, the
    workers dialing the coordinator and checkpointd through their Services and stating
    their node as their host id, and
    kustomization.yaml listing every manifest and every image;
  - security: every daemon runs mutual TLS with --tls-cert/--tls-key/--tls-ca naming the right
    keys of Secret weft-tls, mounted read-only; the daemons' --auth-tokens-file is key
    `tokens` of Secret weft-auth-tokens, mounted the same way; workers take WEFT_TOKEN from
    key `token` of Secret weft-worker-token; no secret is written into a manifest;
  - every flag a container passes is one its binary accepts (its --help lists it), like
    deploy_files_test.sh does for the systemd units;
  - when kubectl is installed, `kubectl kustomize` renders the set into the namespace.
Each rule is then shown to fire on a deliberately broken copy, so that none passes vacuously.

  tests/deploy/k8s_manifests_test.py BIN_DIR
"""

import copy
import os
import re
import shutil
import subprocess
import sys

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(ROOT, "deploy", "k8s")
YAMLLINT_CONFIG = "{extends: default, rules: {line-length: {max: 100}}}"
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
# Flags that name a file from a Secret: flag -> (Secret, key). weft-tls has the layout
# cert-manager writes; every daemon passes the three TLS flags (mutual TLS everywhere).
TLS_FILES = {
    "--tls-cert": ("weft-tls", "tls.crt"),
    "--tls-key": ("weft-tls", "tls.key"),
    "--tls-ca": ("weft-tls", "ca.crt"),
}
AUTH_TOKENS_FILE = {"--auth-tokens-file": ("weft-auth-tokens", "tokens")}
WORKER_TOKEN = ("WEFT_TOKEN", "weft-worker-token", "token")  # env variable, Secret, key


def fail_setup(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


try:
    from kubernetes.client import models as k8s_models
except ImportError:
    fail_setup("python3-kubernetes is missing (scripts/lib.sh installs it)")


# --- the binaries' flags -----------------------------------------------------------------

_HELP_FLAGS = {}  # (bin_dir, binary) -> flags; each binary's --help runs once


def binary_flags(bin_dir, binary):
    """The long options `binary --help` lists, or None when it is not built."""
    key = (bin_dir, binary)
    if key not in _HELP_FLAGS:
        path = os.path.join(bin_dir, binary)
        if not os.access(path, os.X_OK):
            _HELP_FLAGS[key] = None
        else:
            out = subprocess.run([path, "--help"], capture_output=True, text=True,
                                 check=True).stdout
            # Option lines only ("  -h,--help ...", "  --listen TEXT=..."), not descriptions.
            _HELP_FLAGS[key] = set(re.findall(r"^\s+(?:-\w,)?(--[\w-]+)", out, re.MULTILINE))
    return _HELP_FLAGS[key]


# --- field names and types against the API models ------------------------------------------

def model_class(api_version, kind):
    version = api_version.split("/")[-1]  # "apps/v1" -> "v1"
    return getattr(k8s_models, version[0].upper() + version[1:] + kind, None)


def check_fields(value, type_name, path, errors, quantity=False):
    """Checks `value` (parsed YAML) against a python3-kubernetes openapi type name."""
    if type_name == "object":  # IntOrString and free-form fields
        return
    if type_name.startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{path}: must be a list")
            return
        for i, item in enumerate(value):
            check_fields(item, type_name[5:-1], f"{path}[{i}]", errors)
        return
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            errors.append(f"{path}: must be a mapping")
            return
        inner = type_name[5:-1].split(", ", 1)[1]
        for key, item in value.items():
            check_fields(item, inner, f"{path}.{key}", errors, quantity)
        return
    if type_name == "str" or type_name == "datetime":
        # Resource quantities are strings in the models but the API also takes numbers.
        ok = isinstance(value, str) or (quantity and isinstance(value, (int, float))
                                        and not isinstance(value, bool))
        if not ok:
            errors.append(f"{path}: must be a string, not {value!r} (quote it)")
        return
    if type_name == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            errors.append(f"{path}: must be an integer, not {value!r}")
        return
    if type_name == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            errors.append(f"{path}: must be a number, not {value!r}")
        return
    if type_name == "bool":
        if not isinstance(value, bool):
            errors.append(f"{path}: must be true or false, not {value!r}")
        return
    cls = getattr(k8s_models, type_name, None)
    if cls is None:
        errors.append(f"{path}: the checker does not know type {type_name}")
        return
    if not isinstance(value, dict):
        errors.append(f"{path}: must be a mapping ({type_name})")
        return
    by_json_name = {json: attr for attr, json in cls.attribute_map.items()}
    for key, item in value.items():
        if key not in by_json_name:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
            continue
        check_fields(item, cls.openapi_types[by_json_name[key]], f"{path}.{key}", errors,
                     quantity=key in ("limits", "requests") and type_name.endswith(
                         "ResourceRequirements"))


# --- structure -----------------------------------------------------------------------------

def host_port(text):
    host, _, port = text.rpartition(":")
    return host, int(port) if port.isdigit() else None


def pod_spec(workload):
    return workload.get("spec", {}).get("template", {}).get("spec", {})


def container_port(container, ref):
    """The containerPort that a Service's targetPort or a probe's port (name or number) means."""
    for port in container.get("ports", []):
        if ref in (port.get("name"), port.get("containerPort")):
            return port.get("containerPort")
    return None


def parse_args(container, where, errors):
    """--flag=value arguments as {flag: value}; anything else is an error."""
    flags = {}
    for arg in container.get("args", []):
        match = re.fullmatch(r"(--[\w-]+)(?:=(.*))?", str(arg))
        if not match:
            errors.append(f"{where}: argument {arg!r} is not --flag or --flag=value")
            continue
        flags[match.group(1)] = match.group(2)
    return flags


def check_container(container, workload, bin_dir, errors, stats):
    where = f"{workload['kind']}/{workload['metadata']['name']} container {container.get('name')}"
    command = container.get("command") or []
    if len(command) != 1:
        errors.append(f"{where}: command must be the one Weft binary it runs")
        return None, {}
    binary = command[0]
    accepted = binary_flags(bin_dir, binary)
    if accepted is None:
        errors.append(f"{where}: runs {binary}, which is not built in {bin_dir}")
        return binary, {}
    flags = parse_args(container, where, errors)
    for flag in flags:
        stats["flags"] += 1
        if flag not in accepted:
            errors.append(f"{where}: passes {flag}, which {binary} does not accept")
    # A token in the args would be a secret written into the manifest (and shown by ps).
    if "--token" in flags:
        errors.append(f"{where}: passes --token in its args; give WEFT_TOKEN from a Secret")
    # Every daemon: mutual TLS from Secret weft-tls (plaintext is refused beyond loopback).
    check_secret_files(workload, container, flags, TLS_FILES, where, errors)
    env = {e.get("name") for e in container.get("env", [])}
    for value in flags.values():
        for var in re.findall(r"\$\((\w+)\)", value or ""):
            if var not in env:
                errors.append(f"{where}: uses $({var}), which its env does not set")

    # Ports the flags bind are the ports the container declares, under the names used below.
    # (The worker has no --listen: it serves no gRPC.)
    for flag, name in (("--listen", "grpc"), ("--metrics-address", "metrics")):
        if flag not in accepted:
            continue
        if flag not in flags:
            errors.append(f"{where}: must pass {flag} (the default is loopback only)")
            continue
        host, port = host_port(flags[flag])
        if host != "0.0.0.0":
            errors.append(f"{where}: {flag}={flags[flag]} is not reachable from other pods")
        if container_port(container, name) != port:
            errors.append(f"{where}: {flag} port {port} is not its containerPort {name!r}")

    # Probes: the metrics endpoint answers GET /metrics (common/metrics.h).
    for probe in ("readinessProbe", "livenessProbe"):
        get = container.get(probe, {}).get("httpGet")
        if not get:
            errors.append(f"{where}: needs an httpGet {probe}")
            continue
        if get.get("path") != "/metrics":
            errors.append(f"{where}: {probe} path {get.get('path')} is not /metrics")
        if container_port(container, get.get("port")) != container_port(container, "metrics"):
            errors.append(f"{where}: {probe} is not on the metrics port")

    # Prometheus annotations name the same port and path.
    annotations = workload["spec"]["template"].get("metadata", {}).get("annotations", {})
    if annotations.get("prometheus.io/scrape") != "true":
        errors.append(f"{where}: pod template lacks prometheus.io/scrape: \"true\"")
    if str(annotations.get("prometheus.io/port")) != str(container_port(container, "metrics")):
        errors.append(f"{where}: prometheus.io/port is not the metrics port")
    if annotations.get("prometheus.io/path") != "/metrics":
        errors.append(f"{where}: prometheus.io/path is not /metrics")

    resources = container.get("resources", {})
    for bound in ("requests", "limits"):
        for resource in ("cpu", "memory"):
            if resource not in resources.get(bound, {}):
                errors.append(f"{where}: resources.{bound}.{resource} is not set")
    return binary, flags


def persistent_mount(workload, container, path, claims):
    """True when `path` lies on a volume that outlives the pod (a claim)."""
    persistent = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
    for volume in pod_spec(workload).get("volumes", []):
        claim = volume.get("persistentVolumeClaim", {}).get("claimName")
        if claim in claims:
            persistent.add(volume["name"])
    # The deepest mount holding the path decides: a scratch volume mounted inside a claim's
    # folder would hide the claim there.
    holding = [m for m in container.get("volumeMounts", [])
               if (path.rstrip("/") + "/").startswith(m.get("mountPath", "").rstrip("/") + "/")]
    if not holding:
        return False
    deepest = max(holding, key=lambda m: len(m.get("mountPath", "").rstrip("/")))
    return deepest.get("name") in persistent


def secret_file(workload, container, path):
    """Which Secret key the file `path` is in the container: (secret, key, mount, volume), or
    None when no mount holds the path. secret is None when that mount is no Secret volume."""
    holding = [m for m in container.get("volumeMounts", [])
               if (path.rstrip("/") + "/").startswith(m.get("mountPath", "").rstrip("/") + "/")]
    if not holding:
        return None
    mount = max(holding, key=lambda m: len(m.get("mountPath", "").rstrip("/")))
    volume = next((v for v in pod_spec(workload).get("volumes", [])
                   if v.get("name") == mount.get("name")), {})
    secret = volume.get("secret")
    if not isinstance(secret, dict):
        return None, None, mount, volume
    relative = path[len(mount["mountPath"].rstrip("/")) + 1:]
    if mount.get("subPath"):  # the mount is the one file subPath names
        relative = mount["subPath"] if not relative else None
    items = secret.get("items")
    if items:  # only the listed keys, each at its path
        key = next((i.get("key") for i in items if i.get("path") == relative), None)
    else:
        key = relative
    return secret.get("secretName"), key, mount, volume


def check_secret_files(workload, container, flags, wanted, where, errors):
    """Each flag of `wanted` ({flag: (secret, key)}) is passed and names that key of that
    Secret, through a read-only mount of a Secret volume the pod cannot start without."""
    for flag, (want_secret, want_key) in wanted.items():
        if flag not in flags:
            errors.append(f"{where}: must pass {flag} (key {want_key} of Secret {want_secret})")
            continue
        path = flags[flag] or ""
        found = secret_file(workload, container, path)
        if found is None or found[0] is None:
            errors.append(f"{where}: {flag}={path} is not in a mounted Secret volume")
            continue
        secret, key, mount, volume = found
        if (secret, key) != (want_secret, want_key):
            errors.append(f"{where}: {flag}={path} is key {key} of Secret {secret}, not key "
                          f"{want_key} of Secret {want_secret}")
        if mount.get("readOnly") is not True:
            errors.append(f"{where}: volumeMount {mount.get('name')} holding {flag} must be "
                          f"readOnly: true")
        if volume["secret"].get("optional"):
            errors.append(f"{where}: Secret volume {volume.get('name')} holding {flag} is "
                          f"optional; the daemon cannot start without it")


def check_secret_env(container, wanted, where, errors):
    """The env variable of `wanted` (name, Secret, key) comes from that Secret's key."""
    name, want_secret, want_key = wanted
    entry = next((e for e in container.get("env", []) if e.get("name") == name), None)
    if entry is None:
        errors.append(f"{where}: env lacks {name} (key {want_key} of Secret {want_secret})")
        return
    ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
    if "value" in entry or not isinstance(ref, dict):
        errors.append(f"{where}: env {name} must come from a secretKeyRef, not a value in "
                      f"the manifest")
        return
    if (ref.get("name"), ref.get("key")) != (want_secret, want_key):
        errors.append(f"{where}: env {name} is key {ref.get('key')} of Secret "
                      f"{ref.get('name')}, not key {want_key} of Secret {want_secret}")
    if ref.get("optional"):
        errors.append(f"{where}: env {name}'s secretKeyRef is optional")


def check(docs, kustomization, files, bin_dir):
    """All the rules; returns (errors, stats). `docs` is a list of (file, object)."""
    errors = []
    stats = {"flags": 0, "objects": len(docs), "workloads": 0}

    listed = kustomization.get("resources", [])
    for name in sorted(set(files) - set(listed)):
        errors.append(f"kustomization.yaml does not list {name}")
    for name in sorted(set(listed) - set(files)):
        errors.append(f"kustomization.yaml lists {name}, which does not exist")
    images = {i.get("name") for i in kustomization.get("images", [])}

    by_kind = {}
    for file, obj in docs:
        if not isinstance(obj, dict) or not all(obj.get(k) for k in ("apiVersion", "kind")) or \
                not isinstance(obj.get("metadata"), dict) or not obj["metadata"].get("name"):
            errors.append(f"{file}: a document lacks apiVersion, kind or metadata.name")
            continue
        where = f"{file}: {obj['kind']}/{obj['metadata']['name']}"
        cls = model_class(obj["apiVersion"], obj["kind"])
        if cls is None:
            errors.append(f"{where}: unknown apiVersion/kind {obj['apiVersion']} {obj['kind']}")
        else:
            check_fields(obj, cls.__name__, where, errors)
        if obj["metadata"].get("namespace"):
            errors.append(f"{where}: names a namespace; kustomization.yaml sets it")
        by_kind.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj

    namespaces = list(by_kind.get("Namespace", {}))
    if namespaces != [kustomization.get("namespace")]:
        errors.append(f"kustomization.yaml namespace {kustomization.get('namespace')!r} is not "
                      f"the one Namespace object {namespaces}")

    claims = set(by_kind.get("PersistentVolumeClaim", {}))
    services = by_kind.get("Service", {})
    workloads = [o for kind in WORKLOAD_KINDS for o in by_kind.get(kind, {}).values()]
    by_binary = {}  # binary -> (workload, container, flags)
    for workload in workloads:
        stats["workloads"] += 1
        name = f"{workload['kind']}/{workload['metadata']['name']}"
        spec = workload.get("spec", {})
        selector = spec.get("selector", {}).get("matchLabels", {})
        labels = spec.get("template", {}).get("metadata", {}).get("labels", {})
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            errors.append(f"{name}: selector {selector} does not match its pod labels {labels}")
        mounts_ok = {v.get("name") for v in pod_spec(workload).get("volumes", [])} | {
            t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
        for volume in pod_spec(workload).get("volumes", []):
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim is not None and claim not in claims:
                errors.append(f"{name}: volume {volume['name']} claims {claim}, not defined")
        for container in pod_spec(workload).get("containers", []):
            for mount in container.get("volumeMounts", []):
                if mount.get("name") not in mounts_ok:
                    errors.append(f"{name}: mounts {mount.get('name')}, which is no volume")
            if container.get("image") not in images:
                errors.append(f"{name}: image {container.get('image')!r} is not in "
                              f"kustomization.yaml images")
            binary, flags = check_container(container, workload, bin_dir, errors, stats)
            if binary:
                by_binary[binary] = (workload, container, flags)
            for flag in ("--data-dir", "--output-dir"):
                if flag in flags and not persistent_mount(workload, container, flags[flag],
                                                          claims):
                    errors.append(f"{name}: {flag}={flags[flag]} is not on a persistent volume")
        if workload["kind"] == "StatefulSet":
            governing = services.get(spec.get("serviceName"))
            if not governing or governing["spec"].get("clusterIP") != "None":
                errors.append(f"{name}: serviceName {spec.get('serviceName')!r} is not a "
                              f"headless Service of the set")

    # Services select a workload's pods and target ports its containers declare.
    for name, service in services.items():
        selector = service.get("spec", {}).get("selector", {})
        selected = [w for w in workloads if selector and all(
            w["spec"]["template"]["metadata"].get("labels", {}).get(k) == v
            for k, v in selector.items())]
        if len(selected) != 1:
            errors.append(f"Service/{name}: selects {len(selected)} workloads, not one")
            continue
        containers = pod_spec(selected[0]).get("containers", [])
        for port in service["spec"].get("ports", []):
            target = port.get("targetPort", port.get("port"))
            if not any(container_port(c, target) is not None for c in containers):
                errors.append(f"Service/{name}: targetPort {target!r} is no containerPort of "
                              f"{selected[0]['metadata']['name']}")

    def service_port_reaches(address, binary):
        """True when host:port is a Service port that lands on `binary`'s --listen port."""
        host, port = host_port(address or "")
        service = services.get(host)
        if not service or binary not in by_binary:
            return False
        workload, container, flags = by_binary[binary]
        for p in service["spec"].get("ports", []):
            if p.get("port") == port:
                target = container_port(container, p.get("targetPort", p.get("port")))
                return target == host_port(flags.get("--listen", ":"))[1] and all(
                    workload["spec"]["template"]["metadata"]["labels"].get(k) == v
                    for k, v in service["spec"]["selector"].items())
        return False

    # The roles the issue asks for.
    coordinator = by_binary.get("weft-coordinator")
    if not coordinator:
        errors.append("no workload runs weft-coordinator")
    else:
        w = coordinator[0]
        if w["kind"] != "Deployment" or w["spec"].get("replicas") != 1 or \
                w["spec"].get("strategy", {}).get("type") != "Recreate":
            errors.append("weft-coordinator must be a Deployment of 1 replica, strategy Recreate")
        if "--data-dir" not in coordinator[2]:
            errors.append("weft-coordinator must pass --data-dir on its volume")
        check_secret_files(w, coordinator[1], coordinator[2], AUTH_TOKENS_FILE,
                           "weft-coordinator", errors)
    checkpointd = by_binary.get("weft-checkpointd")
    if not checkpointd:
        errors.append("no workload runs weft-checkpointd")
    else:
        w = checkpointd[0]
        if w["kind"] != "StatefulSet" or w["spec"].get("replicas") != 1 or \
                not w["spec"].get("volumeClaimTemplates"):
            errors.append("weft-checkpointd must be a StatefulSet of 1 replica with a "
                          "volumeClaimTemplate for its data")
        if "--data-dir" not in checkpointd[2]:
            errors.append("weft-checkpointd must pass --data-dir on its volume")
        check_secret_files(w, checkpointd[1], checkpointd[2], AUTH_TOKENS_FILE,
                           "weft-checkpointd", errors)
    worker = by_binary.get("weft-worker")
    if not worker:
        errors.append("no workload runs weft-worker")
    else:
        _, container, flags = worker
        check_secret_env(container, WORKER_TOKEN, "weft-worker", errors)
        resources = container.get("resources", {})
        if str(resources.get("limits", {}).get("nvidia.com/gpu")) != "1":
            errors.append("weft-worker must have limits nvidia.com/gpu: 1 (one GPU per pod)")
        if flags.get("--device") != "cuda:0":
            errors.append("weft-worker must pass --device=cuda:0 (its pod's only GPU)")
        if not service_port_reaches(flags.get("--coordinator"), "weft-coordinator"):
            errors.append(f"weft-worker --coordinator={flags.get('--coordinator')} is not a "
                          f"Service port of the coordinator's gRPC port")
        if not service_port_reaches(flags.get("--checkpointd"), "weft-checkpointd"):
            errors.append(f"weft-worker --checkpointd={flags.get('--checkpointd')} is not a "
                          f"Service port of checkpointd's gRPC port")
        check_host_id(container, flags, errors)
    return errors, stats


def check_host_id(container, flags, errors):
    """A pod's /etc/machine-id comes from the image, the same in every pod: the worker must
    state its node instead, or every node's ranks would be grouped as one host."""
    match = re.fullmatch(r"\$\((\w+)\)", flags.get("--host-id") or "")
    if not match:
        errors.append("weft-worker must pass --host-id=$(VAR) naming its node")
        return
    entry = next((e for e in container.get("env", []) if e.get("name") == match.group(1)), {})
    field = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if field != "spec.nodeName":
        errors.append(f"weft-worker --host-id=$({match.group(1)}) must come from fieldRef "
                      f"spec.nodeName, not {field}")


# --- the files -----------------------------------------------------------------------------

def load():
    files = sorted(f for f in os.listdir(K8S) if f.endswith(".yaml") and
                   f != "kustomization.yaml")
    docs = []
    for name in files:
        with open(os.path.join(K8S, name)) as f:
            docs += [(name, d) for d in yaml.safe_load_all(f) if d is not None]
    with open(os.path.join(K8S, "kustomization.yaml")) as f:
        kustomization = yaml.safe_load(f)
    return docs, kustomization, files


def yamllint():
    if not shutil.which("yamllint"):
        return ["yamllint is missing (scripts/lib.sh installs it)"]
    run = subprocess.run(["yamllint", "--strict", "-f", "parsable", "-d", YAMLLINT_CONFIG, K8S],
                         capture_output=True, text=True)
    return [] if run.returncode == 0 else [f"yamllint: {line}" for line in
                                           (run.stdout + run.stderr).splitlines()]


def kustomize_render(docs, kustomization):
    """What `kubectl kustomize` makes of the folder; None when kubectl is not installed."""
    if not shutil.which("kubectl"):
        return None
    run = subprocess.run(["kubectl", "kustomize", K8S], capture_output=True, text=True,
                         timeout=120)
    if run.returncode != 0:
        return [f"kubectl kustomize: {run.stderr.strip()}"]
    errors = []
    rendered = [d for d in yaml.safe_load_all(run.stdout) if d]
    want = sorted((o["kind"], o["metadata"]["name"]) for _, o in docs)
    got = sorted((o["kind"], o["metadata"]["name"]) for o in rendered)
    if want != got:
        errors.append(f"kubectl kustomize renders {got}, not {want}")
    images = {f"{i['newName']}:{i['newTag']}" for i in kustomization.get("images", [])}
    for o in rendered:
        if o["kind"] != "Namespace" and o["metadata"].get("namespace") != \
                kustomization["namespace"]:
            errors.append(f"rendered {o['kind']}/{o['metadata']['name']} is not in the namespace")
        for c in o.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            if c["image"] not in images:
                errors.append(f"rendered image {c['image']} is none of {sorted(images)}")
    return errors


# --- deliberately broken copies ------------------------------------------------------------

def find(docs, kind, name):
    return next(o for _, o in docs if o["kind"] == kind and o["metadata"]["name"] == name)


def first_container(docs, kind, name):
    return pod_spec(find(docs, kind, name))["containers"][0]


def set_arg(container, flag, value):
    container["args"] = [a for a in container["args"] if not a.startswith(flag + "=")]
    container["args"].append(f"{flag}={value}")


def drop_arg(container, flag):
    before = len(container["args"])
    container["args"] = [a for a in container["args"] if not a.startswith(flag + "=")]
    if len(container["args"]) == before:
        raise ValueError(f"no {flag} to drop")


def env_entry(container, name):
    return next(e for e in container["env"] if e["name"] == name)


def drop_env(container, name):
    container["env"].remove(env_entry(container, name))


def volume(docs, kind, name, volume_name):
    return next(v for v in pod_spec(find(docs, kind, name))["volumes"]
                if v["name"] == volume_name)


def mount(docs, kind, name, volume_name):
    return next(m for m in pod_spec(find(docs, kind, name))["containers"][0]["volumeMounts"]
                if m["name"] == volume_name)


# (what is broken, how, a piece of the error that must name it)
BREAKAGES = [
    ("a flag the binary lacks",
     lambda d, k: first_container(d, "Deployment", "weft-coordinator")["args"].append(
         "--no-such-flag=1"), "does not accept"),
    ("a misspelt field",
     lambda d, k: first_container(d, "StatefulSet", "weft-worker").update(
         livenesProbe=first_container(d, "StatefulSet", "weft-worker").pop("livenessProbe")),
     "unknown field"),
    ("an annotation that is a number",
     lambda d, k: find(d, "StatefulSet", "weft-worker")["spec"]["template"]["metadata"][
         "annotations"].update({"prometheus.io/port": 9480}), "must be a string"),
    ("a selector that misses the pod labels",
     lambda d, k: find(d, "StatefulSet", "weft-worker")["spec"]["selector"][
         "matchLabels"].update({"app.kubernetes.io/name": "weft-wrker"}), "selector"),
    ("a Service targetPort no container has",
     lambda d, k: find(d, "Service", "weft-coordinator")["spec"]["ports"][0].update(
         targetPort=7000), "targetPort"),
    ("a worker without its GPU",
     lambda d, k: first_container(d, "StatefulSet", "weft-worker")["resources"][
         "limits"].pop("nvidia.com/gpu"), "nvidia.com/gpu"),
    ("a worker on the wrong device",
     lambda d, k: set_arg(first_container(d, "StatefulSet", "weft-worker"), "--device",
                          "cuda:1"), "--device=cuda:0"),
    ("checkpointd without its volumeClaimTemplate",
     lambda d, k: find(d, "StatefulSet", "weft-checkpointd")["spec"].pop("volumeClaimTemplates"),
     "volumeClaimTemplate"),
    ("a coordinator that rolls instead of recreating",
     lambda d, k: find(d, "Deployment", "weft-coordinator")["spec"].update(
         strategy={"type": "RollingUpdate"}), "Recreate"),
    ("state off the volume",
     lambda d, k: set_arg(first_container(d, "Deployment", "weft-coordinator"), "--data-dir",
                          "/tmp/state"), "persistent volume"),
    ("a worker dialing no Service",
     lambda d, k: set_arg(first_container(d, "StatefulSet", "weft-worker"), "--coordinator",
                          "coordinator:7070"), "--coordinator"),
    ("a probe off the metrics endpoint",
     lambda d, k: first_container(d, "StatefulSet", "weft-checkpointd")["readinessProbe"][
         "httpGet"].update(path="/healthz"), "/metrics"),
    ("metrics on another port than declared",
     lambda d, k: set_arg(first_container(d, "StatefulSet", "weft-worker"), "--metrics-address",
                          "0.0.0.0:9999"), "containerPort"),
    ("a manifest kustomization.yaml does not list",
     lambda d, k: k["resources"].remove("worker.yaml"), "does not list worker.yaml"),
    ("an image kustomization.yaml does not map",
     lambda d, k: first_container(d, "StatefulSet", "weft-worker").update(image="weft-gpu"),
     "images"),
    ("an $(VAR) the env lacks",
     lambda d, k: drop_env(first_container(d, "StatefulSet", "weft-worker"), "POD_IP"),
     "$(POD_IP)"),
    # Security.
    ("a coordinator without --tls-ca (TLS, but no client certificates required)",
     lambda d, k: drop_arg(first_container(d, "Deployment", "weft-coordinator"), "--tls-ca"),
     "must pass --tls-ca"),
    ("a worker whose certificate is on no Secret volume",
     lambda d, k: set_arg(first_container(d, "StatefulSet", "weft-worker"), "--tls-cert",
                          "/tmp/tls.crt"), "--tls-cert=/tmp/tls.crt is not in a mounted Secret"),
    ("checkpointd's --tls-key naming the certificate's key",
     lambda d, k: set_arg(first_container(d, "StatefulSet", "weft-checkpointd"), "--tls-key",
                          "/etc/weft/tls/tls.crt"), "not key tls.key of Secret weft-tls"),
    ("a TLS volume from the wrong Secret",
     lambda d, k: volume(d, "StatefulSet", "weft-checkpointd", "tls")["secret"].update(
         secretName="weft-tls-old"), "of Secret weft-tls-old, not"),
    ("a writable Secret mount",
     lambda d, k: mount(d, "StatefulSet", "weft-worker", "tls").pop("readOnly"),
     "readOnly: true"),
    ("an optional Secret volume",
     lambda d, k: volume(d, "Deployment", "weft-coordinator", "tls")["secret"].update(
         optional=True), "is optional"),
    ("a coordinator that takes any caller",
     lambda d, k: drop_arg(first_container(d, "Deployment", "weft-coordinator"),
                           "--auth-tokens-file"), "must pass --auth-tokens-file"),
    ("a checkpointd that takes any caller",
     lambda d, k: drop_arg(first_container(d, "StatefulSet", "weft-checkpointd"),
                           "--auth-tokens-file"), "must pass --auth-tokens-file"),
    ("the coordinator's tokens from the wrong Secret",
     lambda d, k: volume(d, "Deployment", "weft-coordinator", "auth-tokens")["secret"].update(
         secretName="weft-worker-token"), "not key tokens of Secret weft-auth-tokens"),
    ("a worker without WEFT_TOKEN",
     lambda d, k: drop_env(first_container(d, "StatefulSet", "weft-worker"), "WEFT_TOKEN"),
     "env lacks WEFT_TOKEN"),
    ("a worker token written into the manifest",
     lambda d, k: env_entry(first_container(d, "StatefulSet", "weft-worker"),
                            "WEFT_TOKEN").update(value="0123456789abcdef0123"),
     "must come from a secretKeyRef"),
    ("a worker token from the wrong key",
     lambda d, k: env_entry(first_container(d, "StatefulSet", "weft-worker"), "WEFT_TOKEN")[
         "valueFrom"]["secretKeyRef"].update(key="tokens"), "not key token of Secret"),
    ("workers without --host-id (every pod states the image's machine id)",
     lambda d, k: drop_arg(first_container(d, "StatefulSet", "weft-worker"), "--host-id"),
     "must pass --host-id"),
    ("a host id from the pod's name",
     lambda d, k: set_arg(first_container(d, "StatefulSet", "weft-worker"), "--host-id",
                          "$(POD_NAME)"), "must come from fieldRef spec.nodeName, not"),
    ("a token in the args",
     lambda d, k: set_arg(first_container(d, "StatefulSet", "weft-worker"), "--token",
                          "0123456789abcdef0123"), "passes --token"),
]


def main():
    bin_dir = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else fail_setup("usage: BIN_DIR"))
    docs, kustomization, files = load()
    errors = yamllint()
    found, stats = check(docs, kustomization, files, bin_dir)
    errors += found
    rendered = kustomize_render(docs, kustomization)
    errors += rendered or []

    # The checker is not vacuous: a wrong flag is refused, and each breakage is caught.
    if "--no-such-flag" in (binary_flags(bin_dir, "weft-coordinator") or {"--no-such-flag"}):
        errors.append("the --help parser accepts anything")
    # 13 before TLS, 3 TLS flags per daemon and --auth-tokens-file on both daemons.
    if stats["workloads"] != 3 or stats["flags"] < 24:
        errors.append(f"only {stats['workloads']} workloads and {stats['flags']} flags checked")
    for what, breakage, expected in BREAKAGES:
        broken_docs, broken_kustomization = copy.deepcopy(docs), copy.deepcopy(kustomization)
        try:
            breakage(broken_docs, broken_kustomization)
        except (KeyError, IndexError, StopIteration, TypeError, AttributeError, ValueError) as e:
            # The manifests changed shape; the errors above usually say how.
            errors.append(f"self-check: cannot make {what} ({type(e).__name__}: {e})")
            continue
        broken, _ = check(broken_docs, broken_kustomization, files, bin_dir)
        if not any(expected in e for e in broken):
            errors.append(f"self-check: {what} went unnoticed (wanted an error with "
                          f"{expected!r}, got {broken})")

    for e in errors:
        print(f"FAIL: {e}", file=sys.stderr)
    if errors:
        return 1
    render = "rendered by kubectl kustomize" if rendered is not None else \
        "kubectl not installed, render not checked"
    print(f"PASS: {stats['objects']} objects in {len(files)} manifests, {stats['flags']} flags, "
          f"{len(BREAKAGES)} deliberate breakages caught; {render}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
