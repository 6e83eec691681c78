"""`python -m tests.cluster`: build (once) and run a local Kubernetes cluster until Ctrl-C or SIGTERM.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler from one pinned Kubernetes version; three nodes
labelled zone-a|b|c (and a cordoned spare in each zone) and a tainted system node, as kubelets on containerd where
the machine can run them (tests/cluster/realnode.py), else the zones' nodes as the process kubelet's; a pod network
on a host-only bridge. Everything it made (processes, network namespaces, links, the state directory) is removed
when it stops; bind-mount targets it had to create on the host stay (see `Kubelet.mount_point`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import kubernetes
from kubernetes.client.rest import ApiException

from bookfleet.polling import wait_for
from tests.cluster import pki as pki_module
from tests.cluster import realnode
from tests.cluster.controlplane import SERVICE_IP, ControlPlane
from tests.cluster.kubelet import ZONE_NODES, Kubelet
from tests.cluster.network import Bridge
from tests.cluster.realnode import RealNode

ROOT = Path(__file__).resolve().parents[2]
API_NAMES = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local"]


def build() -> Path:
    """scripts/build-kube.sh: builds once per pinned version into ~/.cache/bookfleet/kube-<version>/."""
    result = subprocess.run([str(ROOT / "scripts" / "build-kube.sh")], check=True, stdout=subprocess.PIPE, text=True)
    return Path(result.stdout.strip().splitlines()[-1])


def nodes_ready(api: kubernetes.client.CoreV1Api, names: set[str]) -> bool:
    nodes = [node for node in api.list_node().items if node.metadata.name in names]
    return {node.metadata.name for node in nodes} == names and all(
        any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []) for node in nodes
    )


def node_plans(zones: bool) -> list[realnode.NodePlan]:
    """The real nodes the cluster runs where it can: `realnode.NODES`, or the system node only without `zones`."""
    return [plan for plan in realnode.NODES if zones or plan.tainted]


def start_real_nodes(binaries: Path, state: Path, pki: pki_module.Pki, server: str, bridge: Bridge,
                     api: kubernetes.client.CoreV1Api, zones: bool, builds: ImageBuilds) -> list[RealNode]:
    """The real nodes of `realnode.NODES` (the system node only, without `zones`), started side by side, spares
    cordoned, all Ready, when this machine can run them; else none (one that fails to come up stops them all: the
    cluster goes on with the process kubelet's nodes). One line says which."""
    plans = node_plans(zones)
    reason = realnode.unavailable(binaries)
    nodes: list[RealNode] = []
    started = time.monotonic()
    if reason is None:
        nodes = [RealNode(plan, index, realnode.node_state(state, plan.name), binaries, pki, server, bridge)
                 for index, plan in enumerate(plans)]
        names = {node.name for node in nodes}
        try:
            subprocess.run([str(ROOT / "scripts" / "build-kube.sh"), *realnode.BINARIES], check=True,
                           stdout=subprocess.DEVNULL)
            pause = builds.get("pause")
            with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
                list(pool.map(lambda node: node.start(pause), nodes))
            wait_for(lambda: all(node.check_alive() for node in nodes) and names <= {
                node.metadata.name for node in api.list_node().items}, timeout=120, what="the real nodes registered",
                interval=0.5)
            for node in nodes:
                if node.plan.cordoned:
                    api.patch_node(node.name, {"spec": {"unschedulable": True}})
            wait_for(lambda: all(node.check_alive() for node in nodes) and nodes_ready(api, names), timeout=180,
                     what="the real nodes Ready", interval=0.5)
        except (subprocess.CalledProcessError, RuntimeError, TimeoutError) as error:
            reason = f"they did not come up: {str(error).splitlines()[0]}; logs in {state / 'nodes'}"
            for node in nodes:
                node.stop()
                try:
                    api.delete_node(node.name)  # if it registered: no NotReady node left for the scheduler
                except ApiException as gone:
                    if gone.status != 404:
                        raise
            nodes = []
    if not nodes:
        print(f"nodes: process kubelet only (no real nodes: {reason})", flush=True)
        return []
    print(f"nodes: {', '.join(node.name for node in nodes)}: kubelets on containerd, Ready "
          f"{time.monotonic() - started:.1f} s after their start (containerd up and the pause image imported in "
          f"{max(node.runtime_up_s for node in nodes):.1f} s); {realnode.NAME} tainted {realnode.TAINT}"
          + ("" if zones else "; the zones' nodes on the process kubelet"), flush=True)
    return nodes


IMAGE_ORDER = ("operator", "zookeeper", "bookie", "repair")
"""The order a node's images reach it in: what an install needs first, the repair image (1 GB) last."""
BUILD_ORDER = ("pause", "bookie", "operator", "zookeeper", "repair")
"""The order they are built in (one at a time: scripts/build-images.sh holds a lock): the nodes' sandbox image
first, then the bookie image, whose import into six nodes takes longest, the repair image last."""


class ImageBuilds:
    """scripts/build-images.sh of the real nodes' images, one after another in `BUILD_ORDER`, in a thread started
    with the cluster (a changed source rebuilds them: minutes that the control plane's and the nodes' start
    overlap); `get` waits for one."""

    def __init__(self, names: Iterable[str]) -> None:
        self.futures = {name: concurrent.futures.Future() for name in BUILD_ORDER if name in names}
        threading.Thread(target=self._build, daemon=True).start()

    def _build(self) -> None:
        for name, future in self.futures.items():
            try:
                future.set_result(realnode.built_image(name))
            except Exception as error:  # whoever waits for it is told, never left waiting
                future.set_exception(error)

    def get(self, name: str) -> realnode.NodeImage:
        return self.futures[name].result()


def preload_images(nodes: list[RealNode], folder: Path, builds: ImageBuilds) -> None:
    """Every node's images (`NodePlan.images`) imported into its containerd, ours under their published names too,
    as `kind load` leaves them: each node its own in `IMAGE_ORDER` as `builds` has them, the nodes side by side (the
    system node's operator, ZooKeeper and repair images while the zones' nodes take the bookie image: the install
    waits for the first three only). `folder/<image>` says, once every node that needs it has it, its local
    reference (or `failed: <why>`): `LocalCluster.node_image` waits for it."""
    folder.mkdir(exist_ok=True)
    holders = {name: [node for node in nodes if name in node.plan.images] for name in IMAGE_ORDER}
    outcomes: dict[str, list[tuple[str, float]]] = {name: [] for name in IMAGE_ORDER}
    lock = threading.Lock()

    def import_all(node: RealNode) -> None:
        for name in (name for name in IMAGE_ORDER if name in node.plan.images):
            names = [realnode.fully_qualified(realnode.published_reference(name))] if name in realnode.PUBLISHED else []
            try:
                image = builds.get(name)
                outcome = (image.reference, node.import_image(image, *names))
            except (subprocess.CalledProcessError, ValueError) as error:
                outcome = (f"failed: {error}", 0.0)
            with lock:
                outcomes[name].append(outcome)
                if len(outcomes[name]) == len(holders[name]):
                    announce(name, names)

    def announce(name: str, names: list[str]) -> None:
        failed = next((reference for reference, _ in outcomes[name] if reference.startswith("failed")), None)
        outcome = failed or outcomes[name][0][0]
        if failed:
            print(f"image {name} not imported: {failed}", flush=True)
        else:
            print(f"image {outcome}{f' as {names[0]}' if names else ''} imported into "
                  f"{', '.join(node.name for node in holders[name])} in "
                  f"{max(seconds for _, seconds in outcomes[name]):.1f} s", flush=True)
        (folder / f".{name}").write_text(outcome)
        (folder / f".{name}").rename(folder / name)

    with concurrent.futures.ThreadPoolExecutor(max(1, len(nodes))) as pool:
        list(pool.map(import_all, nodes))


CONTROL_VERBS = ("fail-node", "cut-zone", "partition-zone", "heal-zone", "evict-pod")
"""The requests `LocalCluster` (walkthrough.py) makes as files `<verb>-<subject>` in the control folder."""


def dispatch(request: str, real_nodes: list[RealNode], kubelet: Kubelet) -> None:
    """One control request: a node failure, a zone cut off or partitioned, its heal, an eviction, on the real nodes
    where they are, else on the process kubelet's. A zone's real nodes are its bookie nodes: the system node (the
    operator, ZooKeeper) stays up, as the control plane's own nodes would."""
    verb = next(verb for verb in CONTROL_VERBS if request.startswith(f"{verb}-"))
    subject = request.removeprefix(f"{verb}-")
    zone_nodes = [node for node in real_nodes if node.zone == subject and not node.plan.tainted]
    if verb == "fail-node":
        real = next((node for node in real_nodes if node.name == subject), None)
        real.fail() if real else kubelet.fail_node(subject)
    elif verb == "cut-zone" and zone_nodes:
        for node in zone_nodes:
            node.cut()
    elif verb == "partition-zone" and zone_nodes:
        kubelet.bridge.isolate(subject, [node.netns for node in zone_nodes])
    elif verb in ("cut-zone", "partition-zone"):
        kubelet.cut_zone(subject, links_down=verb == "cut-zone")
    elif verb == "heal-zone":
        for node in zone_nodes:
            node.heal()
        kubelet.heal_zone(subject)  # its process nodes, if any; the partition's rules go in any case
    else:
        kubelet.evict(*subject.split(".", 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, help="state directory (default: a new temporary one, removed at exit)")
    parser.add_argument("--ready-file", type=Path, help="write the kubeconfig path here once the nodes are Ready")
    parser.add_argument("--keep", action="store_true", help="keep the state directory (logs) at exit")
    parser.add_argument("--process-zones", action="store_true",
                        help="the zones' nodes on the process kubelet even where real nodes can run (for pods that "
                             "run this checkout's test tools, which no image holds)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())

    binaries = build()
    state = args.state or Path(tempfile.mkdtemp(prefix="bookfleet-cluster-"))
    state.mkdir(parents=True, exist_ok=True)
    bridge = Bridge.choose()
    control_plane: ControlPlane | None = None
    kubelet: Kubelet | None = None
    real_nodes: list[RealNode] = []
    started = time.monotonic()
    builds = ImageBuilds({"pause", *(name for plan in node_plans(not args.process_zones) for name in plan.images)}
                         if realnode.unavailable(binaries) is None else ())
    try:
        bridge.create()
        pki = pki_module.create(state / "pki", ["127.0.0.1", bridge.host_address, SERVICE_IP], API_NAMES)
        control_plane = ControlPlane(binaries, state, pki, bridge.host_address)
        control_plane.start()
        api = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(str(control_plane.kubeconfig)))
        real_nodes = start_real_nodes(binaries, state, pki, control_plane.server, bridge, api,
                                      zones=not args.process_zones, builds=builds)
        zones_real = any(not node.plan.tainted for node in real_nodes)
        kubelet = Kubelet(control_plane.kubeconfig, bridge, state, control_plane.port,
                          nodes={} if zones_real else ZONE_NODES)
        kubelet.start()
        wait_for(lambda: nodes_ready(api, set(kubelet.nodes)), timeout=120, what="every node Ready", interval=0.5)
        threading.Thread(target=preload_images, args=(real_nodes, state / "images", builds), daemon=True).start()
        kubeconfig = control_plane.kubeconfig
        print(f"local cluster up in {time.monotonic() - started:.1f} s (state and logs in {state})", flush=True)
        print(f"  export KUBECONFIG={kubeconfig}", flush=True)
        print(f"  kubectl get nodes -L topology.kubernetes.io/zone; helm: {binaries / 'helm'}", flush=True)
        print("  Ctrl-C stops it and removes everything it made", flush=True)
        if args.ready_file:
            args.ready_file.write_text(f"{kubeconfig}\n{binaries}\n")
        control = state / "control"
        control.mkdir(exist_ok=True)
        while not stopping.wait(0.5):
            control_plane.check_alive()
            for node in real_nodes:
                node.check_alive()
            for request in sorted(control.iterdir()):
                dispatch(request.name, real_nodes, kubelet)
                request.unlink()
        return 0
    finally:
        print("stopping the local cluster ...", flush=True)
        if kubelet is not None:
            kubelet.stop()
        with concurrent.futures.ThreadPoolExecutor(max(1, len(real_nodes))) as pool:
            list(pool.map(RealNode.stop, real_nodes))
        if control_plane is not None:
            control_plane.stop()
        bridge.remove()
        if not args.keep:
            shutil.rmtree(state, ignore_errors=True)
        print("local cluster stopped and cleaned up", flush=True)


if __name__ == "__main__":
    sys.exit(main())
