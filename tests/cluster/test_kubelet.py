"""The process kubelet against a real kube-apiserver: what it writes lands on the pod it runs, never on another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes

from bookfleet.polling import wait_for
from tests.cluster.controlplane import ControlPlane
from tests.cluster.kubelet import ZONE_NODES, Kubelet

NAMESPACE = "default"


class RecordingWorker:
    """What report_status reads of a pod worker, and whether it was told to stop."""

    def __init__(self, pod: dict[str, Any]) -> None:
        self.uid, self.name, self.namespace = pod["metadata"]["uid"], pod["metadata"]["name"], NAMESPACE
        self.spec = pod["spec"]
        self.stopped: float | None = None

    def request_stop(self, grace: float | None = None) -> None:
        self.stopped = grace


def default_service_account(api: kubernetes.client.CoreV1Api) -> bool:
    try:
        api.read_namespaced_service_account("default", NAMESPACE)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def create_pod(api: kubernetes.client.CoreV1Api, name: str) -> dict[str, Any]:
    """A pod on node-a, once the namespace's default ServiceAccount exists (admission refuses a pod before the
    controller-manager has made it, as on a fresh cluster)."""
    wait_for(lambda: default_service_account(api), timeout=120, what="the default ServiceAccount", interval=0.2)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
           "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "none"}]}}
    return api.api_client.sanitize_for_serialization(api.create_namespaced_pod(NAMESPACE, pod))


def test_a_status_for_a_replaced_pod_never_lands_on_its_successor_of_the_same_name(api_server: ControlPlane,
                                                                                    tmp_path: Path):
    """A pod deleted while its node was cut off, recreated under its name: the old pod's worker reports (a crash
    loop, say) when the cut heals. The report is refused by its uid and the worker stops; the new pod's status is
    untouched."""
    kubelet = Kubelet(api_server.kubeconfig, bridge=None, state=tmp_path, api_port=api_server.port,  # type: ignore[arg-type]
                      nodes=ZONE_NODES)
    old = RecordingWorker(create_pod(kubelet.api, "bk-0"))
    kubelet.api.delete_namespaced_pod("bk-0", NAMESPACE, body={"gracePeriodSeconds": 0})
    new = create_pod(kubelet.api, "bk-0")
    assert new["metadata"]["uid"] != old.uid

    assert kubelet.report_status(old, {"phase": "Failed", "reason": "OldPod"})
    assert old.stopped == 0
    status = kubelet.api.read_namespaced_pod_status("bk-0", NAMESPACE).status
    assert status.phase == "Pending" and status.reason is None

    current = RecordingWorker(new)
    assert kubelet.report_status(current, {"phase": "Running"})
    assert kubelet.api.read_namespaced_pod_status("bk-0", NAMESPACE).status.phase == "Running"
    assert current.stopped is None
