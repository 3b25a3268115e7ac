"""What deploy/kubernetes must keep true, checked on its rendered YAML.

The API schema (kubernetes-validate) says each object is well formed; this
says the objects fit together and fit bagel-server, which no schema knows:

* ordinal = ID: --server-id is the pod's name, `<statefulset>-<ordinal>`,
  taken from the downward API.
* the key (and the granted-until mark beside it) is on the member's own
  PersistentVolumeClaim, not on the image's or an emptyDir's file system.
* readiness = health: the readiness probe is /readyz (which asks the gRPC
  health service, NOT_SERVING through the restart wait) and liveness is
  /healthz, both on the port --http listens on.
* a rollout or a drain takes one member at a time: RollingUpdate with at
  most one unavailable, a PodDisruptionBudget of maxUnavailable 1.
* DNS: a headless Service that keeps members in their restart wait
  (publishNotReadyAddresses), with named ports, so SRV records exist.
* the member lists come from the ConfigMap bagel-members, mounted whole
  (no subPath, which the kubelet never updates) at the folder of
  --members-file, so an edit reaches every member with no restart; and
  its lists (`members`, `next-members` while migrating) name exactly the
  pods, bagel-0 .. bagel-<replicas - 1>: what members found by DNS must
  be for a dns+srv:// client to route by them.
* the flags are bagel-server's real ones (its --help, given as a file),
  the command is where the Containerfile installs the binary, and the pod
  runs as the Containerfile's user.

Usage:
  k8s_invariants.py check RENDERED HELP_TEXT CONTAINERFILE [SERVICEMONITOR]
      prints every broken invariant and exits 1 if there is any.
  k8s_invariants.py args RENDERED POD_NAME
      prints the container's command and args, one per line, with
      $(VAR) expanded as the kubelet expands it for a pod of that name.
  k8s_invariants.py members-file RENDERED
      prints the members file as the pod reads it (the ConfigMap's key).
  k8s_invariants.py lists RENDERED
      prints the member lists of that file as JSON, `bagel server-info
      --json`'s .members (compact).
  k8s_invariants.py owned RENDERED POD_NAME PREFIX
      prints a name PREFIX-N that POD_NAME owns under every member list.
  k8s_invariants.py user RENDERED
      prints the pod's runAsUser, runAsGroup and the container's
      readOnlyRootFilesystem (true or false), space-separated.
"""

import json
import re
import sys
from pathlib import PurePosixPath

import yaml


def load(path):
    with open(path, encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def one(objects, kind):
    found = [o for o in objects if o.get("kind") == kind]
    if len(found) != 1:
        raise SystemExit(f"expected one {kind}, found {len(found)}")
    return found[0]


def flags(args):
    """--name=value (or a bare --name) of each arg, in order."""
    out = {}
    for arg in args:
        if not arg.startswith("--"):
            raise SystemExit(f"arg {arg!r} is not --flag=value")
        name, _, value = arg.partition("=")
        if name in out:
            raise SystemExit(f"{name} given twice")
        out[name] = value
    return out


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def duration_s(text):
    """A humantime duration as the manifests write it: 500ms, 5s, 1m."""
    m = re.fullmatch(r"(\d+)(ms|s|m)", text)
    if not m:
        raise SystemExit(f"duration {text!r}: expected N followed by ms, s or m")
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def expand(arg, env, pod_name):
    """$(VAR) as the kubelet expands it (literal values and metadata.name)."""

    def value(m):
        e = env.get(m.group(1))
        if e is None:
            return m.group(0)  # the kubelet leaves unknown references alone
        if "value" in e:
            return e["value"]
        field = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if field == "metadata.name":
            return pod_name
        raise SystemExit(f"env {e['name']}: cannot expand {e}")

    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", value, arg)


MEMBERS_CONFIGMAP = "bagel-members"


def parse_members_file(text):
    """The lists of a --members-file, as bagel-server reads it
    (server/src/members.rs): `members = LIST` and optionally
    `next-members = LIST`, LIST as IDs or the clients' ID=URL#KEY list.
    Returns [current] or [current, next], each a list of IDs."""
    found = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        key = key.strip()
        if not eq or key not in ("members", "next-members"):
            raise SystemExit(f"members file line {n}: expected `members = LIST` or `next-members = LIST`")
        if key in found:
            raise SystemExit(f"members file line {n}: {key} given twice")
        ids = [item.split("=", 1)[0].strip() for item in value.split(",") if item.strip()]
        if not ids:
            raise SystemExit(f"members file line {n}: an empty list")
        found[key] = ids
    if "members" not in found:
        raise SystemExit("members file: no `members = LIST` line")
    return [found["members"]] + ([found["next-members"]] if "next-members" in found else [])


def members_file(objects, container):
    """(text, problems): the file --members-file names, as the pod sees it:
    a key of the ConfigMap bagel-members mounted whole at its folder."""
    problems = []
    path = flags(container.get("args", [])).get("--members-file")
    if not path:
        return None, ["no --members-file: members grant every name, so a wrong list takes names twice"]
    path = PurePosixPath(path)
    pod = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    mount = {m["mountPath"]: m for m in container.get("volumeMounts", [])}.get(str(path.parent))
    if mount is None:
        return None, [f"--members-file {path}: its folder is not a volume mount"]
    if "subPath" in mount or "subPathExpr" in mount:
        problems.append(
            f"--members-file {path}: mounted by subPath, which the kubelet never updates (an edit would need a restart)"
        )
    if mount.get("readOnly") is not True:
        problems.append(f"--members-file {path}: its volume is not mounted read-only")
    volume = {v["name"]: v for v in pod.get("volumes", [])}.get(mount["name"], {})
    ref = volume.get("configMap", {}).get("name")
    if ref != MEMBERS_CONFIGMAP:
        return None, problems + [f"--members-file {path}: volume {mount['name']} is not the ConfigMap {MEMBERS_CONFIGMAP}"]
    found = [o for o in objects if o.get("kind") == "ConfigMap" and o["metadata"]["name"] == ref]
    if len(found) != 1:
        return None, problems + [f"expected one ConfigMap {ref}, found {len(found)}"]
    text = found[0].get("data", {}).get(path.name)
    if text is None:
        return None, problems + [f"the ConfigMap {ref} has no key {path.name} (--members-file {path})"]
    return text, problems


def member_lists(objects, container):
    """The member lists the pods serve in: [current] or [current, next]."""
    text, problems = members_file(objects, container)
    if text is None:
        raise SystemExit("; ".join(problems))
    return parse_members_file(text)


def owner(ids, name):
    """The member of `ids` that owns `name`: bagel's rendezvous hash
    (proto/src/routing.rs: the first 8 bytes of SHA-256 of
    "bagel.v1 route\\0" + id + "\\0" + name, highest wins, ties to the
    smaller id)."""
    import hashlib

    def weight(i):
        d = hashlib.sha256(b"bagel.v1 route\0" + i.encode() + b"\0" + name.encode()).digest()
        return int.from_bytes(d[:8], "big")

    return max(ids, key=lambda i: (weight(i), [-ord(c) for c in i]))


def check(rendered, help_path, containerfile, servicemonitor=None):
    objects = load(rendered)
    with open(help_path, encoding="utf-8") as f:
        help_text = f.read()
    with open(containerfile, encoding="utf-8") as f:
        containerfile_text = f.read()
    sts = one(objects, "StatefulSet")
    svc = one(objects, "Service")
    pdb = one(objects, "PodDisruptionBudget")
    spec, pod = sts["spec"], sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = flags(container["args"])
    env = env_of(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    labels = sts["spec"]["template"]["metadata"]["labels"]
    annotations = sts["spec"]["template"]["metadata"].get("annotations", {})
    broken = []

    def need(ok, what):
        if not ok:
            broken.append(what)

    # The flags are bagel-server's.
    # The options --help lists (a line of their own), not flags its prose names.
    help_flags = set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", help_text, re.M))
    for name in args:
        need(name in help_flags, f"{name} is not a flag of bagel-server (--help)")
    # Flags are args, where a typo fails the check above: no bagel-server
    # variable (BAGEL_*) beside them, which --help would not check and
    # which could contradict an arg (BAGEL_MEMBERS beside --members-file).
    for name in env:
        need(not name.startswith("BAGEL_"), f"env {name}: give bagel-server's flags as args")
    for name in ("--members", "--next-members"):
        need(name not in args, f"{name}: the member lists are the members file's (--members-file)")

    # The member lists are the pods: the lists of the members file
    # (`members`, and `next-members` while migrating) name, together,
    # exactly the pods bagel-0 .. bagel-<replicas - 1>, whose DNS records
    # a dns+srv:// client finds. A pod no list names, or a listed member
    # with no pod, and those clients refuse the cluster.
    pods = {f"{sts['metadata']['name']}-{i}" for i in range(spec.get("replicas", 1))}
    text, problems = members_file(objects, container)
    broken.extend(problems)
    lists = parse_members_file(text) if text is not None else []
    for ids in lists:
        need(len(ids) == len(set(ids)), f"a member list names a member twice: {ids}")
    listed = set().union(*lists) if lists else set()
    need(
        listed == pods,
        f"the member lists name {sorted(listed)}, the pods are {sorted(pods)} (replicas "
        f"{spec.get('replicas', 1)}): they must be the same members",
    )

    # ordinal = ID.
    pod_name = env.get("POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {})
    need(
        pod_name.get("fieldPath") == "metadata.name",
        "POD_NAME is not the pod's name (downward API metadata.name)",
    )
    need(
        args.get("--server-id") == "$(POD_NAME)",
        f"--server-id is {args.get('--server-id')!r}, not $(POD_NAME) (bagel-<ordinal>)",
    )
    need(
        expand(args.get("--server-id", ""), env, sts["metadata"]["name"] + "-2")
        == sts["metadata"]["name"] + "-2",
        "--server-id of the pod with ordinal 2 is not <statefulset>-2",
    )

    # The key and its mark on the member's own volume.
    key = args.get("--key")
    need(bool(key), "no --key: a restart would make a new key and wait without its mark")
    claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
    mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
    if key:
        mount = mounts.get(str(PurePosixPath(key).parent))
        need(mount is not None, f"--key {key}: its directory is not a volume mount")
        if mount:
            need(
                mount["name"] in claims,
                f"--key {key}: volume {mount['name']} is not a volumeClaimTemplate (per-member PVC)",
            )
            need(not mount.get("readOnly"), f"--key {key}: the volume is mounted read-only")
    need(
        spec.get("persistentVolumeClaimRetentionPolicy")
        == {"whenDeleted": "Retain", "whenScaled": "Retain"},
        "the PVCs (keys) are not retained when the StatefulSet is deleted or scaled in",
    )

    # Probes: readiness = health, on the side port.
    need("--http" in args, "no --http: no side port for the probes and /metrics")
    http_port = port_of(args["--http"]) if "--http" in args else None
    grpc_port = port_of(args["--listen"]) if "--listen" in args else None
    need(ports.get("grpc") == grpc_port, f"port grpc is {ports.get('grpc')}, --listen's is {grpc_port}")
    need(ports.get("http") == http_port, f"port http is {ports.get('http')}, --http's is {http_port}")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container.get(probe, {}).get("httpGet", {})
        need(get.get("path") == path, f"{probe} asks {get.get('path')!r}, not {path}")
        port = get.get("port")
        need(
            ports.get(port, port) == http_port,
            f"{probe} probes port {port!r}, not the side port {http_port}",
        )

    # One member at a time.
    strategy = spec.get("updateStrategy", {})
    need(strategy.get("type") == "RollingUpdate", "updateStrategy is not RollingUpdate")
    need(
        strategy.get("rollingUpdate", {}).get("maxUnavailable", 1) == 1,
        "the rollout may take more than one member at once (rollingUpdate.maxUnavailable)",
    )
    need(
        spec.get("podManagementPolicy") == "OrderedReady",
        "podManagementPolicy is not OrderedReady",
    )
    need(pdb["spec"].get("maxUnavailable") == 1, f"PDB maxUnavailable is {pdb['spec'].get('maxUnavailable')!r}, not 1")
    need("minAvailable" not in pdb["spec"], "PDB sets minAvailable too")
    need(
        pdb["spec"].get("selector", {}).get("matchLabels") == spec["selector"]["matchLabels"],
        "the PDB does not select the StatefulSet's pods",
    )

    # The headless Service and its SRV records.
    need(spec.get("serviceName") == svc["metadata"]["name"], "serviceName is not the Service")
    need(svc["spec"].get("clusterIP") == "None", "the Service is not headless (clusterIP: None)")
    need(
        svc["spec"].get("publishNotReadyAddresses") is True,
        "members in their restart wait drop out of DNS (publishNotReadyAddresses)",
    )
    need(
        svc["spec"].get("selector") == spec["selector"]["matchLabels"],
        "the Service does not select the StatefulSet's pods",
    )
    need(
        all(labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items()),
        "the pod template lacks the selector's labels",
    )
    svc_ports = {p.get("name"): p for p in svc["spec"]["ports"]}
    for name in ("grpc", "http"):
        p = svc_ports.get(name)
        need(p is not None, f"the Service has no port named {name} (no _{name}._tcp SRV record)")
        if p:
            need(
                p.get("targetPort") in (name, ports.get(name)) and p.get("port") == ports.get(name),
                f"Service port {name} does not lead to the container's port {name}",
            )

    # Prometheus.
    need(annotations.get("prometheus.io/scrape") == "true", "prometheus.io/scrape is not \"true\"")
    need(
        annotations.get("prometheus.io/port") == str(http_port),
        f"prometheus.io/port is {annotations.get('prometheus.io/port')!r}, not the side port",
    )
    need(annotations.get("prometheus.io/path") == "/metrics", "prometheus.io/path is not /metrics")

    # The pod: non-root, its user the image's, resources bounded.
    sc, csc = pod.get("securityContext", {}), container.get("securityContext", {})
    need(sc.get("runAsNonRoot") is True, "runAsNonRoot is not true")
    need(csc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation is not false")
    need(csc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem is not true")
    need(csc.get("capabilities", {}).get("drop") == ["ALL"], "capabilities are not all dropped")
    need(
        sc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
        "seccompProfile is not RuntimeDefault",
    )
    user = re.search(r"^USER\s+(\d+)(?::(\d+))?\s*$", containerfile_text, re.M)
    need(user is not None, "the Containerfile has no numeric USER")
    if user:
        need(sc.get("runAsUser") == int(user.group(1)), "runAsUser is not the Containerfile's USER")
        need(sc.get("fsGroup") == int(user.group(2) or user.group(1)), "fsGroup is not the Containerfile's group")
    binary = container.get("command", [None])[0]
    need(
        re.search(rf"^COPY\s.*\s{re.escape(str(binary))}\s*$", containerfile_text, re.M) is not None,
        f"the Containerfile does not install the binary at {binary}",
    )
    need(pod.get("enableServiceLinks") is False, "enableServiceLinks is not false")
    for kind in ("requests", "limits"):
        got = container.get("resources", {}).get(kind, {})
        need({"cpu", "memory"} <= set(got), f"resources.{kind} lacks cpu or memory")
    if "--shutdown-grace" in args:
        need(
            pod.get("terminationGracePeriodSeconds", 30) > duration_s(args["--shutdown-grace"]),
            "terminationGracePeriodSeconds is not longer than --shutdown-grace",
        )

    if servicemonitor:
        (sm,) = [o for o in load(servicemonitor) if o.get("kind") == "ServiceMonitor"]
        need(sm["apiVersion"] == "monitoring.coreos.com/v1", "ServiceMonitor apiVersion")
        need(
            sm["metadata"].get("namespace") == svc["metadata"].get("namespace"),
            "the ServiceMonitor is not in the Service's namespace",
        )
        selector = sm["spec"]["selector"]["matchLabels"]
        need(
            all(svc["metadata"].get("labels", {}).get(k) == v for k, v in selector.items()),
            "the ServiceMonitor does not select the Service",
        )
        for ep in sm["spec"]["endpoints"]:
            need(ep.get("port") == "http", f"ServiceMonitor scrapes port {ep.get('port')!r}, not http")
            need(ep.get("path", "/metrics") == "/metrics", "ServiceMonitor path is not /metrics")

    for what in broken:
        print(f"{rendered}: {what}")
    return 1 if broken else 0


def print_args(rendered, pod_name):
    sts = one(load(rendered), "StatefulSet")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = env_of(container)
    for arg in container.get("command", []) + container.get("args", []):
        print(expand(arg, env, pod_name))
    return 0


def container_of(objects):
    (container,) = one(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    return container


def print_members_file(rendered):
    """The members file, as the pods read it."""
    objects = load(rendered)
    text, problems = members_file(objects, container_of(objects))
    if text is None:
        raise SystemExit("; ".join(problems))
    sys.stdout.write(text)
    return 0


def print_lists(rendered):
    """The member lists, as `bagel server-info --json` shows them."""
    objects = load(rendered)
    print(json.dumps(member_lists(objects, container_of(objects)), separators=(",", ":")))
    return 0


def print_owned(rendered, pod_name, prefix):
    """A name (PREFIX-N) that pod POD_NAME owns under every member list."""
    objects = load(rendered)
    lists = member_lists(objects, container_of(objects))
    for n in range(10_000):
        name = f"{prefix}-{n}"
        if all(owner(ids, name) == pod_name for ids in lists):
            print(name)
            return 0
    raise SystemExit(f"no name {prefix}-N is owned by {pod_name}")


def print_user(rendered):
    sts = one(load(rendered), "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    sc = pod.get("securityContext", {})
    read_only = container.get("securityContext", {}).get("readOnlyRootFilesystem") is True
    print(sc.get("runAsUser", 0), sc.get("runAsGroup", 0), str(read_only).lower())
    return 0


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "check" and len(rest) in (3, 4):
        sys.exit(check(*rest))
    if mode == "args" and len(rest) == 2:
        sys.exit(print_args(*rest))
    if mode == "members-file" and len(rest) == 1:
        sys.exit(print_members_file(*rest))
    if mode == "lists" and len(rest) == 1:
        sys.exit(print_lists(*rest))
    if mode == "owned" and len(rest) == 3:
        sys.exit(print_owned(*rest))
    if mode == "user" and len(rest) == 1:
        sys.exit(print_user(*rest))
    sys.exit(__doc__)
