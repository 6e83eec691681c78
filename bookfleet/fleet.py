"""A fleet of real bookie processes on this machine: the standalone cluster, the test fixture, the pod harness.

`BookieProcess` is one `bookfleet bookie` child with a fixed id, ports and dirs, so it can be killed, restarted on
the same identity, or have its disks wiped. `BookieFleet` starts several of them against one ZooKeeper. Both are
plain classes so the standalone fleet can grow an auditor and a repair runner by subclassing or composition.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from bookfleet import childprocess
from bookfleet import localsecurity as local_security
from bookfleet.meta import zk as zkclient
from bookfleet.meta.acls import secure_tree
from bookfleet.security.certs import CertificateAuthority, write_tls_dir
from bookfleet.security.roles import Role
from bookfleet.security.tls import CA_FILE, bookie_host
from bookfleet.zkserver import ZooKeeperServer, free_port

log = logging.getLogger(__name__)

LOOPBACK_NAMES = ("127.0.0.1", "localhost")
"""What a bookie of a fleet on this machine is dialled as, so its certificate names them."""


class BookieStartError(RuntimeError):
    """A bookie process exited or never became ready; the message carries the tail of its log."""


def _flag(name: str, value: object) -> list[str]:
    option = "--" + name.replace("_", "-")
    if value is True:
        return [option]
    if value is False or value is None:
        return []
    return [option, str(value)]


class BookieProcess:
    """One bookie child process. `start()` always reuses the same id, port, HTTP port and dirs."""

    def __init__(
        self,
        bookie_id: str,
        zk: str,
        data_dir: Path,
        port: int | None = None,
        http_port: int | None = None,
        zone: str = "",
        advertised_address: str | None = None,
        log_level: str = "INFO",
        **flags: object,
    ):
        self.bookie_id = bookie_id
        self.zk = zk
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.http_port = http_port or free_port()
        self.zone = zone
        self.address = advertised_address or f"127.0.0.1:{self.port}"
        self.log_level = log_level
        self.flags = flags
        self.journal_dir = self.data_dir / "journal"
        self.ledger_dir = self.data_dir / "ledgers"
        self.log_path = self.data_dir / "bookie.log"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        args = [sys.executable, "-m", "bookfleet", "--log-level", self.log_level, "bookie", "--id", self.bookie_id]
        args += ["--port", str(self.port)]
        args += ["--http-port", str(self.http_port), "--advertised-address", self.address, "--zk", self.zk]
        args += ["--journal-dir", str(self.journal_dir), "--ledger-dir", str(self.ledger_dir)]
        if self.zone:
            args += ["--zone", self.zone]
        for name, value in self.flags.items():
            args += _flag(name, value)
        return args

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> BookieProcess:
        """Spawn the process (returns at once; `wait_ready()` waits for /readyz)."""
        if self.running:
            raise RuntimeError(f"bookie {self.bookie_id} is already running (pid {self.process.pid})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = childprocess.popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    def http_url(self, path: str) -> str:
        """The URL of one of the bookie's HTTP endpoints (HTTPS with `http_tls`)."""
        scheme = "https" if self.flags.get("http_tls") else "http"
        return f"{scheme}://127.0.0.1:{self.http_port}{path}"

    def http_context(self) -> ssl.SSLContext | None:
        """What verifies the bookie's HTTPS certificate: its own directory's CA (None for plain HTTP)."""
        if not self.flags.get("http_tls"):
            return None
        return ssl.create_default_context(cafile=Path(str(self.flags["tls_dir"])) / CA_FILE)

    def wait_ready(self, timeout: float = 30.0) -> BookieProcess:
        """Poll /readyz until it answers 200; raise with the log's tail if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        url, context = self.http_url("/readyz"), self.http_context()
        while time.monotonic() < deadline:
            if not self.running:
                code = self.process.returncode if self.process else None
                raise BookieStartError(f"bookie {self.bookie_id} exited with code {code}:\n{self.log_tail()}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(url, timeout=1, context=context) as reply,
            ):
                if reply.status == 200:
                    return self
            time.sleep(0.05)
        raise BookieStartError(f"bookie {self.bookie_id} not ready within {timeout:.0f}s:\n{self.log_tail()}")

    def wait_exit(self, timeout: float = 30.0) -> int:
        """The exit code of a process expected to stop by itself (e.g. refusing to start)."""
        assert self.process is not None, f"bookie {self.bookie_id} was never started"
        return self.process.wait(timeout)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait: the graceful path (finish in-flight, flush, checkpoint, unregister)."""
        return self._signal(signal.SIGTERM, timeout)

    def kill9(self) -> None:
        """SIGKILL: the crash path; the registration vanishes when its ZooKeeper session expires."""
        self._signal(signal.SIGKILL, 10.0)

    def restart(self, timeout: float = 30.0) -> BookieProcess:
        self.stop()
        return self.start().wait_ready(timeout)

    def wipe(self) -> None:
        """Delete the bookie's disks (it must be stopped): what a lost or replaced volume looks like."""
        if self.running:
            raise RuntimeError(f"stop bookie {self.bookie_id} before wiping its disks")
        shutil.rmtree(self.journal_dir, ignore_errors=True)
        shutil.rmtree(self.ledger_dir, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def _signal(self, sig: int, timeout: float) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __repr__(self) -> str:
        state = f"pid {self.process.pid}" if self.running else "stopped"
        return f"BookieProcess({self.bookie_id} at {self.address}, {state})"


class BookieFleet:
    """Bookie processes against one ZooKeeper, each under `data_dir/<n>`; `close()` kills what is left.

    With `ca`, every bookie serves mutual TLS with a certificate of that CA in `<its dir>/tls`. `default_flags` are
    bookie flags every bookie of this fleet gets unless `add` overrides them.
    """

    def __init__(self, zk: str, data_dir: Path, ca: CertificateAuthority | None = None, **default_flags: object):
        self.zk = zk
        self.data_dir = Path(data_dir)
        self.ca = ca
        self.default_flags = default_flags
        self.bookies: list[BookieProcess] = []

    def add(self, bookie_id: str | None = None, zone: str = "", **bookie_flags: object) -> BookieProcess:
        """A new (not yet started) bookie; its id defaults to localhost:<port>."""
        port = free_port()
        bookie_id = bookie_id or f"localhost:{port}"
        data_dir = self.data_dir / f"bookie-{len(self.bookies)}"
        flags = {**self.default_flags, **bookie_flags}
        if self.ca is not None:
            names = dict.fromkeys((*LOOPBACK_NAMES, bookie_host(bookie_id)))
            issued = self.ca.issue(bookie_id, [Role.BOOKIE], names)
            flags.setdefault("tls_dir", write_tls_dir(data_dir / "tls", issued))
        bookie = BookieProcess(bookie_id, self.zk, data_dir, port=port, zone=zone, **flags)
        self.bookies.append(bookie)
        return bookie

    def start(self, n: int, zones: list[str] | None = None, timeout: float = 60.0, **bookie_flags) -> list:
        """Start `n` bookies in parallel and wait until all are ready; zones are assigned round-robin."""
        started = [
            self.add(zone=zones[i % len(zones)] if zones else "", **bookie_flags).start() for i in range(n)
        ]
        for bookie in started:
            bookie.wait_ready(timeout)
        return started

    def close(self) -> None:
        for bookie in self.bookies:
            bookie.kill9()

    def stop(self) -> None:
        """Graceful stop of every bookie, in parallel."""
        for bookie in self.bookies:
            if bookie.running:
                os.kill(bookie.process.pid, signal.SIGTERM)
        for bookie in self.bookies:
            bookie.stop()

    def __enter__(self) -> BookieFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StandaloneCluster:
    """ZooKeeper (embedded unless `zk` is given) plus `bookies` bookie processes with stable ids bookie-<n>.

    Everything lives under `data_dir`, so a second run on the same dir brings back the same bookies and ledgers.
    With `secure`, bookies serve mutual TLS, ZooKeeper nodes carry the fleet's ACL and an embedded ZooKeeper serves
    only TLS (`bookfleet.localsecurity`); this process then acts with the fleet's identity.
    """

    def __init__(
        self, data_dir: Path, bookies: int, zk: str | None = None, zk_port: int | None = None, secure: bool = False
    ):
        self.data_dir = Path(data_dir).resolve()
        self.bookie_count = bookies
        self.security = local_security.prepare(self.data_dir, zookeeper_tls=not zk) if secure else None
        zookeeper_tls = self.security.zookeeper_dir if self.security else None
        self.zookeeper = None if zk else ZooKeeperServer(self.data_dir / "zookeeper", zk_port, tls_dir=zookeeper_tls)
        self.zk = zk or self.zookeeper.connect
        self.fleet = BookieFleet(self.zk, self.data_dir, ca=self.security.ca if self.security else None)

    def start(self) -> StandaloneCluster:
        if self.security is not None:
            self.security.use_in_this_process()
        if self.zookeeper is not None:
            self.zookeeper.start()
        try:
            if self.security is not None:
                self._secure_existing_nodes()
            for n in range(self.bookie_count):
                self.fleet.add(f"bookie-{n}").start()
            for bookie in self.fleet.bookies:
                bookie.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _secure_existing_nodes(self) -> None:
        """Nodes an earlier, plain run on this data dir created still carry ZooKeeper's open default."""
        with zkclient.session(self.zk) as zk:
            report = secure_tree(zk, zkclient.fleet_acl(self.security.zk_auth))
        if report.changed:
            log.info("gave %d node(s) from an earlier plain run the fleet's ACL", len(report.changed))
        if report.refused:
            log.warning("%d ZooKeeper node(s) keep an ACL the fleet may not change: %s", len(report.refused),
                        ", ".join(report.refused[:5]))

    def stop(self) -> None:
        self.fleet.stop()
        if self.zookeeper is not None:
            self.zookeeper.stop()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
