"""Kubernetes manifests built from the custom resources: plain functions, models in, dicts out, no API calls.

Every name is derived from the resource it serves, so a handler that runs twice builds the same object twice and
the API server's "already exists" tells it the work was done.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from bookfleet import spark
from bookfleet.kube.models import (
    API_VERSION,
    AntiAffinity,
    Bookie,
    BookieCluster,
    CustomResource,
    PodOverrides,
    Retention,
    TlsMode,
    Volume,
    zone_of,
)
from bookfleet.meta.zk import ZK_AUTH_ENV
from bookfleet.security.tls import KUBERNETES_FILES, TLS_DIR_ENV

APP = "bookfleet"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_CLUSTER = "bookfleet.io/cluster"
LABEL_BOOKIE = "bookfleet.io/bookie"
CLIENT_LABEL = "bookfleet.io/client"
"""Pods labelled `bookfleet.io/client: "true"` may reach the bookies and ZooKeeper (the chart's NetworkPolicies name
the same label); every other pod outside the fleet is refused."""
ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"
ANNOTATION_LOST_SINCE = "bookfleet.io/lost-since"
ANNOTATION_BOOKIE_ID = "bookfleet.io/bookie-id"
"""On a repair: the id of the bookie whose ledgers it repairs. Which ledgers those are is in ZooKeeper (the
under-replication markers name the bookie), never in the object: an annotation holds 256 KiB, ~24,000 ids."""
ANNOTATION_CONFIG_HASH = "bookfleet.io/config-hash"
"""On a bookie pod: the digest of everything else in the pod as built; a pod whose digest differs from the one the
current spec builds is rolled (image, resources, settings, ZooKeeper, TLS, storage all reach the pod this way)."""

BOOKIE = "bookie"
REPAIR = "repair"
OPERATOR = "operator"
BOOKIE_POD_SELECTOR = {LABEL_NAME: APP, LABEL_COMPONENT: BOOKIE}
REPAIR_SELECTOR = {LABEL_NAME: APP, LABEL_COMPONENT: REPAIR}
"""Repair Jobs and SparkApplications of every cluster (the operator indexes them by ledger)."""
"""Labels every bookie pod carries: what the operator's pod watch selects on."""

JOURNAL_DIR = "/data/journal"
LEDGER_DIR = "/data/ledgers"
VOLUMES = {"journal": JOURNAL_DIR, "ledgers": LEDGER_DIR}
"""Each bookie volume, by the name its PVC and mount use, and where the container sees it."""

RUN_AS = 10001
"""The non-root user of the bookie image (bookie-image/Dockerfile)."""

SCRATCH = {"name": "tmp", "mountPath": "/tmp"}
"""The one writable directory besides the data volumes: root filesystems are read-only."""
SCRATCH_LIMIT = "1Gi"
EXECUTOR_CONTAINER = "executor"
EXECUTOR_TEMPLATE_DIR = "/etc/bookfleet/spark"
EXECUTOR_TEMPLATE_FILE = "executor-pod-template.yaml"
EXECUTOR_TEMPLATE_PREFIX = "bookfleet-repair-executor"
"""The ConfigMap holding the pod template Spark's driver gives every executor pod (see executor_template_name)."""

K8S_MASTER = "k8s://https://kubernetes.default.svc"
REPAIR_JOB = "spark_repair"
DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MAX_NAME = 63
EXECUTOR_PREFIX_MAX = 47
"""Spark refuses longer executor pod name prefixes."""

REPAIR_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete", "deletecollection"],
    },
    {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["create", "delete", "deletecollection"],
    },
]
"""What Spark's driver in client mode does in its namespace: create, watch, label and delete its executor pods, and
create and delete their config map. No services (only a cluster-mode driver has one; the driver is told not to
delete any) and no volumes (executors mount none). RBAC cannot tell an executor pod from a bookie: the chart's
admission policy lets the repair account change or delete only pods labelled as repair pods."""


# --- names and labels ----------------------------------------------------------------------------------------


def bookie_name(cluster: str, ordinal: int) -> str:
    return f"{cluster}-{ordinal}"


def service_name(cluster: str) -> str:
    """The headless Service that gives every bookie of the cluster a DNS name."""
    return f"{cluster}-bookies"


def bookie_id(cluster: str, bookie: str, namespace: str, port: int) -> str:
    """`<bookie>.<cluster>-bookies.<ns>.svc:<port>`: survives pod restarts and rescheduling, unlike a pod IP."""
    return f"{bookie}.{service_name(cluster)}.{namespace}.svc:{port}"


def pvc_name(bookie: str, volume: str) -> str:
    return f"{bookie}-{volume}"


def ca_secret_name(cluster: str) -> str:
    return f"{cluster}-tls-ca"


def bookie_secret_name(bookie: str) -> str:
    return f"{bookie}-tls"


def replicator_secret_name(cluster: str) -> str:
    return f"{cluster}-tls-replicator"


# --- security: TLS directories from Secrets, the ZooKeeper credential ------------------------------------------

TLS_DIR = "/etc/bookfleet/tls"
"""Where pods see their TLS directory (mounted whole, never by subPath, so the kubelet's refreshes show)."""
TLS_VOLUME = "tls"
CA_KEY, CERT_KEY, KEY_KEY = KUBERNETES_FILES
"""A TLS Secret's keys (kubernetes.io/tls layout, as cert-manager writes it), which are also the file names."""
ZK_AUTH_KEY = "auth"


def tls_enabled(cluster: BookieCluster) -> bool:
    return cluster.spec.security.tls != TlsMode.DISABLED


def tls_mount() -> dict[str, Any]:
    return {"name": TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": True}


def tls_volume(secret: str) -> dict[str, Any]:
    return {"name": TLS_VOLUME, "secret": {"secretName": secret, "defaultMode": 0o440}}


def security_env(cluster: BookieCluster, with_tls_dir: bool) -> list[dict[str, Any]]:
    """The ZooKeeper credential from its Secret, and where the TLS directory is for a client."""
    env: list[dict[str, Any]] = []
    secret = cluster.spec.security.zookeeper_auth_secret
    if secret:
        env.append({"name": ZK_AUTH_ENV, "valueFrom": {"secretKeyRef": {"name": secret, "key": ZK_AUTH_KEY}}})
    if with_tls_dir and tls_enabled(cluster):
        env.append({"name": TLS_DIR_ENV, "value": TLS_DIR})
    return env


def labels(cluster: str, component: str, bookie: str | None = None) -> dict[str, str]:
    found = {
        LABEL_NAME: APP,
        LABEL_COMPONENT: component,
        LABEL_INSTANCE: cluster,
        LABEL_MANAGED_BY: "bookfleet-operator",
        LABEL_CLUSTER: cluster,
    }
    if bookie:
        found[LABEL_BOOKIE] = bookie
    return found


def _hashed_name(prefix: str, *parts: str) -> str:
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:10]
    return f"{prefix[: MAX_NAME - len(digest) - 1].rstrip('-')}-{digest}"


def repair_name(cluster: str, bookie: str, lost_since: dt.datetime, attempt: int = 0) -> str:
    """The same (cluster, bookie, loss time, attempt) always names the same repair: a retried handler finds it."""
    lost = _utc_seconds(lost_since).isoformat()
    return _hashed_name(f"{bookie}-repair", cluster, bookie, lost, str(attempt))


def _utc_seconds(moment: dt.datetime) -> dt.datetime:
    """Loss times round-trip through status strings; whole UTC seconds name them the same either side."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC).replace(microsecond=0)


# --- owner references ----------------------------------------------------------------------------------------


def owner_reference(owner: CustomResource | Mapping[str, Any], controller: bool = True) -> dict[str, Any]:
    """A reference that makes Kubernetes delete the dependent with its owner; needs the owner's uid."""
    body = owner.to_wire() if isinstance(owner, CustomResource) else owner
    meta = body.get("metadata", {})
    if not meta.get("uid"):
        raise ValueError(f"{body.get('kind')} {meta.get('name')!r} has no uid yet: create it before owning objects")
    return {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def owned_by(manifest: dict[str, Any], owner: CustomResource | Mapping[str, Any]) -> dict[str, Any]:
    """`manifest` with `owner` as its controller (in place, returned for chaining)."""
    manifest["metadata"]["ownerReferences"] = [owner_reference(owner)]
    return manifest


def _metadata(name: str, namespace: str, object_labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": object_labels}


# --- quantities ----------------------------------------------------------------------------------------------

_SUFFIXES = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)$")


def quantity_bytes(quantity: int | str) -> int:
    """Bytes in a storage quantity such as 10Gi, 500M or 1073741824."""
    match = _QUANTITY.match(str(quantity))
    if not match or match.group(2) not in _SUFFIXES:
        raise ValueError(f"{quantity!r} is not a storage quantity (e.g. 10Gi, 500M, 1073741824)")
    return int(float(match.group(1)) * _SUFFIXES[match.group(2)])


# --- bookies -------------------------------------------------------------------------------------------------


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
            "metadata": _metadata(bookie, namespace, labels(name, BOOKIE, bookie)),
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


def container_security_context() -> dict[str, Any]:
    """Restricted Pod Security for a container, and a read-only root filesystem: writes go to mounted volumes."""
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def with_overrides(metadata: dict[str, Any], pod_spec: dict[str, Any], overrides: PodOverrides) -> None:
    """Merge a spec's pod overrides into a pod as built (in place): see models.PodOverrides for what wins."""
    if overrides.labels:
        metadata["labels"] = {**overrides.labels, **metadata.get("labels", {})}
    if overrides.annotations:
        metadata["annotations"] = {**overrides.annotations, **metadata.get("annotations", {})}
    if overrides.node_selector:
        pod_spec["nodeSelector"] = {**pod_spec.get("nodeSelector", {}), **overrides.node_selector}
    if overrides.tolerations:
        pod_spec["tolerations"] = [*pod_spec.get("tolerations", []), *overrides.tolerations]
    if overrides.affinity:
        pod_spec["affinity"] = merged_affinity(pod_spec.get("affinity", {}), overrides.affinity)
    if overrides.priority_class_name:
        pod_spec["priorityClassName"] = overrides.priority_class_name
    if overrides.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in overrides.image_pull_secrets]
    if overrides.service_account_name:
        pod_spec["serviceAccountName"] = overrides.service_account_name


def merged_affinity(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> dict[str, Any]:
    """Both sets of affinity terms: lists are joined, except required node selector terms, which are ORed by
    Kubernetes, so each of theirs is ANDed with each of ours (a bookie pinned to its zone stays pinned)."""
    merged = dict(ours)
    for key, value in theirs.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merged_affinity(merged[key], value)
        elif key == "nodeSelectorTerms" and merged.get(key):
            merged[key] = [{**mine, "matchExpressions": [*mine.get("matchExpressions", []),
                                                         *other.get("matchExpressions", [])]}
                           for mine in merged[key] for other in value]
        elif isinstance(value, list) and isinstance(merged.get(key), list):
            merged[key] = [*merged[key], *value]
        else:
            merged[key] = value
    return merged


def _scratch_volume() -> dict[str, Any]:
    return {"name": SCRATCH["name"], "emptyDir": {"sizeLimit": SCRATCH_LIMIT}}


def _zone_spread(cluster: BookieCluster) -> list[dict[str, Any]]:
    """Without explicit zones, bookies still prefer distinct zones, so one zone outage takes at most its share."""
    selector = {"matchLabels": {**BOOKIE_POD_SELECTOR, LABEL_CLUSTER: cluster.metadata.name}}
    return [{"maxSkew": 1, "topologyKey": ZONE_LABEL, "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": selector}]


def bookie_pod(cluster: BookieCluster, bookie: Bookie) -> dict[str, Any]:
    """The bookie's Pod, owned by its Bookie; hostname + subdomain make its id resolve through the headless Service."""
    name, namespace = bookie.metadata.name, bookie.metadata.namespace
    settings = cluster.spec.bookie
    container = {
        "name": BOOKIE,
        "image": cluster.spec.image,
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
    volumes.append(_scratch_volume())
    if env := security_env(cluster, with_tls_dir=False):
        container["env"] = env
    if tls_enabled(cluster):
        container["volumeMounts"].append(tls_mount())
        volumes.append(tls_volume(bookie_secret_name(name)))
    pod_spec: dict[str, Any] = {
        "hostname": name,
        "subdomain": service_name(cluster.metadata.name),
        "automountServiceAccountToken": False,  # a bookie never calls the Kubernetes API
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": 60,
        "containers": [container],
        "volumes": volumes,
    }
    affinity = _affinity(cluster, bookie)
    if affinity:
        pod_spec["affinity"] = affinity
    if not cluster.spec.zones:
        pod_spec["topologySpreadConstraints"] = _zone_spread(cluster)
    metadata = _metadata(name, namespace, labels(cluster.metadata.name, BOOKIE, name))
    with_overrides(metadata, pod_spec, cluster.spec.pod_template)
    manifest = owned_by({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}, bookie)
    manifest["metadata"]["annotations"] = {**metadata.get("annotations", {}),
                                           ANNOTATION_CONFIG_HASH: config_hash(manifest)}
    return manifest


def config_hash(manifest: dict[str, Any]) -> str:
    """A short digest of a manifest as built (canonical JSON), to tell whether a running pod matches it."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]


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
        "metadata": _metadata(name, namespace, labels(cluster, BOOKIE, bookie)),
        "spec": spec,
    }


def bookies_service(cluster: BookieCluster) -> dict[str, Any]:
    """Headless and publishing not-ready pods: a bookie must resolve its own id before it can register and be ready."""
    name, settings = cluster.metadata.name, cluster.spec.bookie
    manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(service_name(name), cluster.metadata.namespace, labels(name, BOOKIE)),
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
        "metadata": _metadata(service_name(name), cluster.metadata.namespace, labels(name, BOOKIE)),
        "spec": {
            "minAvailable": max(spec.replicas - spec.max_unavailable, 0),
            "selector": {"matchLabels": {**BOOKIE_POD_SELECTOR, LABEL_CLUSTER: name}},
        },
    }
    return owned_by(manifest, cluster)


def fleet_peers(cluster: BookieCluster) -> list[dict[str, Any]]:
    """Who may talk to a cluster's bookies: its own pods (bookies, repair drivers and executors), the operator
    wherever it runs, pods of the namespace labelled as clients, and the spec's extra clients."""
    name = cluster.metadata.name
    return [
        {"podSelector": {"matchLabels": {LABEL_NAME: APP, LABEL_CLUSTER: name}}},
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {LABEL_NAME: APP, LABEL_COMPONENT: OPERATOR}}},
        {"podSelector": {"matchLabels": {CLIENT_LABEL: "true"}}},
        *(peer.to_wire() for peer in cluster.spec.network_policy.clients),
    ]


def network_policies(cluster: BookieCluster) -> list[dict[str, Any]]:
    """Ingress of the cluster's bookies and repair pods; anything not allowed here is denied.

    Bookie port: the fleet's peers only. HTTP port (probes, /metrics, read-only): open. Repair drivers and their
    executors: only each other (executors connect back to the driver; the driver fetches from executors).
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
        "ingress": [{"from": [{"podSelector": repair_pods}]}],
    }
    policies = []
    for component, spec in ((BOOKIE, bookies), (REPAIR, repairs)):
        metadata = _metadata(f"{name}-{component}", namespace, labels(name, component))
        manifest = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata, "spec": spec}
        policies.append(owned_by(manifest, cluster))
    return policies


def cluster_objects(cluster: BookieCluster) -> list[dict[str, Any]]:
    """What a cluster needs besides its Bookies: headless Service, disruption budget, network policies (unless
    spec.networkPolicy.enabled is false)."""
    policies = network_policies(cluster) if cluster.spec.network_policy.enabled else []
    return [bookies_service(cluster), bookie_disruption_budget(cluster), *policies]


# --- repair --------------------------------------------------------------------------------------------------


def _repair_image(cluster: BookieCluster) -> str:
    return cluster.spec.auto_recovery.repair.image


def _submit_parts(cluster: BookieCluster, ledgers: Iterable[int]) -> tuple[list[str], str, list[str]]:
    """spark-submit's options, application file and application arguments, as the Spark module builds them."""
    repair, image = cluster.spec.auto_recovery.repair, _repair_image(cluster)
    argv = spark.spark_submit_options(
        K8S_MASTER,
        cluster.spec.zookeeper,
        ledgers,
        executors=repair.executors,
        executor_memory=repair.executor_memory,
        throttle_mb_s=repair.throttle_mb_per_s or None,
        image=image,
        job=REPAIR_JOB,
    )
    app = argv.index(spark.app_path(REPAIR_JOB, image))
    return argv[:app], argv[app], argv[app + 1 :]


def _client_mode(options: list[str]) -> list[str]:
    """The Job's pod is the driver itself, so its exit status is the repair's outcome."""
    options = list(options)
    if "--deploy-mode" in options:
        options[options.index("--deploy-mode") + 1] = "client"
    else:
        options += ["--deploy-mode", "client"]
    return options


_SPARK_ENV = {"driver": "spark.kubernetes.driverEnv", "executor": "spark.executorEnv"}


def _spark_security(cluster: BookieCluster, *pods: str) -> dict[str, str]:
    """Spark settings that give the driver and/or executor pods Spark creates the replicator's TLS directory and
    the ZooKeeper credential."""
    settings = {}
    secret = cluster.spec.security.zookeeper_auth_secret
    for pod in pods:
        if tls_enabled(cluster):
            settings[f"spark.kubernetes.{pod}.secrets.{replicator_secret_name(cluster.metadata.name)}"] = TLS_DIR
            settings[f"{_SPARK_ENV[pod]}.{TLS_DIR_ENV}"] = TLS_DIR
        if secret:
            settings[f"spark.kubernetes.{pod}.secretKeyRef.{ZK_AUTH_ENV}"] = f"{secret}:{ZK_AUTH_KEY}"
    return settings


def _conf(settings: Mapping[str, str]) -> list[str]:
    return [arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")]


def repair_command(cluster: BookieCluster, name: str, ledgers: Iterable[int] = ()) -> list[str]:
    """spark-submit in client mode on Spark's Kubernetes scheduler; executors are pods owned by the driver pod."""
    options, app, app_args = _submit_parts(cluster, ledgers)
    executor_labels = labels(cluster.metadata.name, REPAIR)
    kubernetes = {
        "spark.kubernetes.namespace": cluster.metadata.namespace,
        "spark.kubernetes.driver.pod.name": "$(POD_NAME)",
        "spark.kubernetes.executor.podNamePrefix": name[:EXECUTOR_PREFIX_MAX].rstrip("-"),
        "spark.kubernetes.authenticate.caCertFile": f"{SERVICE_ACCOUNT_DIR}/ca.crt",
        "spark.kubernetes.authenticate.oauthTokenFile": f"{SERVICE_ACCOUNT_DIR}/token",
        "spark.kubernetes.container.image.pullPolicy": cluster.spec.image_pull_policy,
        "spark.driver.host": "$(POD_IP)",
        # Spark 4 tells executors the bind address (spark.kubernetes.executor.useDriverPodIP): it must be the pod IP.
        "spark.driver.bindAddress": "$(POD_IP)",
        "spark.driver.port": str(DRIVER_PORT),
        "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
        "spark.kubernetes.driver.service.deleteOnTermination": "false",  # a client-mode driver has none
        **{f"spark.kubernetes.executor.label.{key}": value for key, value in executor_labels.items()},
        **_spark_security(cluster, "executor"),
    }
    executors = _executor_conf(cluster.spec.auto_recovery.repair.executor_cores)
    application = app.removeprefix("local://")
    return ["spark-submit", *_client_mode(options), *_conf(kubernetes | executors), application, *app_args]


def _executor_conf(cores: int) -> dict[str, str]:
    """Executor pods from the restricted template, with CPU requested and capped (Spark sets memory itself:
    request = limit = executor memory + overhead)."""
    return {
        "spark.kubernetes.executor.podTemplateFile": f"{EXECUTOR_TEMPLATE_DIR}/{EXECUTOR_TEMPLATE_FILE}",
        "spark.kubernetes.executor.podTemplateContainerName": EXECUTOR_CONTAINER,
        "spark.executor.cores": str(cores),
        "spark.kubernetes.executor.request.cores": str(cores),
        "spark.kubernetes.executor.limit.cores": str(cores),
    }


def executor_template_name(cluster: BookieCluster) -> str:
    """Named by its content (the cluster's executor settings go into it): a new template gets a new ConfigMap, and
    clusters of one namespace with different settings do not share one."""
    return _hashed_name(EXECUTOR_TEMPLATE_PREFIX, _executor_template_text(cluster))


def _executor_template_text(cluster: BookieCluster) -> str:
    return yaml.safe_dump(executor_pod_template(cluster), sort_keys=False)


def executor_pod_template(cluster: BookieCluster) -> dict[str, Any]:
    """The pod Spark starts each executor from: restricted, no API token (executors never call the API), /tmp, and
    the cluster's executorPodTemplate settings (Spark adds its own labels to these)."""
    metadata: dict[str, Any] = {}
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "containers": [
            {"name": EXECUTOR_CONTAINER, "securityContext": container_security_context(), "volumeMounts": [SCRATCH]}
        ],
        "volumes": [_scratch_volume()],
    }
    with_overrides(metadata, spec, cluster.spec.auto_recovery.repair.executor_pod_template)
    return {"apiVersion": "v1", "kind": "Pod", **({"metadata": metadata} if metadata else {}), "spec": spec}


def repair_job(
    cluster: BookieCluster, bookie: Bookie, lost_since: dt.datetime, ledgers: Iterable[int] = (), attempt: int = 0
) -> dict[str, Any]:
    """The repair of a lost bookie's ledgers as a Job, owned by the cluster (the Bookie may go before it ends)."""
    name = repair_name(cluster.metadata.name, bookie.metadata.name, lost_since, attempt)
    namespace, repair = cluster.metadata.namespace, cluster.spec.auto_recovery.repair
    job_labels = labels(cluster.metadata.name, REPAIR, bookie.metadata.name)
    downward = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    template = {"name": "executor-template", "mountPath": EXECUTOR_TEMPLATE_DIR, "readOnly": True}
    container = {
        "name": "driver",
        "image": _repair_image(cluster),
        "imagePullPolicy": cluster.spec.image_pull_policy,
        "command": repair_command(cluster, name, ledgers),
        "env": downward + security_env(cluster, with_tls_dir=True),
        "ports": [
            {"name": "driver", "containerPort": DRIVER_PORT, "protocol": "TCP"},
            {"name": "blockmanager", "containerPort": BLOCK_MANAGER_PORT, "protocol": "TCP"},
        ],
        "resources": repair.driver_resources.to_wire(),
        "volumeMounts": [SCRATCH, template],
        "securityContext": container_security_context(),
    }
    volumes = [_scratch_volume(), {"name": template["name"], "configMap": {"name": executor_template_name(cluster)}}]
    pod_spec: dict[str, Any] = {
        "serviceAccountName": repair.service_account_name,
        "automountServiceAccountToken": True,  # the driver creates and watches its executor pods
        "restartPolicy": "Never",
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": volumes,
    }
    if tls_enabled(cluster):  # the driver's TLS directory: the replicator's certificate
        container["volumeMounts"].append(tls_mount())
        volumes.append(tls_volume(replicator_secret_name(cluster.metadata.name)))
    metadata = _metadata(name, namespace, job_labels)
    metadata["annotations"] = repair_annotations(bookie, lost_since)
    pod_metadata: dict[str, Any] = {"labels": job_labels}
    with_overrides(pod_metadata, pod_spec, repair.driver_pod_template)
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": repair.backoff_limit,
            "activeDeadlineSeconds": repair.active_deadline_seconds,
            "ttlSecondsAfterFinished": repair.ttl_seconds_after_finished,
            "template": {"metadata": pod_metadata, "spec": pod_spec},
        },
    }
    return owned_by(manifest, cluster)


def repair_annotations(bookie: Bookie, lost_since: dt.datetime) -> dict[str, str]:
    """Which loss a repair answers: the bookie's id and its loss time (the attempts of one loss share both)."""
    return {ANNOTATION_LOST_SINCE: _utc_seconds(lost_since).isoformat(), ANNOTATION_BOOKIE_ID: bookie.spec.bookie_id}


def spark_application(
    cluster: BookieCluster, bookie: Bookie, lost_since: dt.datetime, ledgers: Iterable[int] = (), attempt: int = 0
) -> dict[str, Any]:
    """The same repair for clusters running the Spark operator (sparkoperator.k8s.io/v1beta2)."""
    name = repair_name(cluster.metadata.name, bookie.metadata.name, lost_since, attempt)
    repair = cluster.spec.auto_recovery.repair
    options, app, app_args = _submit_parts(cluster, ledgers)
    confs = dict(options[i + 1].split("=", 1) for i, option in enumerate(options) if option == "--conf")
    pod_labels = labels(cluster.metadata.name, REPAIR, bookie.metadata.name)
    metadata = _metadata(name, cluster.metadata.namespace, pod_labels)
    metadata["annotations"] = repair_annotations(bookie, lost_since)
    manifest = {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": metadata,
        "spec": {
            "type": "Python",
            "pythonVersion": "3",
            "mode": "cluster",
            "image": _repair_image(cluster),
            "imagePullPolicy": cluster.spec.image_pull_policy,
            "mainApplicationFile": app,
            "arguments": app_args,
            "sparkVersion": spark.SPARK_VERSION,
            "timeToLiveSeconds": repair.ttl_seconds_after_finished,
            "sparkConf": {**confs, **_spark_security(cluster, "driver", "executor")},
            "restartPolicy": {
                "type": "OnFailure",
                "onFailureRetries": repair.backoff_limit,
                "onFailureRetryInterval": 10,
                "onSubmissionFailureRetries": repair.backoff_limit,
                "onSubmissionFailureRetryInterval": 10,
            },
            "driver": _spark_pod(repair.driver_pod_template, pod_labels, {
                "cores": 1,
                "coreLimit": "1",
                "memory": "512m",
                "serviceAccount": repair.service_account_name,
            }),
            "executor": _spark_pod(repair.executor_pod_template, pod_labels, {
                "instances": repair.executors,
                "cores": repair.executor_cores,
                "coreLimit": str(repair.executor_cores),
                "memory": repair.executor_memory,
            }),
            "volumes": [_scratch_volume()],
        },
    }
    pull_secrets = [*(repair.driver_pod_template.image_pull_secrets or ()),
                    *(repair.executor_pod_template.image_pull_secrets or ())]
    if pull_secrets:
        manifest["spec"]["imagePullSecrets"] = list(dict.fromkeys(pull_secrets))
    return owned_by(manifest, cluster)


_SPARK_POD_FIELDS = {"nodeSelector": "nodeSelector", "tolerations": "tolerations", "affinity": "affinity",
                     "priorityClassName": "priorityClassName", "serviceAccountName": "serviceAccount"}
"""Pod fields as the Spark operator's driver and executor specs name them (image pull secrets are the
application's)."""


def _spark_pod(overrides: PodOverrides, pod_labels: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    """A SparkApplication's driver or executor: restricted, /tmp, with the pod overrides merged as for a Job."""
    metadata: dict[str, Any] = {"labels": dict(pod_labels)}
    pod_spec: dict[str, Any] = {}
    with_overrides(metadata, pod_spec, overrides)
    spark_pod = {**spec, **metadata, "podSecurityContext": pod_security_context(),
                 "securityContext": container_security_context(), "volumeMounts": [SCRATCH]}
    spark_pod.update({_SPARK_POD_FIELDS[key]: value for key, value in pod_spec.items() if key in _SPARK_POD_FIELDS})
    return spark_pod


def repair_namespace_objects(cluster: BookieCluster) -> list[dict[str, Any]]:
    """What the cluster's repair Jobs need in its namespace: Spark's driver account (ServiceAccount, Role and
    RoleBinding, limited to the namespace and to REPAIR_RULES) and the executor pod template."""
    namespace, service_account = cluster.metadata.namespace, cluster.spec.auto_recovery.repair.service_account_name
    meta = {LABEL_NAME: APP, LABEL_COMPONENT: REPAIR}
    subject = {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(executor_template_name(cluster), namespace, meta),
            "data": {EXECUTOR_TEMPLATE_FILE: _executor_template_text(cluster)},
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(service_account, namespace, meta)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _metadata(service_account, namespace, meta),
            "rules": REPAIR_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _metadata(service_account, namespace, meta),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": service_account},
            "subjects": [subject],
        },
    ]
