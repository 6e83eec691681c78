"""Pod networking without containers: a host-only Linux bridge and one network namespace per pod.

The bridge has no uplink and pods get no default route: they reach each other, the API server on the bridge's host
address and a real node's pods through that node (`route_to`), nothing else. Every namespace, link and nftables
table made here is named with the bridge's prefix so that `Bridge.remove` can delete all of them, also after a crash
of the process that made them.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _links() -> str:
    return ip("-o", "link", "show").stdout


def nft(script: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["nft", "-f", "-"], input=script, check=check, capture_output=True, text=True)


@dataclass
class Bridge:
    """The cluster's pod network: bridge `<prefix>br`, host address .1 of a /16, pods' namespaces `<prefix>-<n>`."""

    prefix: str
    network: ipaddress.IPv4Network
    _next_host: int = 2
    _free: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    routes: dict[str, str] = field(default_factory=dict)
    """Subnets behind a namespace on the bridge (a real node's pods): subnet -> that namespace's address."""
    _attached: dict[str, str] = field(default_factory=dict)
    """Namespaces attached and configured: name -> address."""
    _routing: threading.Lock = field(default_factory=threading.Lock)
    """Held while routes are added: every attached namespace gets every route, once (nodes start side by side)."""

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
        with self._routing:
            for subnet, via in self.routes.items():
                if via != address:
                    ip("-n", namespace, "route", "add", subnet, "via", via)
            self._attached[namespace] = address
        return namespace, address

    def route_to(self, subnet: str, via: str) -> None:
        """Every namespace on the bridge but `via`'s own, attached before or after, reaches `subnet` through the
        namespace whose address is `via` (a real node, its pods behind it)."""
        with self._routing:
            self.routes[subnet] = via
            for namespace, address in self._attached.items():
                if address != via:
                    ip("-n", namespace, "route", "replace", subnet, "via", via)

    def detach(self, namespace: str) -> None:
        """Delete a pod's namespace (its veth goes with it) and return its address to the pool."""
        host = int(namespace.rsplit("-", 1)[1])
        with self._routing:
            self._attached.pop(namespace, None)
        ip("link", "del", f"{self.prefix}v{host}", check=False)
        ip("netns", "del", namespace, check=False)
        with self._lock:
            self._free.append(host)

    def cut(self, namespace: str) -> None:
        """A partition: the pod's link goes down, its processes keep running."""
        ip("link", "set", self._veth(namespace), "down")

    def heal(self, namespace: str) -> None:
        """The partition ends: the pod's link comes back up."""
        ip("link", "set", self._veth(namespace), "up")

    def _veth(self, namespace: str) -> str:
        return f"{self.prefix}v{namespace.rsplit('-', 1)[1]}"

    def _group_table(self, group: str) -> str:
        return f"{self.prefix}_isolated_{re.sub(r'[^A-Za-z0-9]', '_', group)}"

    def isolate(self, group: str, namespaces: list[str]) -> None:
        """A partition that leaves links up: the pods of `namespaces` reach each other on the bridge and nothing
        else (no other pod, not the host's address); an nftables table of the bridge family drops the rest, at the
        bridge's forward, input and output hooks. `rejoin(group)` deletes the table: the heal is exact."""
        inside = ", ".join(f'"{self._veth(namespace)}"' for namespace in namespaces)
        table = self._group_table(group)
        nft(f"""table bridge {table} {{
  set inside {{ type ifname; {f"elements = {{ {inside} }};" if inside else ""} }}
  chain forward {{ type filter hook forward priority 0; policy accept;
    iifname @inside oifname @inside accept
    iifname @inside drop
    oifname @inside drop; }}
  chain input {{ type filter hook input priority 0; policy accept; iifname @inside drop; }}
  chain output {{ type filter hook output priority 0; policy accept; oifname @inside drop; }}
}}
""")

    def rejoin(self, group: str) -> None:
        """The partition of `isolate(group, ...)` ends (nothing happens if there is none)."""
        nft(f"delete table bridge {self._group_table(group)}\n", check=False)

    def remove(self) -> None:
        """Every namespace, link and nftables table with this prefix, then the bridge itself."""
        for line in nft("list tables bridge\n", check=False).stdout.splitlines():
            if (table := line.split()[-1]).startswith(f"{self.prefix}_"):
                nft(f"delete table bridge {table}\n", check=False)
        for namespace in ip("netns", "list", check=False).stdout.split("\n"):
            name = namespace.split(" ")[0]
            if name.startswith(f"{self.prefix}-"):
                ip("netns", "del", name, check=False)
                shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
        for line in _links().splitlines():
            link = line.split(":")[1].strip().split("@")[0]
            if link.startswith(f"{self.prefix}v") or link == self.name:
                ip("link", "del", link, check=False)
