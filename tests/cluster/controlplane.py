"""etcd, kube-apiserver, kube-controller-manager and kube-scheduler as local processes (what envtest does, plus
the controllers and the scheduler a kubelet needs)."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bookfleet import childprocess
from bookfleet.polling import wait_for
from tests.cluster import pki as pki_module
from tests.cluster.pki import Pki

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
CONTROLLERS = ",".join(f"{name}-controller" for name in [
    "job", "cronjob", "statefulset", "deployment", "replicaset", "garbage-collector",
    "persistentvolumeclaim-protection", "persistentvolume-protection", "persistentvolume-binder", "node-lifecycle",
    "taint-eviction", "namespace", "serviceaccount", "serviceaccount-token", "root-ca-certificate-publisher",
    "endpoints", "endpointslice", "disruption", "ttl-after-finished", "pod-garbage-collector",
    "clusterrole-aggregation", "legacy-serviceaccount-token-cleaner",
])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_kubeconfig(path: Path, server: str, pki: Pki) -> None:
    """An admin kubeconfig (system:masters client certificate) for kubectl, helm, the tests and the kubelet."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "bookfleet-local", "cluster": {"server": server, "certificate-authority": str(pki.ca_cert)}}
        ],
        "users": [{"name": "admin", "user": {
            "client-certificate": str(pki.admin_cert), "client-key": str(pki.admin_key),
        }}],
        "contexts": [{"name": "bookfleet-local", "context": {"cluster": "bookfleet-local", "user": "admin"}}],
        "current-context": "bookfleet-local",
    }
    path.write_text(yaml.safe_dump(config))


@dataclass
class ControlPlane:
    """The four control-plane processes; `stop` ends them in reverse order."""

    binaries: Path
    state: Path
    pki: Pki
    advertise_address: str
    port: int = 443
    processes: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    @property
    def server(self) -> str:
        return f"https://{self.advertise_address}:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        log = (self.state / "logs").joinpath(f"{name}.log").open("ab")
        # SIGKILL if this process dies: no one is left to escalate a slow graceful stop, and the state is a test's.
        process = childprocess.popen(
            [str(self.binaries / name), *args], on_parent_death=signal.SIGKILL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes.append((name, process))
        return process

    def check_alive(self) -> None:
        for name, process in self.processes:
            if process.poll() is not None:
                log = (self.state / "logs" / f"{name}.log").read_text()[-3000:]
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{log}")

    def start(self, timeout: float = 180.0) -> None:
        (self.state / "logs").mkdir(parents=True, exist_ok=True)
        kubelet_client = pki_module.kubelet_client_credentials(self.pki)
        etcd_port, peer_port = free_port(), free_port()
        etcd_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        self._start(
            "etcd", "--data-dir", str(self.state / "etcd"), "--listen-client-urls", etcd_url,
            "--advertise-client-urls", etcd_url, "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url, "--initial-cluster", f"default={peer_url}",
            "--unsafe-no-fsync", "--log-level", "warn",
        )
        self._start(
            "kube-apiserver", "--etcd-servers", etcd_url,
            "--bind-address", self.advertise_address, "--advertise-address", self.advertise_address,
            "--secure-port", str(self.port), "--cert-dir", str(self.state / "apiserver-certs"),
            "--tls-cert-file", str(self.pki.serving_cert), "--tls-private-key-file", str(self.pki.serving_key),
            "--client-ca-file", str(self.pki.ca_cert),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(self.pki.service_account_public_key),
            "--service-account-signing-key-file", str(self.pki.service_account_key),
            "--authorization-mode", "Node,RBAC",
            "--enable-admission-plugins", "NodeRestriction,PodSecurity,DefaultStorageClass,ServiceAccount",
            "--service-cluster-ip-range", SERVICE_CIDR, "--allow-privileged=false",
            # `kubectl logs` of a real node's pod: the API server calls its kubelet at the node's address, checks the
            # kubelet's serving certificate against the cluster's CA and presents a client certificate of its own.
            "--kubelet-client-certificate", str(kubelet_client[0]), "--kubelet-client-key", str(kubelet_client[1]),
            "--kubelet-certificate-authority", str(self.pki.ca_cert),
            "--kubelet-preferred-address-types", "InternalIP",
        )
        self._wait_healthy(timeout)
        admin = self.state / "admin.kubeconfig"
        write_kubeconfig(admin, self.server, self.pki)
        self._start(
            "kube-controller-manager", "--kubeconfig", str(admin), "--authentication-kubeconfig", str(admin),
            "--authorization-kubeconfig", str(admin), "--leader-elect=false", "--bind-address", "127.0.0.1",
            "--secure-port", "0", "--controllers", CONTROLLERS, "--use-service-account-credentials",
            "--service-account-private-key-file", str(self.pki.service_account_key),
            "--root-ca-file", str(self.pki.ca_cert), "--cluster-signing-cert-file", str(self.pki.ca_cert),
            "--cluster-signing-key-file", str(self.pki.ca_key),
            # Node failure is seen in ~20 s rather than 50 s; pods on a lost node are evicted by taint.
            "--node-monitor-grace-period", "20s",
        )
        self._start(
            "kube-scheduler", "--kubeconfig", str(admin), "--authentication-kubeconfig", str(admin),
            "--authorization-kubeconfig", str(admin), "--leader-elect=false", "--bind-address", "127.0.0.1",
            "--secure-port", "0",
        )
        write_kubeconfig(self.kubeconfig, self.server, self.pki)

    def _wait_healthy(self, timeout: float) -> None:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))

        def ready() -> bool:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"{self.server}/readyz", context=context, timeout=5) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_for(ready, timeout=timeout, interval=0.5, what="kube-apiserver /readyz")

    def stop(self, grace: float = 10.0) -> None:
        """One at a time in reverse start order, so etcd outlives the API server that writes to it."""
        for _, process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(grace)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        self.processes.clear()


@contextmanager
def on_loopback(binaries: Path, prefix: str) -> Iterator[ControlPlane]:
    """A started control plane on 127.0.0.1 in a temporary directory (`prefix`), stopped and removed afterwards:
    the benchmarks' (tests/operatorbench)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        state = Path(tmp)
        keys = pki_module.create(state / "pki", ["127.0.0.1"], ["localhost"])
        plane = ControlPlane(binaries, state, keys, "127.0.0.1", port=free_port())
        try:
            plane.start()
            yield plane
        finally:
            plane.stop()
