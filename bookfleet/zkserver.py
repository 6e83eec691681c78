"""An embedded ZooKeeper server from the Debian package, for the standalone fleet and the tests.

With a TLS directory (`ca.pem`, `cert.pem`, `key.pem`) it serves only a TLS port (`secureClientPort`, Netty, PEM
key and trust stores, read by ZooKeeper 3.6 and later; Debian 12 ships 3.8): clients must present a certificate
of that CA and no plain port is open.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

from bookfleet import childprocess
from bookfleet.security.tls import tls_files

ZOOKEEPER_CLASSPATH = ":".join(
    f"/usr/share/java/{jar}"
    for jar in ("zookeeper.jar", "slf4j-simple.jar", "netty-codec.jar", "netty-resolver.jar")
)
ZOOKEEPER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
KEYSTORE_FILE = "keystore.pem"
"""ZooKeeper's PEM key store: the private key and the certificate in one file."""


class ZooKeeperStartError(RuntimeError):
    """The ZooKeeper server could not be started; the message says why and what to install."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_handed_out: set[int] = set()


PORT_SHARE = "BOOKFLEET_PORT_SHARE"
"""`I/N`: this process picks ports only from the I-th of N equal shares of free_port's range, so that processes
starting servers side by side (test workers) never hand out one port twice, nor take one a stopped server of another
will bind again."""


def _port_range() -> range:
    low = _ephemeral_range()[0]
    ports = range(max(1024, low - 12000), low)
    index, _, count = os.environ.get(PORT_SHARE, "0/1").partition("/")
    share = len(ports) // int(count)
    return ports[int(index) * share:(int(index) + 1) * share]


def free_port() -> int:
    """A loopback port that is free now, chosen below the kernel's ephemeral range: a port from that range can be
    taken as the local end of any outgoing connection before (or while) a server binds it again on restart."""
    ports = _port_range() if _ephemeral_range()[0] > 2048 else range(0)
    candidates = random.sample(ports, min(64, len(ports)))
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


def four_letter_word(
    port: int, word: str = "ruok", timeout: float = 1.0, tls: ssl.SSLContext | None = None
) -> str:
    """ZooKeeper's answer to a four-letter command, over TLS with `tls` (a secure port answers only that way)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as plain:
        sock = tls.wrap_socket(plain, server_hostname="127.0.0.1") if tls else plain
        sock.sendall(word.encode())
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def tls_client_context(tls_dir: Path) -> ssl.SSLContext:
    """A client context with the identity in `tls_dir`, trusting its CA only."""
    ca, cert, key = tls_files(Path(tls_dir))
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(cert, key)
    return context


class ZooKeeperServer:
    """A standalone ZooKeeper on a loopback port with its own data dir; `connect` is HOST:PORT.

    With `tls_dir` (its certificate must name 127.0.0.1) the port is a TLS port requiring client certificates of
    the directory's CA; clients connect with `bookfleet.meta.zk.connect(..., tls_dir=...)`.
    """

    def __init__(self, data_dir: Path, port: int | None = None, tls_dir: Path | None = None, heap_mb: int = 256):
        self.data_dir = Path(data_dir)
        self.heap_mb = heap_mb
        """The JVM's heap: 256 MiB holds a test fleet; 100,000 ledgers' metadata need more."""
        self.port = port or free_port()
        self.tls_dir = Path(tls_dir).resolve() if tls_dir else None
        self.process: subprocess.Popen | None = None

    def _port_config(self) -> str:
        if self.tls_dir is None:
            return f"clientPort={self.port}\nclientPortAddress=127.0.0.1\n"
        ca, cert, key = tls_files(self.tls_dir)
        keystore = self.data_dir / KEYSTORE_FILE
        fd = os.open(keystore, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(key.read_bytes() + cert.read_bytes())
        return (
            f"secureClientPort={self.port}\n"
            "secureClientPortAddress=127.0.0.1\n"
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
            f"ssl.keyStore.location={keystore}\n"
            "ssl.keyStore.type=PEM\n"
            f"ssl.trustStore.location={ca}\n"
            "ssl.trustStore.type=PEM\n"
            "ssl.clientAuth=need\n"
        )

    def serving(self) -> bool:
        """Whether the server takes sessions. Not `ruok`: it answers "imok" as soon as the port listens, while the
        server still loads its database and closes every session offered (a restart of a large one takes seconds,
        longer than a client's session); `srvr` reports the server's mode only once it serves."""
        tls = tls_client_context(self.tls_dir) if self.tls_dir else None
        return "Mode:" in four_letter_word(self.port, "srvr", tls=tls)

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ZooKeeperServer:
        if not Path("/usr/share/java/zookeeper.jar").exists() or not shutil.which("java"):
            raise ZooKeeperStartError(
                "ZooKeeper needs /usr/share/java/zookeeper.jar and java: run `make setup` "
                "(apt-get install zookeeper default-jre-headless)"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "zoo.cfg"
        config.write_text(
            "tickTime=2000\n"
            f"dataDir={self.data_dir / 'data'}\n"
            f"{self._port_config()}"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=*\n"
            "maxClientCnxns=0\n"
            "globalOutstandingLimit=10000\n"
        )
        log = open(self.data_dir / "zookeeper.log", "ab")  # noqa: SIM115 - the child keeps it
        self.process = childprocess.popen(
            ["java", f"-Xmx{self.heap_mb}m", "-cp", ZOOKEEPER_CLASSPATH, ZOOKEEPER_MAIN, str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ZooKeeperStartError(
                    f"ZooKeeper exited with code {self.process.returncode}; see {self.data_dir / 'zookeeper.log'}"
                )
            with contextlib.suppress(OSError):
                if self.serving():
                    return self
            time.sleep(0.05)
        self.stop()
        raise ZooKeeperStartError(f"ZooKeeper did not answer on port {self.port} within {timeout:.0f}s")

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
