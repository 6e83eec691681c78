"""The bookie workload of a cluster: its Bookie resources, each Bookie's Pod and claims, and what the cluster needs
around them (headless Service, disruption budget, NetworkPolicies). Plain functions, models in, dicts out."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from bookfleet.kube.models import (
    API_VERSION,
    AntiAffinity,
    Bookie,
    BookieCluster,
    Retention,
    Volume,
    zone_of,
)
from bookfleet.kube.resources.images import bookie_image
from bookfleet.kube.resources.names import (
    ANNOTATION_CONFIG_HASH,
    APP,
    BOOKIE,
    BOOKIE_POD_SELECTOR,
    CLIENT_LABEL,
    HOSTNAME_LABEL,
    LABEL_CLUSTER,
    LABEL_COMPONENT,
    LABEL_NAME,
    REPAIR,
    TLS_DIR,
    ZONE_LABEL,
    bookie_id,
    bookie_name,
    bookie_secret_name,
    labels,
    mount_zookeeper_tls,
    object_metadata,
    owned_by,
    pvc_name,
    quantity_bytes,
    security_env,
    service_name,
    tls_enabled,
    tls_mount,
    tls_volume,
)
from bookfleet.kube.resources.pods import (
    SCRATCH,
    container_security_context,
    pod_security_context,
    scratch_volume,
    with_overrides,
)
from bookfleet.kube.resources.repairjob import METRICS_PORT

JOURNAL_DIR = "/data/journal"
LEDGER_DIR = "/data/ledgers"
VOLUMES = {"journal": JOURNAL_DIR, "ledgers": LEDGER_DIR}
"""Each bookie volume, by the name its PVC and mount use, and where the container sees it."""



def bookies_for_cluster(cluster: BookieCluster) -> list[dict[str, Any]]:
    """The Bookie resources a cluster wants: `<cluster>-<ordinal>`, zones round-robin, owned by the cluster."""
    name, namespace, spec = cluster.metadata.name, cluster.metadata.namespace, cluster.spec
    bookies = []
    for ordinal in range(spec.replicas):
        bookie = bookie_name(name, ordinal)
        bookie_spec = {
            "cluster": name,
            "bookieId": bookie_id(name, bookie, namespace, spec.bookie.port),
            "storage": spec.storage.to_wire(),
            "desiredState": "Writable",
        }
        zone = zone_of(ordinal, spec.zones)
        if zone:
            bookie_spec["zone"] = zone
        manifest = {
            "apiVersion": API_VERSION,
            "kind": Bookie.kind_name,
            "metadata": object_metadata(bookie, namespace, labels(name, BOOKIE, bookie)),
            "spec": bookie_spec,
        }
        bookies.append(owned_by(manifest, cluster))
    return bookies


def bookie_command(cluster: BookieCluster, bookie: Bookie) -> list[str]:
    """The bookie's command line; the advertised address is the stable id, never the pod IP."""
    spec, settings = cluster.spec, cluster.spec.bookie
    command = ["bookfleet", "bookie", "--id", bookie.spec.bookie_id, "--advertised-address", bookie.spec.bookie_id]
    command += ["--listen-host", "0.0.0.0"]  # the kubelet's probes and other pods reach the pod IP, not loopback
    command += ["--port", str(settings.port), "--http-port", str(settings.http_port), "--zk", spec.zookeeper]
    if bookie.spec.zone:
        command += ["--zone", bookie.spec.zone]
    command += ["--journal-dir", JOURNAL_DIR, "--ledger-dir", LEDGER_DIR]
    command += ["--disk-quota", str(quantity_bytes(bookie.spec.storage.ledgers.size))]
    command += ["--disk-usage-threshold", str(settings.disk_usage_threshold)]
    command += ["--disk-usage-lwm", str(settings.disk_usage_lwm)]
    command += ["--gc-interval", str(settings.gc_interval_seconds)]
    if tls_enabled(cluster):
        command += ["--tls-dir", TLS_DIR]
    command += [arg for key, value in sorted(settings.config.items()) for arg in (f"--{key}", value)]
    return command + settings.extra_args


def _affinity(cluster: BookieCluster, bookie: Bookie) -> dict[str, Any]:
    affinity: dict[str, Any] = {}
    if bookie.spec.zone:
        term = {"matchExpressions": [{"key": ZONE_LABEL, "operator": "In", "values": [bookie.spec.zone]}]}
        affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    spread = {
        "labelSelector": {"matchLabels": {**BOOKIE_POD_SELECTOR, LABEL_CLUSTER: cluster.metadata.name}},
        "topologyKey": HOSTNAME_LABEL,
    }
    if cluster.spec.anti_affinity == AntiAffinity.REQUIRED:
        affinity["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [spread]}
    elif cluster.spec.anti_affinity == AntiAffinity.PREFERRED:
        preferred = {"weight": 100, "podAffinityTerm": spread}
        affinity["podAntiAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": [preferred]}
    return affinity


def _probe(path: str, period: int, failures: int, timeout: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": failures,
            "timeoutSeconds": timeout}


def bookie_probes() -> dict[str, dict[str, Any]]:
    """The bookie answers its probes on the event loop that serves the data path, so under load an answer can take
    seconds: Kubernetes' 1 s default would fail Ready and restart busy bookies. Liveness restarts only after a
    minute without an answer; readiness reacts within ~15 s."""
    return {
        "startupProbe": _probe("/healthz", period=5, failures=60, timeout=5),
        "livenessProbe": _probe("/healthz", period=10, failures=6, timeout=10),
        "readinessProbe": _probe("/readyz", period=5, failures=3, timeout=5),
    }


def _zone_spread(cluster: BookieCluster) -> list[dict[str, Any]]:
    """Without explicit zones, bookies still prefer distinct zones, so one zone outage takes at most its share."""
    selector = {"matchLabels": {**BOOKIE_POD_SELECTOR, LABEL_CLUSTER: cluster.metadata.name}}
    return [{"maxSkew": 1, "topologyKey": ZONE_LABEL, "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": selector}]


def bookie_pod(cluster: BookieCluster, bookie: Bookie) -> dict[str, Any]:
    """The bookie's Pod, owned by its Bookie; hostname + subdomain make its id resolve through the headless Service.
    Annotated with the digest of what the bookie runs (`runs_hash`), which a rollout compares."""
    manifest = bookie_pod_as_built(cluster, bookie)
    manifest["metadata"]["annotations"] = {**manifest["metadata"].get("annotations", {}),
                                           ANNOTATION_CONFIG_HASH: runs_hash(cluster, manifest)}
    return manifest


def bookie_pod_as_built(cluster: BookieCluster, bookie: Bookie) -> dict[str, Any]:
    """The bookie's Pod without its digest annotation."""
    name, namespace = bookie.metadata.name, bookie.metadata.namespace
    settings = cluster.spec.bookie
    container = {
        "name": BOOKIE,
        "image": bookie_image(cluster),
        "imagePullPolicy": cluster.spec.image_pull_policy,
        "command": bookie_command(cluster, bookie),
        "ports": [
            {"name": BOOKIE, "containerPort": settings.port, "protocol": "TCP"},
            {"name": "http", "containerPort": settings.http_port, "protocol": "TCP"},
        ],
        **bookie_probes(),
        "resources": cluster.spec.resources.to_wire(),
        "volumeMounts": [{"name": volume, "mountPath": path} for volume, path in VOLUMES.items()] + [SCRATCH],
        "securityContext": container_security_context(),
    }
    volumes = [{"name": volume, "persistentVolumeClaim": {"claimName": pvc_name(name, volume)}} for volume in VOLUMES]
    volumes.append(scratch_volume())
    if env := security_env(cluster, with_tls_dir=False):
        container["env"] = env
    if tls_enabled(cluster):
        container["volumeMounts"].append(tls_mount())
        volumes.append(tls_volume(bookie_secret_name(name)))
    mount_zookeeper_tls(cluster, container, volumes)
    pod_spec: dict[str, Any] = {
        "hostname": name,
        "subdomain": service_name(cluster.metadata.name),
        "automountServiceAccountToken": False,  # a bookie never calls the Kubernetes API
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": 60,
        # The pod's pause process is PID 1, not the bookie: the kernel drops a signal to a namespace's PID 1 that has
        # no handler, so a bookie stopped before it installed its own (a pod deleted as it starts: the restart for
        # its node's zone) ignored SIGTERM and took the whole grace period to go. Not in RUNS: rolls no bookie.
        "shareProcessNamespace": True,
        "containers": [container],
        "volumes": volumes,
    }
    affinity = _affinity(cluster, bookie)
    if affinity:
        pod_spec["affinity"] = affinity
    if not cluster.spec.zones:
        pod_spec["topologySpreadConstraints"] = _zone_spread(cluster)
    metadata = object_metadata(name, namespace, labels(cluster.metadata.name, BOOKIE, name))
    with_overrides(metadata, pod_spec, cluster.spec.pod_template)
    return owned_by({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}, bookie)


RUNS = ("image", "imagePullPolicy", "command", "env", "ports", "resources", "volumeMounts")
"""The fields of the bookie container that make what the bookie runs; its probes and security context are what the
operator adds around it."""


def runs_hash(cluster: BookieCluster, manifest: dict[str, Any]) -> str:
    """The digest of what the bookie runs: its container's image, command line, environment, ports, resources and
    mounts, the volumes, and the spec's own scheduling choices (podTemplate, antiAffinity). Not what the operator adds
    around it (labels, probes, security contexts, spreading, owner): an operator upgrade that changes only those
    restarts no bookie; its pods get them when they are next created."""
    pod_spec = manifest["spec"]
    (container,) = pod_spec["containers"]
    return digest({"container": {key: container[key] for key in RUNS if key in container},
                   "volumes": pod_spec["volumes"], "podTemplate": cluster.spec.pod_template.to_wire(),
                   "antiAffinity": cluster.spec.anti_affinity.value})


def whole_pod_hash(cluster: BookieCluster, bookie: Bookie) -> str:
    """The digest operators before `runs_hash` annotated pods with: of the whole pod as built. A pod carrying it is
    current while it matches what this operator builds (then re-annotated in place, without a restart), so the
    upgrade to an operator with `runs_hash` restarts no bookie. Their pods had no shared process namespace."""
    pod = bookie_pod_as_built(cluster, bookie)
    del pod["spec"]["shareProcessNamespace"]
    return digest(pod)


def digest(value: Any) -> str:
    """A short digest of a JSON value (canonical JSON)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def bookie_pvcs(cluster: BookieCluster, bookie: Bookie) -> list[dict[str, Any]]:
    """Journal and ledger claims. Owned by the Bookie (so deleted with it and with its cluster) only when the
    cluster's whenDeleted policy is Delete; with Retain they have no owner and outlive both."""
    name, namespace = bookie.metadata.name, bookie.metadata.namespace
    owned = cluster.spec.persistent_volume_claim_retention_policy.when_deleted == Retention.DELETE
    claims = []
    for volume, request in (("journal", bookie.spec.storage.journal), ("ledgers", bookie.spec.storage.ledgers)):
        claim = _pvc(pvc_name(name, volume), namespace, bookie.spec.cluster, name, request)
        claims.append(owned_by(claim, bookie) if owned else claim)
    return claims


def claim_names(bookie_name: str) -> list[str]:
    """The names of a bookie's PVCs, one per volume."""
    return [pvc_name(bookie_name, volume) for volume in VOLUMES]


def _pvc(name: str, namespace: str, cluster: str, bookie: str, request: Volume) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": str(request.size)}},
    }
    if request.storage_class_name:
        spec["storageClassName"] = request.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": object_metadata(name, namespace, labels(cluster, BOOKIE, bookie)),
        "spec": spec,
    }


def bookies_service(cluster: BookieCluster) -> dict[str, Any]:
    """Headless and publishing not-ready pods: a bookie must resolve its own id before it can register and be ready."""
    name, settings = cluster.metadata.name, cluster.spec.bookie
    manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(service_name(name), cluster.metadata.namespace, labels(name, BOOKIE)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {**BOOKIE_POD_SELECTOR, LABEL_CLUSTER: name},
            "ports": [
                {"name": BOOKIE, "port": settings.port, "targetPort": BOOKIE, "protocol": "TCP"},
                {"name": "http", "port": settings.http_port, "targetPort": "http", "protocol": "TCP"},
            ],
        },
    }
    return owned_by(manifest, cluster)


def bookie_disruption_budget(cluster: BookieCluster) -> dict[str, Any]:
    """At most `maxUnavailable` bookies down by drains and evictions.

    An integer minAvailable, not maxUnavailable: the Kubernetes disruption controller resolves maxUnavailable through
    the pods' controller's scale subresource, and a bookie pod's controller is its Bookie, which has none.
    """
    name, spec = cluster.metadata.name, cluster.spec
    manifest = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_metadata(service_name(name), cluster.metadata.namespace, labels(name, BOOKIE)),
        "spec": {
            "minAvailable": max(spec.replicas - spec.max_unavailable, 0),
            "selector": {"matchLabels": {**BOOKIE_POD_SELECTOR, LABEL_CLUSTER: name}},
        },
    }
    return owned_by(manifest, cluster)


def fleet_peers(cluster: BookieCluster) -> list[dict[str, Any]]:
    """Who may talk to a cluster's bookies: its own pods (bookies, repair drivers and executors), pods of the
    namespace labelled as clients, and the spec's extra clients. Not the operator: it never connects to a bookie (it
    reads their registrations in ZooKeeper), and admitting its labels from any namespace admitted anyone who may label
    a pod anywhere."""
    name = cluster.metadata.name
    return [
        {"podSelector": {"matchLabels": {LABEL_NAME: APP, LABEL_CLUSTER: name}}},
        {"podSelector": {"matchLabels": {CLIENT_LABEL: "true"}}},
        *(peer.to_wire() for peer in cluster.spec.network_policy.clients),
    ]


def network_policies(cluster: BookieCluster) -> list[dict[str, Any]]:
    """Ingress of the cluster's bookies and repair pods; anything not allowed here is denied.

    Bookie port: the fleet's peers only. HTTP port (probes, /metrics, read-only): open. Repair drivers and their
    executors: only each other (executors connect back to the driver; the driver fetches from executors), and the
    driver's metrics port (read-only), open as the bookies' HTTP port is.
    """
    name, namespace, settings = cluster.metadata.name, cluster.metadata.namespace, cluster.spec.bookie
    repair_pods = {"matchLabels": {LABEL_NAME: APP, LABEL_COMPONENT: REPAIR, LABEL_CLUSTER: name}}
    bookies = {
        "podSelector": {"matchLabels": {**BOOKIE_POD_SELECTOR, LABEL_CLUSTER: name}},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": fleet_peers(cluster), "ports": [{"protocol": "TCP", "port": settings.port}]},
            {"ports": [{"protocol": "TCP", "port": settings.http_port}]},
        ],
    }
    repairs = {
        "podSelector": repair_pods,
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": repair_pods}]},
                    {"ports": [{"protocol": "TCP", "port": METRICS_PORT}]}],
    }
    policies = []
    for component, spec in ((BOOKIE, bookies), (REPAIR, repairs)):
        metadata = object_metadata(f"{name}-{component}", namespace, labels(name, component))
        manifest = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata, "spec": spec}
        policies.append(owned_by(manifest, cluster))
    return policies


def cluster_objects(cluster: BookieCluster) -> list[dict[str, Any]]:
    """What a cluster needs besides its Bookies: headless Service, disruption budget, network policies (unless
    spec.networkPolicy.enabled is false)."""
    policies = network_policies(cluster) if cluster.spec.network_policy.enabled else []
    return [bookies_service(cluster), bookie_disruption_budget(cluster), *policies]
