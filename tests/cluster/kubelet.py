"""The process kubelet: three Nodes (one per zone) whose Pods run as local processes, plus a local-directory
provisioner for PersistentVolumeClaims and the pods' /etc/hosts (Service and headless-Service names -> pod IPs).

The provisioner behaves like a node-local CSI driver that can grow volumes (TopoLVM, say): a claim waits for its first
pod (WaitForFirstConsumer), its volume is pinned to the node the scheduler picked (so a pod on it can never move to
another node), and a bigger request is granted at once (the external resizer's and the kubelet's steps in one).

Development and test tooling only: it lives under tests/ and is never part of the product wheel.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
import threading
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from bookfleet.kube.resources import HOSTNAME_LABEL, quantity_bytes
from tests.cluster.network import Bridge
from tests.cluster.pods import PodWorker, now

log = logging.getLogger("kubelet")
ZONES = ("zone-a", "zone-b", "zone-c")
ZONE_LABEL = "topology.kubernetes.io/zone"
STORAGE_CLASS = "local-dirs"
PROVISIONER = "bookfleet.test/local-dirs"
SPARE_NODES = {"node-a2": "zone-a", "node-b2": "zone-b", "node-c2": "zone-c"}
"""Cordoned spare nodes (spec.unschedulable, so pods land as on three nodes): uncordoned, one gives a bookie pinned to
its zone (BookieCluster.spec.zones) a live node to come back on when its node fails."""
ZONE_NODES = {**{f"node-{zone[-1]}": zone for zone in ZONES}, **SPARE_NODES}
"""The nodes bookies and clients run on: one per zone, and the spares."""
SELECTED_NODE = "volume.kubernetes.io/selected-node"
"""Set on a claim by the scheduler once it picked the node of the claim's first pod (WaitForFirstConsumer)."""
CLUSTER_DOMAIN = "cluster.local"
HEARTBEAT_SECONDS = 5.0


def _json(response: Any) -> Any:
    return json.loads(response.data)


def uid_refused(error: ApiException) -> bool:
    """The API server refused a patch for its metadata.uid: the object of that name is another one (422, "field is
    immutable")."""
    if error.status != 422:
        return False
    try:
        causes = json.loads(error.body or "{}").get("details", {}).get("causes", [])
    except ValueError:
        return False
    return any(cause.get("field") == "metadata.uid" for cause in causes)


class Kubelet:
    """`nodes` (name -> zone; ZONE_NODES: `node-a|b|c` and the cordoned spares `node-a2|b2|c2`), their heartbeats,
    and a PodWorker for every Pod scheduled to one of them; the claims' provisioner for every node."""

    def __init__(self, kubeconfig: Path, bridge: Bridge, state: Path, api_port: int, nodes: dict[str, str]) -> None:
        client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        self.api = kubernetes.client.CoreV1Api(client)
        self.coordination = kubernetes.client.CoordinationV1Api(client)
        self.storage = kubernetes.client.StorageV1Api(client)
        self.bridge, self.state, self.api_port = bridge, state, api_port
        self.nodes = dict(nodes)
        self.failed_nodes: set[str] = set()
        self.cut_nodes: set[str] = set()
        """Nodes cut off (a zone outage): no heartbeats, their pods' links down, their processes left running and
        their API objects unseen until the cut heals, as a partitioned kubelet's would be."""
        self.workers: dict[str, PodWorker] = {}
        self.finished: set[str] = set()
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._pods: list[dict[str, Any]] = []
        self._services: list[dict[str, Any]] = []

    # --- API helpers used by pod workers ------------------------------------------------------------------------

    def read_config_map(self, namespace: str, name: str) -> dict[str, str]:
        return _json(self.api.read_namespaced_config_map(name, namespace, _preload_content=False)).get("data", {})

    def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        return _json(self.api.read_namespaced_secret(name, namespace, _preload_content=False)).get("data", {})

    def service_account_token(self, pod: dict[str, Any], source: dict[str, Any]) -> str:
        """A bound token for the pod's service account (TokenRequest), as the projected volume asks."""
        spec: dict[str, Any] = {
            "expirationSeconds": source.get("expirationSeconds", 3600),
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"],
                               "uid": pod["metadata"]["uid"]},
        }
        if source.get("audience"):
            spec["audiences"] = [source["audience"]]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        account = pod["spec"].get("serviceAccountName", "default")
        response = self.api.create_namespaced_service_account_token(
            account, pod["metadata"]["namespace"], body, _preload_content=False
        )
        return _json(response)["status"]["token"]

    def claim_path(self, namespace: str, claim: str) -> Path:
        pvc = _json(self.api.read_namespaced_persistent_volume_claim(claim, namespace, _preload_content=False))
        volume = pvc["spec"].get("volumeName")
        if not volume or pvc.get("status", {}).get("phase") != "Bound":
            raise KeyError(f"PersistentVolumeClaim {namespace}/{claim} is not bound yet")
        pv = _json(self.api.read_persistent_volume(volume, _preload_content=False))
        return Path(pv["spec"]["hostPath"]["path"])

    def mount_point(self, target: str, directory: bool) -> None:
        """Bind mounts need their target to exist on the host. It stays there when the cluster stops: removing a
        mount point detaches the mounts on it in every mount namespace, so one local cluster stopping would take
        e.g. the service-account token away from the pods of another one running beside it."""
        path = Path(target)
        with self._lock:
            if path.exists() or path.is_symlink():
                return
            if directory:
                path.mkdir(parents=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()

    def cut_off(self, worker: PodWorker) -> bool:
        """Whether the worker's node is in a cut zone."""
        return worker.spec.get("nodeName") in self.cut_nodes

    def report_status(self, worker: PodWorker, status: dict[str, Any]) -> bool:
        """Patch the status of the worker's own pod: with its uid in the patch (as the kubelet's status manager sends
        it) the API server refuses the patch for any other pod of that name, so a pod recreated under the same name
        never gets the status of the one it replaced."""
        if self.cut_off(worker):
            return False  # cut off from the API server: reported once the cut heals
        try:
            self.api.patch_namespaced_pod_status(worker.name, worker.namespace,
                                                 {"metadata": {"uid": worker.uid}, "status": status})
            return True
        except ApiException as error:
            if error.status == 404 or uid_refused(error):  # its pod is gone, whatever now bears its name
                worker.request_stop(0)
                return True
            log.warning("status of %s/%s: %s", worker.namespace, worker.name, error.reason)
            return False

    def pod_changed(self) -> None:
        self._changed.set()

    # --- nodes --------------------------------------------------------------------------------------------------

    def _node(self, name: str, zone: str) -> dict[str, Any]:
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {
                ZONE_LABEL: zone, HOSTNAME_LABEL: name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            }},
            "spec": {"unschedulable": name in SPARE_NODES},
            "status": {"capacity": capacity, "allocatable": capacity},
        }

    def _node_status(self) -> dict[str, Any]:
        stamp = now()
        conditions = [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "process kubelet",
                       "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}]
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure"):
            conditions.append({"type": kind, "status": "False", "reason": f"KubeletHasNo{kind}",
                               "lastHeartbeatTime": stamp, "lastTransitionTime": stamp})
        return {"status": {
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": self.bridge.host_address}],
            "nodeInfo": {"kubeletVersion": "v1.34.4", "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64", "containerRuntimeVersion": "process://bookfleet",
                         "osImage": "local processes", "kernelVersion": "", "machineID": "", "systemUUID": "",
                         "bootID": ""},
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        }}

    def register_nodes(self) -> None:
        for name, zone in self.nodes.items():
            try:
                self.api.create_node(self._node(name, zone))
            except ApiException as error:
                if error.status != 409:
                    raise
        self._heartbeat()

    def _heartbeat(self) -> None:
        status = self._node_status()
        for name in self.nodes:
            if name in self.failed_nodes or name in self.cut_nodes:
                continue
            self.api.patch_node_status(name, status)
            lease = {"metadata": {"name": name, "namespace": "kube-node-lease"},
                     "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                              "renewTime": dt_micro()}}
            try:
                self.coordination.patch_namespaced_lease(name, "kube-node-lease", lease)
            except ApiException as error:
                if error.status != 404:
                    raise
                self.coordination.create_namespaced_lease("kube-node-lease", lease)

    def fail_node(self, name: str) -> None:
        """Node failure: heartbeats stop and every process of the node's pods is killed at once."""
        self.failed_nodes.add(name)
        with self._lock:
            workers = [w for w in self.workers.values() if w.spec.get("nodeName") == name]
        for worker in workers:
            worker.kill_now()

    def cut_zone(self, zone: str, links_down: bool = True) -> None:
        """A zone outage: its nodes stop heartbeating and their pods' network links go down (processes keep running
        with their data, unreachable); the kubelets neither see nor report API changes of those pods meanwhile.
        Without `links_down`, a partition: the links stay up and the zone's pods reach each other, but nothing outside
        the zone, the API server on the host included (the bridge drops the rest), so its kubelets are cut off the
        same way."""
        with self._lock:
            zone_nodes = {node for node, node_zone in self.nodes.items() if node_zone == zone}
            self.cut_nodes |= zone_nodes
            namespaces = [w.netns for w in self.workers.values() if w.spec.get("nodeName") in zone_nodes and w.netns]
        if not links_down:
            self.bridge.isolate(zone, namespaces)
            return
        for namespace in namespaces:
            self.bridge.cut(namespace)

    def heal_zone(self, zone: str) -> None:
        """The zone returns: links up or the partition ended, heartbeats and pod syncing resume (pods deleted meanwhile
        are stopped then)."""
        with self._lock:
            healed = {node for node, node_zone in self.nodes.items() if node_zone == zone}
            workers = [w for w in self.workers.values() if w.spec.get("nodeName") in healed]
            self.cut_nodes -= healed
        self.bridge.rejoin(zone)
        for worker in workers:
            if worker.netns:
                self.bridge.heal(worker.netns)
            # Its whole status again, as a kubelet's status manager sends it once it reaches the API server: the node
            # controller set the pod's Ready to False meanwhile, and a worker whose own view did not change (its
            # processes ran on) would never say otherwise (the zone's Bookies stayed Lost).
            worker.last_status = None
        self._changed.set()

    def evict(self, namespace: str, name: str) -> None:
        """Evict a pod as under node pressure: it ends Failed, reason Evicted."""
        with self._lock:
            worker = next((w for w in self.workers.values() if (w.namespace, w.name) == (namespace, name)), None)
        if worker is None:
            log.warning("no pod %s/%s runs here to evict", namespace, name)
            return
        worker.evict("The node was low on resource: ephemeral-storage.")

    # --- storage ------------------------------------------------------------------------------------------------

    def ensure_storage_class(self) -> None:
        body = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS,
                         "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": True,
        }
        try:
            self.storage.create_storage_class(body)
        except ApiException as error:
            if error.status != 409:
                raise

    def _provision(self) -> None:
        """Bind every claim of our class whose node is picked to a fresh directory pinned to that node; grow volumes
        whose claim asks for more; delete released volumes and their data."""
        claims = _json(self.api.list_persistent_volume_claim_for_all_namespaces(_preload_content=False))["items"]
        volumes = {volume["metadata"]["name"]: volume
                   for volume in _json(self.api.list_persistent_volume(_preload_content=False))["items"]}
        for claim in claims:
            if claim["spec"].get("storageClassName") != STORAGE_CLASS or claim["metadata"].get("deletionTimestamp"):
                continue
            if volume := volumes.get(claim["spec"].get("volumeName") or ""):
                self._grow(claim, volume)
            elif node := (claim["metadata"].get("annotations") or {}).get(SELECTED_NODE):
                self._create_volume(claim, node)
        for volume in volumes.values():
            released = volume.get("status", {}).get("phase") in ("Released", "Failed")
            ours = volume["metadata"].get("annotations", {}).get("pv.kubernetes.io/provisioned-by") == PROVISIONER
            if released and ours:
                shutil.rmtree(volume["spec"]["hostPath"]["path"], ignore_errors=True)
                try:
                    self.api.delete_persistent_volume(volume["metadata"]["name"])
                except ApiException as error:
                    if error.status != 404:
                        raise

    def _create_volume(self, claim: dict[str, Any], node: str) -> None:
        spec = claim["spec"]
        name = f"pvc-{claim['metadata']['uid']}"
        path = self.state / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        # Writable by any pod user, as local-path-provisioner makes them: a hostPath volume gets no fsGroup, and on the
        # real node a container runs as its image's non-root user.
        path.chmod(0o777)
        volume = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
            "spec": {
                "capacity": {"storage": spec["resources"]["requests"]["storage"]},
                "accessModes": spec["accessModes"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": STORAGE_CLASS,
                "hostPath": {"path": str(path), "type": "Directory"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}]}},
                "claimRef": {"namespace": claim["metadata"]["namespace"], "name": claim["metadata"]["name"],
                             "uid": claim["metadata"]["uid"]},
            },
        }
        try:
            self.api.create_persistent_volume(volume)
        except ApiException as error:
            if error.status != 409:
                raise

    def _grow(self, claim: dict[str, Any], volume: dict[str, Any]) -> None:
        """A bound claim asking for more than its volume has: the volume grows, and the claim's status says so."""
        wanted = claim["spec"]["resources"]["requests"]["storage"]
        if quantity_bytes(wanted) <= quantity_bytes(volume["spec"]["capacity"]["storage"]):
            return
        self.api.patch_persistent_volume(volume["metadata"]["name"], {"spec": {"capacity": {"storage": wanted}}})
        self.api.patch_namespaced_persistent_volume_claim_status(
            claim["metadata"]["name"], claim["metadata"]["namespace"],
            {"status": {"capacity": {"storage": wanted}, "allocatedResources": {"storage": wanted},
                        "allocatedResourceStatuses": None, "conditions": None}})

    # --- pods ---------------------------------------------------------------------------------------------------

    def _sync_pods(self) -> None:
        pods = _json(self.api.list_pod_for_all_namespaces(_preload_content=False))["items"]
        self._pods = pods
        self._services = _json(self.api.list_service_for_all_namespaces(_preload_content=False))["items"]
        present = {uid for uid, worker in self.workers.items() if worker.spec.get("nodeName") in self.cut_nodes}
        for pod in pods:
            uid, node = pod["metadata"]["uid"], pod["spec"].get("nodeName")
            if node not in self.nodes or node in self.failed_nodes or node in self.cut_nodes:
                continue
            present.add(uid)
            worker = self.workers.get(uid)
            deleting = pod["metadata"].get("deletionTimestamp")
            if worker is None and uid not in self.finished:
                if deleting:
                    self._delete_finally(pod)
                    continue
                worker = self.workers[uid] = PodWorker(self, pod)
                worker.start()
            elif worker is not None:
                worker.pod = pod
                if deleting:
                    worker.request_stop(float(pod["metadata"].get("deletionGracePeriodSeconds", worker.grace)))
            elif deleting:
                self._delete_finally(pod)
        for uid, worker in list(self.workers.items()):
            if uid not in present:
                worker.request_stop(0)
            if worker.done.is_set():
                del self.workers[uid]
                self.finished.add(uid)
                if worker.pod["metadata"].get("deletionTimestamp") and uid in present:
                    self._delete_finally(worker.pod)
        self._write_all_hosts()

    def _delete_finally(self, pod: dict[str, Any]) -> None:
        """The kubelet's last word on a terminated pod: delete with grace 0 so the API object goes."""
        try:
            # In the body: the API server ignores the query's gracePeriodSeconds when a body is sent.
            self.api.delete_namespaced_pod(
                pod["metadata"]["name"], pod["metadata"]["namespace"],
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": pod["metadata"]["uid"]}},
            )
        except ApiException as error:
            if error.status not in (404, 409):
                raise

    # --- names --------------------------------------------------------------------------------------------------

    def _hosts(self, worker: PodWorker) -> str:
        """/etc/hosts of one pod: itself, the API server's Service, every Service name -> its pods' IPs."""
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        hostname, subdomain = worker.spec.get("hostname", worker.name), worker.spec.get("subdomain")
        own = [hostname]
        if subdomain:
            own.insert(0, f"{hostname}.{subdomain}.{worker.namespace}.svc.{CLUSTER_DOMAIN}")
        if worker.pod_ip:
            lines.append(f"{worker.pod_ip} {' '.join(own)}")
        api_names = ["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                     f"kubernetes.default.svc.{CLUSTER_DOMAIN}"]
        lines.append(f"{self.bridge.host_address} {' '.join(api_names)}")
        ips = {w.uid: w.pod_ip for w in list(self.workers.values()) if w.pod_ip}
        for service in self._services:
            namespace, name = service["metadata"]["namespace"], service["metadata"]["name"]
            selector = service["spec"].get("selector")
            if not selector or (namespace, name) == ("default", "kubernetes"):
                continue
            names = [f"{name}.{namespace}.svc.{CLUSTER_DOMAIN}", f"{name}.{namespace}.svc", f"{name}.{namespace}"]
            if namespace == worker.namespace:
                names.append(name)
            not_ready_too = service["spec"].get("publishNotReadyAddresses", False)
            for pod in self._pods:
                # A pod this kubelet runs has its IP before the API server hears of it; one on a real node, from there.
                ip = ips.get(pod["metadata"]["uid"]) or pod.get("status", {}).get("podIP")
                labels = pod["metadata"].get("labels", {})
                if not ip or pod["metadata"]["namespace"] != namespace or pod["metadata"].get("deletionTimestamp"):
                    continue
                if any(labels.get(key) != value for key, value in selector.items()):
                    continue
                ready = any(c["type"] == "Ready" and c["status"] == "True"
                            for c in pod.get("status", {}).get("conditions", []))
                if not (ready or not_ready_too):
                    continue
                pod_names = list(names)
                if pod["spec"].get("subdomain") == name and service["spec"].get("clusterIP") == "None":
                    host = pod["spec"].get("hostname", pod["metadata"]["name"])
                    pod_names = [f"{host}.{n}" for n in names if n != name] + pod_names
                lines.append(f"{ip} {' '.join(pod_names)}")
        return "\n".join(lines) + "\n"

    def write_hosts(self, worker: PodWorker) -> None:
        """Rewritten in place: `ip netns exec` bind-mounts this very file over the pod's /etc/hosts."""
        path = Path("/etc/netns") / worker.netns / "hosts"
        content = self._hosts(worker)
        if not path.exists() or path.read_text() != content:
            with path.open("w") as file:
                file.write(content)

    def _write_all_hosts(self) -> None:
        for worker in list(self.workers.values()):
            if worker.netns and not worker.done.is_set() and worker.spec.get("nodeName") not in self.cut_nodes:
                self.write_hosts(worker)

    # --- running ------------------------------------------------------------------------------------------------

    def _every(self, seconds: float, action: Any, name: str, wake: threading.Event | None = None) -> None:
        """Run `action` every `seconds`, or sooner when `wake` is set (pod status changes refresh /etc/hosts)."""
        wake = wake or self._stop

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    action()
                except Exception:
                    log.exception("%s failed", name)
                wake.wait(seconds)
                if wake is not self._stop:
                    wake.clear()

        thread = threading.Thread(target=loop, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def start(self) -> None:
        self.ensure_storage_class()
        self.register_nodes()
        self._every(HEARTBEAT_SECONDS, self._heartbeat, "heartbeat")
        self._every(1.0, self._provision, "provisioner")
        self._every(1.0, self._sync_pods, "pods", self._changed)

    def stop(self, grace: float = 10.0) -> None:
        """Stop every pod (SIGTERM, then SIGKILL after `grace`) and the loops."""
        self._stop.set()
        self._changed.set()
        for thread in self._threads:
            thread.join(30)
        workers = list(self.workers.values())
        for worker in workers:
            worker.request_stop(grace)
        for worker in workers:
            worker.done.wait(grace + 15)


def dt_micro() -> dt.datetime:
    """A MicroTime for Lease.spec.renewTime. The client re-serializes date strings with isoformat(), which drops a
    zero fraction that MicroTime requires: hand it a datetime whose microseconds are never zero."""
    stamp = dt.datetime.now(dt.UTC)
    return stamp.replace(microsecond=stamp.microsecond or 1)
