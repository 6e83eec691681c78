"""Real nodes for the local cluster: the kubelet built from the pinned k8s.io/kubernetes, on containerd and runc,
running pods as containers of the images built from our Dockerfiles (scripts/build-images.sh).

containerd, the kubelet, kube-proxy (iptables mode: the Services' ClusterIPs, the API server's among them) and CoreDNS
(cluster.local from the Services and EndpointSlices: the chart's names, a headless Service's pod names) run together
in namespaces of each node's own (see ../shared/notes/real-node.md):
- a network namespace on the cluster's bridge (like a process pod's), with the node's pods on a CNI bridge in a /24
  of their own behind it; the host and every other node (and process pod) reach them by a route through the node,
  they reach the bridge masqueraded;
- a mount namespace where the host sysctls the kubelet rewrites are files of the node's, and /run, /var/log and
  /var/lib (kubelet and libcni hard-code paths there) are private;
- a PID namespace: when its first process (tests/cluster/realnode.sh) ends, every shim and container ends with it.
Its cgroup root `/<bridge prefix>-<node>` is made in every cgroup v1 hierarchy and removed at stop.

The cluster's nodes (`NODES`): `node-real`, tainted, for the operator, ZooKeeper and repairs; one node per zone and a
cordoned spare in each for the bookies and clients, as the process kubelet's nodes are laid out. Each holds the
images its pods use under the names users pull (`docker.io/bookfleet/<image>:<version>`), as `kind load` would leave
them: the chart's and the CRDs' defaults run unchanged.

Development and test tooling only: it lives under tests/ and is never part of the product wheel.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from bookfleet import __version__, childprocess
from bookfleet.polling import wait_for
from tests.cluster import pki as pki_module
from tests.cluster.kubelet import SPARE_NODES, ZONE_NODES
from tests.cluster.network import Bridge, ip
from tests.cluster.pki import Pki

log = logging.getLogger("realnode")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LAUNCHER = HERE / "realnode.sh"
NAME, ZONE = "node-real", "zone-a"
"""The system node (the operator, ZooKeeper, repairs): in zone-a, as a zone of its own would change where the tier's
bookies spread."""
TAINT = "bookfleet.test/real-node"
TOLERATION = {"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}
PLACEMENT = {"nodeSelector": {"kubernetes.io/hostname": NAME}, "tolerations": [TOLERATION]}
"""Pod settings that put a pod on the system node (it is tainted: only pods that tolerate it land there)."""
PUBLISHED = ("bookie", "operator", "repair")
"""The images users pull, by the names the chart and the CRDs default to (`published_reference`)."""


@dataclass(frozen=True)
class NodePlan:
    """One real node of the local cluster: where it is, whether bookies may land on it, which images it holds."""

    name: str
    zone: str
    images: tuple[str, ...]
    tainted: bool = False
    cordoned: bool = False


NODES = (
    NodePlan(NAME, ZONE, ("operator", "zookeeper", "repair"), tainted=True),
    *(NodePlan(name, zone, ("bookie",), cordoned=name in SPARE_NODES) for name, zone in ZONE_NODES.items()),
)
"""The system node, then the zone nodes as the process kubelet lays them out (bookies and clients, whose pods use
the bookie image)."""


def published_reference(name: str) -> str:
    """Image `name` of this version as the chart's and the CRDs' defaults name it (on Docker Hub)."""
    return f"bookfleet/{name}:{__version__}"


def fully_qualified(reference: str) -> str:
    """The reference containerd stores and the kubelet looks for: registry and all."""
    return reference if "." in reference.split("/", 1)[0] else f"docker.io/{reference}"
CGROUPS = Path("/sys/fs/cgroup")
TOOLS = ("containerd", "runc", "ctr", "buildah", "unshare", "iptables", "go")
BINARIES = ("kubelet", "kube-proxy", "coredns")
"""Built by scripts/build-kube.sh: the node's kubelet and kube-proxy, and the DNS server its pods ask."""


def unavailable(binaries: Path) -> str | None:
    """Why a real node cannot run on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "not root"
    if missing := [tool for tool in TOOLS if shutil.which(tool) is None]:
        return f"missing {', '.join(missing)}"
    if missing := [binary for binary in BINARIES if not (binaries / binary).exists()]:
        return f"no {', '.join(missing)} in {binaries} (scripts/build-kube.sh {' '.join(BINARIES)})"
    if not Path("/usr/lib/cni/bridge").exists():
        return "no CNI plugins in /usr/lib/cni"
    if (CGROUPS / "cgroup.controllers").exists() or not (CGROUPS / "memory").is_dir():
        return "cgroup v2 only: the node's cgroup set-up is written for v1 hierarchies"
    return None


def node_state(cluster_state: Path, name: str = NAME) -> Path:
    """Real node `name`'s folder in the local cluster's state folder."""
    return cluster_state / "nodes" / name


def socket_of(state: Path) -> Path:
    """containerd's socket of the real node whose state folder is `state`."""
    return state / "containerd.sock"


@dataclass(frozen=True)
class NodeImage:
    """An image of scripts/build-images.sh and its OCI archive, for `ctr images import`."""

    reference: str
    archive: Path


def built_image(name: str) -> NodeImage:
    """One image of scripts/build-images.sh (built once per content hash, cached) with its archive."""
    result = subprocess.run(["bash", str(ROOT / "scripts" / "build-images.sh"), name], check=True,
                            capture_output=True, text=True, env={**os.environ, "BOOKFLEET_IMAGE_ARCHIVES": "1"})
    _, reference, path = result.stdout.split()
    return NodeImage(reference, Path(path))


def ctr(socket: Path, *args: str) -> str:
    """`ctr` on a node's containerd (its socket), in the kubelet's namespace; its output."""
    return subprocess.run(["ctr", "-a", str(socket), "-n", "k8s.io", *args], check=True, capture_output=True,
                          text=True).stdout


def import_image(socket: Path, image: NodeImage, *names: str) -> float:
    """`ctr images import` of the image's OCI archive into a node's containerd (its socket), tagged with `names` too
    (never pulled: there is no registry); the seconds it took."""
    started = time.monotonic()
    ctr(socket, "images", "import", str(image.archive))
    for name in names:
        ctr(socket, "images", "tag", "--force", image.reference, name)
    return time.monotonic() - started


def kill_container(state: Path, container_id: str) -> None:
    """SIGKILL to a container's processes on the node whose state folder is `state` (its kubelet restarts it)."""
    ctr(socket_of(state), "tasks", "kill", "--signal", "SIGKILL", container_id.removeprefix("containerd://"))


def fill_empty_dir(state: Path, pod_uid: str, volume: str, size: int) -> None:
    """`size` bytes of allocated blocks (what the kubelet measures) in a pod's emptyDir `volume` on the node whose
    state folder is `state`, written from the host as a runaway process in the pod would."""
    folder = state / "kubelet" / "pods" / pod_uid / "volumes" / "kubernetes.io~empty-dir" / volume
    with (folder / "filled-from-outside").open("wb") as file:
        os.posix_fallocate(file.fileno(), 0, size)


def _cgroup_dirs(root: str) -> list[Path]:
    return [hierarchy / root.strip("/") for hierarchy in sorted(CGROUPS.iterdir())
            if hierarchy.is_dir() and not hierarchy.is_symlink()]


@dataclass
class RealNode:
    """Node `plan`, the `index`-th real node of its cluster; its state (configs, containerd's root, logs) under
    `state`."""

    plan: NodePlan
    index: int
    state: Path
    binaries: Path
    pki: Pki
    server: str
    bridge: Bridge
    netns: str = ""
    address: str = ""
    process: subprocess.Popen | None = None
    started: float = 0.0
    """time.monotonic() at `start`."""
    runtime_up_s: float = 0.0
    """From `start` to containerd serving with the pause image imported."""
    failed: bool = False
    """Set by `fail`: its processes are gone on purpose."""

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def zone(self) -> str:
        return self.plan.zone

    @property
    def socket(self) -> Path:
        return socket_of(self.state)

    @property
    def cgroup_root(self) -> str:
        return f"/{self.bridge.prefix}-{self.name}"

    @property
    def pod_subnet(self) -> str:
        """10.100+i.n.0/24 for the n-th node (from 1), outside the bridge's 10.200+i.0.0/16: a node's eth0 and its
        pods' bridge never overlap, and no two nodes or local clusters (bridges bfk<i>) share one."""
        return f"10.{100 + int(self.bridge.prefix.removeprefix('bfk'))}.{self.index + 1}.0/24"

    @property
    def dns_address(self) -> str:
        """The first address of the pod subnet: the CNI bridge's, the pods' gateway."""
        return str(next(ipaddress.ip_network(self.pod_subnet).hosts()))

    def start(self, pause: NodeImage) -> None:
        """containerd up, the pause image imported, then the kubelet; returns once the Node is registered Ready is
        the caller's wait (the API server's view)."""
        self.started = time.monotonic()
        for folder in ("logs", "cni", "ipam", "varlog", "sysctl", "kubelet"):
            (self.state / folder).mkdir(parents=True, exist_ok=True)
        self.netns, self.address = self.bridge.attach(f"node-{self.name}")
        ip("-n", self.netns, "route", "add", "default", "via", self.bridge.host_address)
        ip("route", "add", self.pod_subnet, "via", self.address, "dev", self.bridge.name)
        self.bridge.route_to(self.pod_subnet, self.address)  # the process kubelet's pods reach its pods too
        self._make_cgroups()
        self._write_configs(pause)
        out = (self.state / "logs" / "node.log").open("ab")
        self.process = childprocess.popen(
            # nsenter, not `ip netns exec`: that remounts /sys, and the kubelet needs the cgroup mounts under it.
            # SIGKILL on this process's death: unshare blocks SIGTERM; its --kill-child then ends the launcher, the
            # first process of the node's PID namespace, and the kernel every other process in it.
            ["nsenter", f"--net=/run/netns/{self.netns}", "unshare", "--mount", "--propagation", "private", "--pid",
             "--fork", "--mount-proc", "--kill-child", "bash", str(LAUNCHER), str(self.state), str(self.binaries),
             *self._kubelet_args()],
            on_parent_death=signal.SIGKILL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        wait_for(lambda: self.check_alive() and self.socket.is_socket(), timeout=120, what="containerd's socket",
                 interval=0.2)
        self.import_image(pause)
        (self.state / "start-kubelet").touch()
        self.runtime_up_s = time.monotonic() - self.started

    def check_alive(self) -> bool:
        if not self.failed and self.process is not None and self.process.poll() is not None:
            tail = (self.state / "logs" / "node.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"real node {self.name} exited with {self.process.returncode}:\n{tail}")
        return True

    def import_image(self, image: NodeImage, *names: str) -> float:
        return import_image(self.socket, image, *names)

    def fail(self) -> None:
        """A node failure: every process of the node (containerd, the kubelet, shims, containers) killed at once, so
        its heartbeats stop. Its namespace, cgroups and files stay until `stop`."""
        self.failed = True
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # the launcher, the first process of the node's PID namespace
            self.process.wait()

    def cut(self) -> None:
        """Off the network (a zone outage): the node's link to the bridge goes down; its kubelet and containers run on,
        out of reach, and reach nothing."""
        self.bridge.cut(self.netns)

    def heal(self) -> None:
        self.bridge.heal(self.netns)

    def _make_cgroups(self) -> None:
        """The kubelet's cgroup root in every hierarchy (it refuses to start on missing paths); cpuset's needs the
        CPUs and memory nodes of its parent before any task may join."""
        for path in _cgroup_dirs(self.cgroup_root):
            path.mkdir(exist_ok=True)
            if path.parent.name == "cpuset":
                for setting in ("cpuset.cpus", "cpuset.mems"):
                    (path / setting).write_text((path.parent / setting).read_text())

    def _write_configs(self, pause: NodeImage) -> None:
        state = self.state
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        (state / "containerd.toml").write_text(f"""version = 2
root = "{state}/containerd/root"
state = "{state}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{state}/containerd/opt"
[{cri}]
  sandbox_image = "{pause.reference}"
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
        Root = "{state}/runc"
  [{cri}.cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{state}/cni"
    max_conf_num = 1
""")
        (state / "cni" / "10-bookfleet.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "bookfleet-node",
            "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
                         "ipam": {"type": "host-local", "dataDir": str(state / "ipam"),
                                  "ranges": [[{"subnet": self.pod_subnet}]], "routes": [{"dst": "0.0.0.0/0"}]}}],
        }))
        self._kubeconfig("kubeconfig", *pki_module.node_credentials(self.pki, self.name))
        self._kubeconfig("kube-proxy.kubeconfig", *pki_module.proxy_credentials(self.pki))
        # CoreDNS reads Services, EndpointSlices and Namespaces cluster-wide: the admin's credentials here (a real
        # cluster's runs under a ServiceAccount of its own, with a role for just that).
        self._kubeconfig("coredns.kubeconfig", self.pki.admin_cert, self.pki.admin_key)
        (state / "Corefile").write_text(f"""cluster.local:53 {{
    errors
    kubernetes cluster.local {{
        kubeconfig {state / "coredns.kubeconfig"} local
    }}
}}
""")
        (state / "kube-proxy.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration", "mode": "iptables",
            "clientConnection": {"kubeconfig": str(state / "kube-proxy.kubeconfig")},
            "hostnameOverride": self.name, "clusterCIDR": self.pod_subnet,
            # Service traffic leaves with the node's address: a reply from a pod on the same CNI bridge would
            # otherwise bypass the node's conntrack (no br_netfilter in its namespace) and never be un-NATed.
            "iptables": {"masqueradeAll": True},
            # The conntrack table's size and timeouts are the host's, not the node's to set.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }))
        (state / "resolv.conf").write_text("options ndots:1\n")
        serving = pki_module.kubelet_serving_credentials(self.pki, self.name, self.address)
        endpoint = f"unix://{self.socket}"
        (state / "kubelet.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root,
            "containerRuntimeEndpoint": endpoint, "imageServiceEndpoint": endpoint,
            "podLogsDir": str(state / "pod-logs"), "volumePluginDir": str(state / "volume-plugins"),
            "failSwapOn": False, "makeIPTablesUtilChains": False, "oomScoreAdj": 0, "protectKernelDefaults": False,
            "resolvConf": str(state / "resolv.conf"), "clusterDomain": "cluster.local",
            # CoreDNS listens in the node's namespace, which its pods reach as their gateway, the CNI bridge's address.
            "clusterDNS": [self.dns_address],
            # The disk is shared with the other test clusters: no eviction or image GC for its use.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(self.pki.ca_cert)}},
            "authorization": {"mode": "AlwaysAllow"},
            # The API server checks this certificate against the cluster's CA when it forwards `kubectl logs`.
            "tlsCertFile": str(serving[0]), "tlsPrivateKeyFile": str(serving[1]),
            "registerWithTaints": [{"key": TAINT, "value": "true", "effect": "NoSchedule"}] * self.plan.tainted,
            "nodeStatusReportFrequency": "10s",
            # emptyDir usage, which a pod over its volume's sizeLimit is evicted for, measured every 5 s, not 1 min.
            "volumeStatsAggPeriod": "5s",
        }))

    def _kubeconfig(self, name: str, cert: Path, key: Path) -> None:
        """A kubeconfig `name` in the node's state folder for the local API server, with a client certificate."""
        (self.state / name).write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": self.server,
                                                       "certificate-authority": str(self.pki.ca_cert)}}],
            "users": [{"name": "user", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
            "current-context": "local",
        }))

    def _kubelet_args(self) -> list[str]:
        return ["--config", str(self.state / "kubelet.yaml"), "--kubeconfig", str(self.state / "kubeconfig"),
                "--root-dir", str(self.state / "kubelet"), "--hostname-override", self.name,
                "--node-ip", self.address, "--node-labels", f"topology.kubernetes.io/zone={self.zone}"]

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the node's processes; the launcher's end takes every container along (its PID namespace).
        Then the cgroups go, and the node's namespace and routes with `Bridge.remove` (or here)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._remove_cgroups()
        if self.netns:
            ip("route", "del", self.pod_subnet, check=False)
            self.bridge.detach(self.netns)

    def _remove_cgroups(self) -> None:
        """Deepest first; a task still listed (the kernel reaps killed ones a moment later) is waited for."""
        for top in _cgroup_dirs(self.cgroup_root):
            if not top.exists():
                continue
            for path in [*sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), top]:
                wait_for(lambda path=path: self._rmdir(path), timeout=30, what=f"{path} removed", interval=0.2)

    @staticmethod
    def _rmdir(path: Path) -> bool:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            for pid in (path / "cgroup.procs").read_text().split():
                os.kill(int(pid), signal.SIGKILL)
            return False
