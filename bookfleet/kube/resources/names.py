"""Names, labels, annotations, owner references, TLS mounts and quantities every Kubernetes object of a cluster
shares: the vocabulary of the manifest builders (bookie workload, Spark repair) and of the reconcilers' selectors.

Every name is derived from the resource it serves, so a handler that runs twice builds the same object twice and
the API server's "already exists" tells it the work was done.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from bookfleet.kube.models import (
    BookieCluster,
    CustomResource,
    TlsMode,
)
from bookfleet.meta.zk import ZK_AUTH_ENV, ZK_TLS_DIR_ENV
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
"""On a bookie pod: the digest of what the bookie runs (workload.runs_hash); a pod whose digest differs from the one
the current spec builds is rolled (image, resources, settings, ZooKeeper, TLS, storage all reach the pod this way)."""

BOOKIE = "bookie"
REPAIR = "repair"
BOOKIE_POD_SELECTOR = {LABEL_NAME: APP, LABEL_COMPONENT: BOOKIE}
REPAIR_SELECTOR = {LABEL_NAME: APP, LABEL_COMPONENT: REPAIR}
"""Repair Jobs and SparkApplications of every cluster (the operator indexes them by ledger)."""
"""Labels every bookie pod carries: what the operator's pod watch selects on."""

MAX_NAME = 63


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


def client_secret_name(cluster: str, client: str) -> str:
    """A client team's certificate (spec.security.clientCertificates)."""
    return f"{cluster}-tls-client-{client}"


# --- security: TLS directories from Secrets, the ZooKeeper credential ------------------------------------------

TLS_DIR = "/etc/bookfleet/tls"
"""Where pods see their TLS directory (mounted whole, never by subPath, so the kubelet's refreshes show)."""
TLS_VOLUME = "tls"
CA_KEY, CERT_KEY, KEY_KEY = KUBERNETES_FILES
"""A TLS Secret's keys (kubernetes.io/tls layout, as cert-manager writes it), which are also the file names."""
ZK_AUTH_KEY = "auth"
ZK_TLS_DIR = "/etc/bookfleet/zk-tls"
"""Where pods see the ZooKeeper TLS Secret (spec.security.zookeeperTlsSecret): a directory of its own, since that
Secret is issued by ZooKeeper's CA, not the cluster's."""
ZK_TLS_VOLUME = "zk-tls"


def tls_enabled(cluster: BookieCluster) -> bool:
    return cluster.spec.security.tls != TlsMode.DISABLED


def tls_mount() -> dict[str, Any]:
    return {"name": TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": True}


def tls_volume(secret: str) -> dict[str, Any]:
    return {"name": TLS_VOLUME, "secret": {"secretName": secret, "defaultMode": 0o440}}


def security_env(cluster: BookieCluster, with_tls_dir: bool) -> list[dict[str, Any]]:
    """The ZooKeeper credential from its Secret, where the ZooKeeper TLS directory is (`mount_zookeeper_tls`), and
    where the TLS directory is for a client."""
    env: list[dict[str, Any]] = []
    secret = cluster.spec.security.zookeeper_auth_secret
    if secret:
        env.append({"name": ZK_AUTH_ENV, "valueFrom": {"secretKeyRef": {"name": secret, "key": ZK_AUTH_KEY}}})
    if cluster.spec.security.zookeeper_tls_secret:
        env.append({"name": ZK_TLS_DIR_ENV, "value": ZK_TLS_DIR})
    if with_tls_dir and tls_enabled(cluster):
        env.append({"name": TLS_DIR_ENV, "value": TLS_DIR})
    return env


def mount_zookeeper_tls(cluster: BookieCluster, container: dict[str, Any], volumes: list[dict[str, Any]]) -> None:
    """The cluster's ZooKeeper TLS Secret mounted whole at ZK_TLS_DIR (the kubelet's refreshes show, and kazoo
    reads the files at each connect), when the cluster has one."""
    if secret := cluster.spec.security.zookeeper_tls_secret:
        container["volumeMounts"].append({"name": ZK_TLS_VOLUME, "mountPath": ZK_TLS_DIR, "readOnly": True})
        volumes.append({"name": ZK_TLS_VOLUME, "secret": {"secretName": secret, "defaultMode": 0o440}})


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


def hashed_name(prefix: str, *parts: str) -> str:
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:10]
    return f"{prefix[: MAX_NAME - len(digest) - 1].rstrip('-')}-{digest}"


def repair_name(cluster: str, bookie: str, lost_since: dt.datetime, attempt: int = 0) -> str:
    """The same (cluster, bookie, loss time, attempt) always names the same repair: a retried handler finds it."""
    lost = utc_seconds(lost_since).isoformat()
    return hashed_name(f"{bookie}-repair", cluster, bookie, lost, str(attempt))


def utc_seconds(moment: dt.datetime) -> dt.datetime:
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


def owner_claim(manifest: dict[str, Any], owner: CustomResource | Mapping[str, Any]) -> dict[str, Any]:
    """The server-side apply that adds `owner` to the owners of `manifest`, an object several owners share: applied
    under a field manager of that owner's own, it leaves the others' references be (ownerReferences merge by uid), and
    the garbage collector deletes the object once none of its owners is left."""
    meta = manifest["metadata"]
    return {"apiVersion": manifest["apiVersion"], "kind": manifest["kind"],
            "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                         "ownerReferences": [owner_reference(owner, controller=False)]}}


def object_metadata(name: str, namespace: str, object_labels: dict[str, str]) -> dict[str, Any]:
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
