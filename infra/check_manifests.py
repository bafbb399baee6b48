#!/usr/bin/env python3
"""Checks of infra/k8s that a per-object schema cannot make (run by .ci/run).

kubernetes-validate checks each core object against the Kubernetes schema;
this script checks that the objects fit together, and checks the CRDs
kubernetes-validate does not know against their projects' own models,
refusing unknown fields as the API server would: the KEDA ScaledObject
(cloudcoil.models.keda, generated from KEDA's CRDs) and the PodMonitor
(cloudcoil.models.prometheus_operator, generated from Prometheus Operator's). Exit status 1 and one line per problem when
something is wrong.

tests/it/infra.rs covers what ties the files to the binary (variables the CLI
reads, --config, the stop grace); this covers what ties them to each other.
"""

import sys
from pathlib import Path

import yaml
from pydantic import BaseModel

K8S = Path(__file__).resolve().parent / "k8s"
problems = []


def check(ok, message):
    if not ok:
        problems.append(message)


def load(name):
    docs = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    check(len(docs) == 1, f"{name}: expected one object, found {len(docs)}")
    return docs[0]


def unknown_fields(model, data, path):
    """Keys in `data` that the pydantic `model` does not declare (recursively)."""
    found = []
    if isinstance(model, BaseModel) and isinstance(data, dict):
        fields = type(model).model_fields
        by_alias = {(f.alias or n): n for n, f in fields.items()}
        for key, value in data.items():
            if key not in by_alias:
                found.append(f"{path}.{key}")
                continue
            found += unknown_fields(getattr(model, by_alias[key]), value, f"{path}.{key}")
    elif isinstance(model, list) and isinstance(data, list):
        for i, (m, d) in enumerate(zip(model, data)):
            found += unknown_fields(m, d, f"{path}[{i}]")
    return found


deployment = load("deployment.yaml")
service = load("service.yaml")
configmap = load("configmap.yaml")
secret = load("secret.example.yaml")
hpa = load("scaling/hpa-cpu.yaml")
scaled = load("scaling/keda-scaledobject.yaml")
kustomization = load("kustomization.yaml")
pdb = load("pdb.yaml")
podmonitor = load("podmonitor.yaml")
egress = load("networkpolicy-egress.example.yaml")

name = deployment["metadata"]["name"]
pod = deployment["spec"]["template"]
labels = pod["metadata"]["labels"]
spec = pod["spec"]
(container,) = spec["containers"]
ports = {p["name"]: p["containerPort"] for p in container["ports"]}
volumes = {v["name"]: v for v in spec["volumes"]}
mounts = {m["name"]: m for m in container["volumeMounts"]}

# The Deployment selects its own pods; the Service reaches them on a named port.
for key, value in deployment["spec"]["selector"]["matchLabels"].items():
    check(labels.get(key) == value, f"deployment selector {key}={value} does not match the pod labels")
for key, value in service["spec"]["selector"].items():
    check(labels.get(key) == value, f"service selector {key}={value} does not match the pod labels")
for port in service["spec"]["ports"]:
    check(port["targetPort"] in ports, f"service targetPort {port['targetPort']} is not a container port")
for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
    get = container[probe]["httpGet"]
    check(get["path"] == path, f"{probe} must GET {path}")
    check(get["port"] in ports, f"{probe} port {get['port']} is not a container port")
annotations = pod["metadata"].get("annotations", {})
check(
    int(annotations.get("prometheus.io/port", 0)) in ports.values(),
    "prometheus.io/port is not a container port",
)

# Every volume is mounted; the config volume is the ConfigMap, mounted where --config points.
for vname in volumes:
    check(vname in mounts, f"volume {vname} is not mounted")
for mname in mounts:
    check(mname in volumes, f"volumeMount {mname} has no volume")
config_volume = volumes.get("config", {}).get("configMap", {})
check(config_volume.get("name") == configmap["metadata"]["name"], "the config volume is not the ConfigMap")
args = container["args"]
config_path = args[args.index("--config") + 1]
mount_dir = mounts["config"]["mountPath"].rstrip("/")
check(
    config_path.rsplit("/", 1) == [mount_dir, config_path.rsplit("/", 1)[1]]
    and config_path.rsplit("/", 1)[1] in configmap["data"],
    f"--config {config_path} is not a key of the ConfigMap mounted at {mount_dir}",
)
for writable in ("/mnt/memory", "/workspace", "/tmp"):
    check(
        any(m["mountPath"] == writable for m in mounts.values()),
        f"{writable} must be a volume (the root filesystem is read-only)",
    )

# Security settings the README promises.
check(spec["securityContext"].get("runAsNonRoot") is True, "runAsNonRoot")
check(container["securityContext"].get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem")
check(container["securityContext"].get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation")
check(spec.get("automountServiceAccountToken") is False, "automountServiceAccountToken must be false")

# Secret keys: every reference exists in the example Secret, every key is used.
refs = [
    e["valueFrom"]["secretKeyRef"]
    for e in container["env"]
    if "secretKeyRef" in e.get("valueFrom", {})
]
secret_keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
for ref in refs:
    check(ref["name"] == secret["metadata"]["name"], f"secretKeyRef to unknown Secret {ref['name']}")
    check(ref["key"] in secret_keys, f"secretKeyRef to unknown key {ref['key']}")
check({r["key"] for r in refs} == secret_keys, "the example Secret has keys the Deployment does not use")
for value in secret.get("stringData", {}).values():
    check("REPLACE-ME" in value, "the example Secret must hold placeholders only")

# Autoscalers target the Deployment.
for obj in (hpa, scaled):
    target = obj["spec"]["scaleTargetRef"]
    check(
        target.get("kind", "Deployment") == "Deployment" and target["name"] == name,
        f"{obj['kind']} does not target deployment/{name}",
    )

# The kustomization lists the core files (the PDB among them), not the Secret
# example, an autoscaler, the PodMonitor (needs its CRD) or the example policy.
check(
    sorted(kustomization["resources"])
    == ["configmap.yaml", "deployment.yaml", "pdb.yaml", "service.yaml"],
    "kustomization.yaml must list configmap, deployment, pdb and service",
)


def selects_the_pods(what, selector):
    """`selector` (matchLabels) is non-empty and matches the pod template's labels."""
    match = selector.get("matchLabels", {})
    check(bool(match), f"{what} selects nothing (empty matchLabels would select every pod)")
    for key, value in match.items():
        check(labels.get(key) == value, f"{what} selector {key}={value} does not match the pod labels")


# PodDisruptionBudget: covers the pods, and lets a drain through at the
# fewest replicas the Deployment or an autoscaler may leave (a minAvailable
# equal to that blocks every eviction for good).
selects_the_pods("pdb", pdb["spec"]["selector"])
fewest = min(
    deployment["spec"]["replicas"],
    hpa["spec"].get("minReplicas", 1),
    scaled["spec"].get("minReplicaCount", 0) or 1,
)
budget = pdb["spec"]
check(("minAvailable" in budget) != ("maxUnavailable" in budget), "pdb: set one of minAvailable, maxUnavailable")
if "minAvailable" in budget:
    check(
        isinstance(budget["minAvailable"], int) and 1 <= budget["minAvailable"] < fewest,
        f"pdb minAvailable {budget['minAvailable']} must be at least 1 and below {fewest}, the fewest "
        "replicas the Deployment and autoscalers may leave, or no node drain can evict a pod",
    )
if "maxUnavailable" in budget:
    check(
        isinstance(budget["maxUnavailable"], int) and budget["maxUnavailable"] >= 1,
        "pdb maxUnavailable must be at least 1, or no node drain can evict a pod",
    )

# PodMonitor: the pods, their named metrics port, the annotations' path and port.
selects_the_pods("podmonitor", podmonitor["spec"]["selector"])
(endpoint,) = podmonitor["spec"]["podMetricsEndpoints"]
check(endpoint.get("port") in ports, f"podmonitor port {endpoint.get('port')} is not a named container port")
check(
    ports.get(endpoint.get("port")) == int(annotations.get("prometheus.io/port", 0)),
    "podmonitor port is not the prometheus.io/port the annotations name",
)
check(
    endpoint.get("path") == annotations.get("prometheus.io/path"),
    "podmonitor path is not the prometheus.io/path the annotations name",
)

# Egress NetworkPolicy: the pods, egress only, and only API (443/TCP),
# DNS (53 UDP and TCP) and OTLP (4317, 4318/TCP).
selects_the_pods("networkpolicy", egress["spec"]["podSelector"])
check(egress["spec"].get("policyTypes") == ["Egress"], "networkpolicy: policyTypes must be [Egress]")
allowed = {
    (p.get("protocol", "TCP"), p.get("port"))
    for rule in egress["spec"].get("egress", [])
    for p in rule.get("ports", [{}])
}
expected = {("TCP", 443), ("UDP", 53), ("TCP", 53), ("TCP", 4317), ("TCP", 4318)}
check(allowed == expected, f"networkpolicy egress ports {sorted(allowed, key=str)} are not {sorted(expected)}")
for rule in egress["spec"].get("egress", []):
    check("ports" in rule and "to" in rule, "networkpolicy: every egress rule names its peers and ports")
    for peer in rule.get("to", []):
        block = peer.get("ipBlock")
        if block and block["cidr"] == "0.0.0.0/0":
            check(
                "169.254.0.0/16" in block.get("except", []),
                "networkpolicy: 0.0.0.0/0 must exclude the link-local metadata service",
            )

# KEDA: the ScaledObject against KEDA's models, unknown fields refused.
try:
    from cloudcoil.models.keda.v1alpha1 import ScaledObject

    model = ScaledObject.model_validate(scaled)
    for path in unknown_fields(model, scaled, "ScaledObject"):
        problems.append(f"keda-scaledobject.yaml: unknown field {path}")
    (trigger,) = model.spec.triggers
    check(trigger.type == "prometheus", "the KEDA trigger is prometheus")
    for key in ("serverAddress", "query", "threshold"):
        check(key in trigger.metadata, f"the prometheus trigger needs {key}")
    check(model.spec.min_replica_count >= 1, "minReplicaCount must be at least 1")
except Exception as e:  # pydantic.ValidationError, or an unexpected shape
    problems.append(f"keda-scaledobject.yaml: {e}")

# Prometheus Operator: the PodMonitor against its models, unknown fields refused.
try:
    from cloudcoil.models.prometheus_operator.v1 import PodMonitor

    model = PodMonitor.model_validate(podmonitor)
    for path in unknown_fields(model, podmonitor, "PodMonitor"):
        problems.append(f"podmonitor.yaml: unknown field {path}")
except Exception as e:  # pydantic.ValidationError, or an unexpected shape
    problems.append(f"podmonitor.yaml: {e}")

for p in problems:
    print(f"ERROR {p}")
if problems:
    sys.exit(1)
print(
    "infra/k8s: objects fit together; KEDA ScaledObject and PodMonitor valid against "
    "KEDA's and Prometheus Operator's models"
)
