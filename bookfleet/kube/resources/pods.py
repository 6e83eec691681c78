"""What every pod the operator builds shares: Pod Security (restricted, read-only root filesystem, one scratch
directory) and the merge of a spec's pod overrides (`podTemplate`, `driverPodTemplate`, `executorPodTemplate`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bookfleet.kube.models import (
    PodOverrides,
)

RUN_AS = 10001
"""The non-root user of the bookie image (bookie-image/Dockerfile)."""

SCRATCH = {"name": "tmp", "mountPath": "/tmp"}
"""The one writable directory besides the data volumes: root filesystems are read-only."""
SCRATCH_LIMIT = "1Gi"


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


def scratch_volume() -> dict[str, Any]:
    return {"name": SCRATCH["name"], "emptyDir": {"sizeLimit": SCRATCH_LIMIT}}
