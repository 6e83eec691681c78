"""An embedded ZooKeeper server from the Debian package, for the standalone fleet and the tests."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

ZOOKEEPER_CLASSPATH = ":".join(
    f"/usr/share/java/{jar}"
    for jar in ("zookeeper.jar", "slf4j-simple.jar", "netty-codec.jar", "netty-resolver.jar")
)
ZOOKEEPER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"


class ZooKeeperUnavailable(RuntimeError):
    """The ZooKeeper server could not be started; the message says why and what to install."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port that is free now, chosen below the kernel's ephemeral range: a port from that range can be
    taken as the local end of any outgoing connection before (or while) a server binds it again on restart."""
    low = _ephemeral_range()[0]
    candidates = random.sample(range(max(1024, low - 12000), low), 64) if low > 2048 else []
    for port in candidates:
        if port in _handed_out:  # handed out earlier, perhaps not bound yet
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def four_letter_word(port: int, word: str = "ruok", timeout: float = 1.0) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(word.encode())
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode()


class ZooKeeperServer:
    """A standalone ZooKeeper on a loopback port with its own data dir; `connect` is HOST:PORT."""

    def __init__(self, data_dir: Path, port: int | None = None):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ZooKeeperServer:
        if not Path("/usr/share/java/zookeeper.jar").exists() or not shutil.which("java"):
            raise ZooKeeperUnavailable(
                "ZooKeeper needs /usr/share/java/zookeeper.jar and java: run `make setup` "
                "(apt-get install zookeeper default-jre-headless)"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "zoo.cfg"
        config.write_text(
            "tickTime=2000\n"
            f"dataDir={self.data_dir / 'data'}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=*\n"
            "maxClientCnxns=0\n"
            "globalOutstandingLimit=10000\n"
        )
        log = open(self.data_dir / "zookeeper.log", "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            ["java", "-Xmx256m", "-cp", ZOOKEEPER_CLASSPATH, ZOOKEEPER_MAIN, str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ZooKeeperUnavailable(
                    f"ZooKeeper exited with code {self.process.returncode}; see {self.data_dir / 'zookeeper.log'}"
                )
            with contextlib.suppress(OSError):
                if four_letter_word(self.port) == "imok":
                    return self
            time.sleep(0.05)
        self.stop()
        raise ZooKeeperUnavailable(f"ZooKeeper did not answer on port {self.port} within {timeout:.0f}s")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def zk_from_env(default: str | None = None) -> str | None:
    """The ZooKeeper connect string named by BOOKFLEET_ZK, else `default`."""
    return os.environ.get("BOOKFLEET_ZK", default)
