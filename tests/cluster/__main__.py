"""`python -m tests.cluster`: build (once) and run a local Kubernetes cluster until Ctrl-C or SIGTERM.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler from one pinned Kubernetes version, three process
nodes labelled zone-a|b|c (and a cordoned spare in each zone), a pod network on a host-only bridge. Everything it
made (processes, network namespaces, links, the state directory) is removed when it stops; bind-mount targets it had
to create on the host stay (see `Kubelet.mount_point`).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kubernetes.client.rest import ApiException

from bookfleet.polling import wait_for
from tests.cluster import pki as pki_module
from tests.cluster import realnode
from tests.cluster.controlplane import SERVICE_IP, ControlPlane
from tests.cluster.kubelet import Kubelet
from tests.cluster.network import Bridge
from tests.cluster.realnode import RealNode

ROOT = Path(__file__).resolve().parents[2]
API_NAMES = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local"]


def build() -> Path:
    """scripts/build-kube.sh: builds once per pinned version into ~/.cache/bookfleet/kube-<version>/."""
    result = subprocess.run([str(ROOT / "scripts" / "build-kube.sh")], check=True, stdout=subprocess.PIPE, text=True)
    return Path(result.stdout.strip().splitlines()[-1])


def nodes_ready(kubelet: Kubelet, names: set[str]) -> bool:
    nodes = [node for node in kubelet.api.list_node().items if node.metadata.name in names]
    return {node.metadata.name for node in nodes} == names and all(
        any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []) for node in nodes
    )


def start_real_node(binaries: Path, state: Path, pki: pki_module.Pki, server: str, kubelet: Kubelet
                    ) -> RealNode | None:
    """The real node (kubelet on containerd), Ready, when this machine can run one, else None (a node that fails to
    come up is stopped and cleaned away: the cluster goes on without it); one line says which."""
    reason = realnode.unavailable(binaries)
    node: RealNode | None = None
    if reason is None:
        node = RealNode(realnode.NAME, realnode.ZONE, realnode.node_state(state), binaries, pki, server,
                        kubelet.bridge)
        try:
            subprocess.run([str(ROOT / "scripts" / "build-kube.sh"), *realnode.BINARIES], check=True,
                           stdout=subprocess.DEVNULL)
            node.start(realnode.built_image("pause"))
            wait_for(lambda: node.check_alive() and nodes_ready(kubelet, {node.name}), timeout=120,
                     what=f"{node.name} Ready", interval=0.5)
        except (subprocess.CalledProcessError, RuntimeError, TimeoutError) as error:
            reason = f"it did not come up: {str(error).splitlines()[0]}; logs in {node.state / 'logs'}"
            node.stop()
            try:
                kubelet.api.delete_node(node.name)  # if it registered: no NotReady node left for the scheduler
            except ApiException as gone:
                if gone.status != 404:
                    raise
    if reason is not None or node is None:
        print(f"nodes: process kubelet only (no real node: {reason})", flush=True)
        return None
    print(f"nodes: process kubelet and {node.name}, a kubelet on containerd (tainted {realnode.TAINT}), Ready "
          f"{time.monotonic() - node.started:.1f} s after its start (containerd up and the pause image imported in "
          f"{node.runtime_up_s:.1f} s)", flush=True)
    return node


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, help="state directory (default: a new temporary one, removed at exit)")
    parser.add_argument("--ready-file", type=Path, help="write the kubeconfig path here once the nodes are Ready")
    parser.add_argument("--keep", action="store_true", help="keep the state directory (logs) at exit")
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
    real_node: RealNode | None = None
    started = time.monotonic()
    try:
        bridge.create()
        pki = pki_module.create(state / "pki", ["127.0.0.1", bridge.host_address, SERVICE_IP], API_NAMES)
        control_plane = ControlPlane(binaries, state, pki, bridge.host_address)
        control_plane.start()
        kubelet = Kubelet(control_plane.kubeconfig, bridge, state, control_plane.port)
        kubelet.start()
        wait_for(lambda: nodes_ready(kubelet, set(kubelet.nodes)), timeout=120, what="every node Ready", interval=0.5)
        real_node = start_real_node(binaries, state, pki, control_plane.server, kubelet)
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
            if real_node is not None:
                real_node.check_alive()
            for request in sorted(control.glob("fail-node-*")):
                kubelet.fail_node(request.name.removeprefix("fail-node-"))
                request.unlink()
            for request in sorted(control.glob("cut-zone-*")):
                kubelet.cut_zone(request.name.removeprefix("cut-zone-"))
                request.unlink()
            for request in sorted(control.glob("partition-zone-*")):
                kubelet.cut_zone(request.name.removeprefix("partition-zone-"), links_down=False)
                request.unlink()
            for request in sorted(control.glob("heal-zone-*")):
                kubelet.heal_zone(request.name.removeprefix("heal-zone-"))
                request.unlink()
            for request in sorted(control.glob("evict-pod-*")):
                kubelet.evict(*request.name.removeprefix("evict-pod-").split(".", 1))
                request.unlink()
        return 0
    finally:
        print("stopping the local cluster ...", flush=True)
        if kubelet is not None:
            kubelet.stop()
        if real_node is not None:
            real_node.stop()
        if control_plane is not None:
            control_plane.stop()
        bridge.remove()
        if not args.keep:
            shutil.rmtree(state, ignore_errors=True)
        print("local cluster stopped and cleaned up", flush=True)


if __name__ == "__main__":
    sys.exit(main())
