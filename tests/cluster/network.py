"""Pod networking without containers: a host-only Linux bridge and one network namespace per pod.

The bridge has no uplink and pods get no default route: they reach each other and the API server on the bridge's
host address, nothing else. Every namespace and link made here is named with the bridge's prefix so that
`Bridge.remove` can delete all of them, also after a crash of the process that made them.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _links() -> str:
    return ip("-o", "link", "show").stdout


@dataclass
class Bridge:
    """The cluster's pod network: bridge `<prefix>br`, host address .1 of a /16, pods' namespaces `<prefix>-<n>`."""

    prefix: str
    network: ipaddress.IPv4Network
    _next_host: int = 2
    _free: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def choose(cls) -> Bridge:
        """The first index whose bridge name and subnet are unused, so concurrent clusters never collide."""
        links, addresses = _links(), ip("-o", "-4", "addr", "show").stdout
        for index in range(40):
            prefix, network = f"bfk{index}", ipaddress.ip_network(f"10.{200 + index}.0.0/16")
            if f" {prefix}br:" not in links and f"10.{200 + index}." not in addresses:
                return cls(prefix, network)
        raise RuntimeError("no free bridge name/subnet among bfk0..bfk39")

    @property
    def name(self) -> str:
        return f"{self.prefix}br"

    @property
    def host_address(self) -> str:
        return str(self.network.network_address + 1)

    def create(self) -> None:
        ip("link", "add", self.name, "type", "bridge")
        ip("addr", "add", f"{self.host_address}/{self.network.prefixlen}", "dev", self.name)
        ip("link", "set", self.name, "up")

    def attach(self, pod_key: str) -> tuple[str, str]:
        """A namespace for one pod, its veth on the bridge and the next free address: (namespace, pod IP)."""
        with self._lock:
            host = self._free.pop(0) if self._free else self._next_host
            if host == self._next_host:
                self._next_host += 1
        address = str(self.network.network_address + host)
        namespace, veth = f"{self.prefix}-{host}", f"{self.prefix}v{host}"
        ip("netns", "add", namespace)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        ip("link", "set", veth, "master", self.name, "up")
        ip("-n", namespace, "addr", "add", f"{address}/{self.network.prefixlen}", "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")
        ip("-n", namespace, "link", "set", "lo", "up")
        return namespace, address

    def detach(self, namespace: str) -> None:
        """Delete a pod's namespace (its veth goes with it) and return its address to the pool."""
        host = int(namespace.rsplit("-", 1)[1])
        ip("link", "del", f"{self.prefix}v{host}", check=False)
        ip("netns", "del", namespace, check=False)
        with self._lock:
            self._free.append(host)

    def cut(self, namespace: str) -> None:
        """A partition: the pod's link goes down, its processes keep running."""
        ip("link", "set", f"{self.prefix}v{namespace.rsplit('-', 1)[1]}", "down")

    def heal(self, namespace: str) -> None:
        """The partition ends: the pod's link comes back up."""
        ip("link", "set", f"{self.prefix}v{namespace.rsplit('-', 1)[1]}", "up")

    def remove(self) -> None:
        """Every namespace and link with this prefix, then the bridge itself."""
        for namespace in ip("netns", "list", check=False).stdout.split("\n"):
            name = namespace.split(" ")[0]
            if name.startswith(f"{self.prefix}-"):
                ip("netns", "del", name, check=False)
                shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
        for line in _links().splitlines():
            link = line.split(":")[1].strip().split("@")[0]
            if link.startswith(f"{self.prefix}v") or link == self.name:
                ip("link", "del", link, check=False)
