"""Apache BookKeeper 4.17.2's Java side for the interop tests, from the jars `make bookkeeper-reference` fetches:
its shell, the interop programs of hack/bookkeeper-interop, and a Java bookie registered in a bookfleet fleet's
ZooKeeper. Shared by the modules of tests/interop (and any test that needs a stock peer beside bookfleet's)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bookfleet import childprocess, wire
from bookfleet.bench.bookkeeper import BOOKIE_SETTINGS, JAVA17_OPENS, STORAGE_CLASSES, built_reference
from bookfleet.security.tls import CA_FILE, CERT_FILE, KEY_FILE
from bookfleet.zkserver import free_port

requires_java = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("java", "javac", "mvn")), reason="no JDK (java, javac, mvn) on PATH"
)

SHELL_MAIN = "org.apache.bookkeeper.bookie.BookieShell"
DIGEST_PROBE = "LedgerDigestProbe"
BOOKIE_MAIN = "org.apache.bookkeeper.server.Main"
JVM = ["-Xms128m", "-Xmx256m", "-XX:MaxDirectMemorySize=256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
       *JAVA17_OPENS]
"""Small and quick to start: the tests move a few hundred entries, and two cores are shared."""


def classpath() -> str:
    """The jars and the compiled interop programs (built on first use)."""
    reference = built_reference()
    return f"{reference / 'classes'}:{reference / 'lib' / '*'}"


def write_conf(path: Path, zk: str, **settings: object) -> Path:
    """A BookKeeper configuration file pointing at the fleet's ZooKeeper, with `settings` (BookKeeper's names)."""
    lines = {"metadataServiceUri": f"zk+hierarchical://{zk}/ledgers", "zkTimeout": 30000, **settings}
    path.write_text("".join(f"{name}={value}\n" for name, value in lines.items()))
    return path


def tls_settings(tls_dir: Path) -> dict[str, object]:
    """A Java client's TLS settings for a bookfleet TLS directory (PEM files; BookKeeper asks START_TLS on each
    connection and checks the bookie's certificate against the CA and the address it dialled)."""
    return {
        "tlsProviderFactoryClass": "org.apache.bookkeeper.tls.TLSContextFactory", "tlsProvider": "JDK",
        "tlsClientAuthentication": "true", "hostnameVerificationEnabled": "true",
        "tlsKeyStoreType": "PEM", "tlsKeyStore": tls_dir / KEY_FILE, "tlsCertificatePath": tls_dir / CERT_FILE,
        "tlsTrustStoreType": "PEM", "tlsTrustStore": tls_dir / CA_FILE,
    }


def java_command(main: str, *args: object) -> list[str]:
    """The command line running `main` of the reference with `args`."""
    return ["java", *JVM, "-cp", classpath(), main, *map(str, args)]


def java(main: str, *args: object, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run one Java program of the reference to its end; its output as text."""
    return subprocess.run(java_command(main, *args), capture_output=True, text=True, timeout=timeout)


def shell(conf: Path, *command: str) -> str:
    """One BookieShell command that must succeed; its whole output (the shell logs what it prints)."""
    done = java(SHELL_MAIN, "-conf", str(conf), *command, timeout=180)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{output[-4000:]}"
    return output


def facts(output: str, prefix: str) -> list[str]:
    """The values of the lines `prefix <value>` an interop program printed."""
    return [line[len(prefix) + 1 :] for line in output.splitlines() if line.startswith(prefix + " ")]


def ledgers_read_from_java(
    zk: str, ledgers: list[tuple[int, wire.DigestType, bytes]]
) -> dict[int, list[bytes]]:
    """Every entry of each closed (ledger id, digest type, password) as BookKeeper's client reads it
    (LedgerDigestProbe: each digest checked, the digest type and password given), in order; one JVM for them all."""
    args = [arg for ledger_id, digest_type, password in ledgers for arg in (ledger_id, digest_type.name,
                                                                            password.decode())]
    done = java(DIGEST_PROBE, f"zk+hierarchical://{zk}/ledgers", "read", *args, timeout=240)
    assert done.returncode == 0, f"read of ledgers {args[::3]} exited {done.returncode}:\n{done.stdout[-3000:]}" \
        f"{done.stderr[-3000:]}"
    read: dict[int, list[bytes]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("reading "):
            entries = read[int(line.removeprefix("reading "))] = []
        elif line.startswith("entry "):
            _, entry_id, payload = line.split(" ")
            assert int(entry_id) == len(entries), done.stdout[-3000:]
            entries.append(bytes.fromhex(payload))
    assert list(read) == [ledger_id for ledger_id, _, _ in ledgers], done.stdout[-3000:]
    assert facts(done.stdout, "last") == [str(len(entries) - 1) for entries in read.values()], done.stdout[-3000:]
    return read


def ledger_read_from_java(zk: str, ledger_id: int, digest_type: wire.DigestType, password: bytes) -> list[bytes]:
    """Every entry of one closed ledger as BookKeeper's client reads it (ledgers_read_from_java)."""
    return ledgers_read_from_java(zk, [(ledger_id, digest_type, password)])[ledger_id]


def ledger_written_by_java(zk: str, digest_type: wire.DigestType, password: str, entries: int) -> int:
    """The id of a closed E3/Qw2/Qa2 ledger BookKeeper's client wrote (LedgerDigestProbe: `entries` entries of
    `probe_payload`)."""
    done = java(DIGEST_PROBE, f"zk+hierarchical://{zk}/ledgers", "write", digest_type.name, password, entries)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (ledger_id,) = map(int, facts(done.stdout, "ledger"))
    return ledger_id


def probe_payload(entry_id: int) -> bytes:
    """The payload LedgerDigestProbe writes as entry `entry_id` (its `payload`)."""
    return f"java entry {entry_id} ".encode() * (entry_id % 5 + 1)


def ledger_left_open(conf: Path, ensemble: int, write_quorum: int, ack_quorum: int, entries: int) -> str:
    """What a Java writer printed before it was killed with SIGKILL, holding its ledger open once each of its
    `entries` adds was acknowledged (`ledger <id>`, `acked <n>`..., `holding`; or `FAILED ...`)."""
    writer = subprocess.Popen(
        java_command("LedgerInterop", conf, "write-and-hold", ensemble, write_quorum, ack_quorum, entries),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    lines = []
    try:
        for line in writer.stdout:  # the writer never exits by itself once it holds
            lines.append(line.strip())
            if line.startswith(("holding", "FAILED")):
                break
    finally:
        writer.kill()
        writer.wait(30)
    return "\n".join(lines)


class JavaProcess:
    """A long-running Java program of the tests (a stock bookie, a Pulsar broker), its output in `log_path`; it ends
    with the test process however that ends."""

    def __init__(self, log_path: Path):
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def launch(self, command: list[str], ready: Callable[[], object], timeout: float, what: str) -> None:
        """Start `command` and return once `ready()` is true; kill it and raise if it dies or `timeout` passes."""
        with open(self.log_path, "ab") as log:
            self.process = childprocess.popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not ready():
            if not self.running or time.monotonic() > deadline:
                self.kill9()
                raise RuntimeError(f"{what}:\n{self.log_tail()}")
            time.sleep(0.2)

    def kill9(self) -> None:
        if self.running:
            self.process.kill()
        if self.process is not None:
            self.process.wait(30)

    def stop(self, timeout: float = 30.0) -> None:
        if self.running:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


class JavaBookie(JavaProcess):
    """A stock BookKeeper bookie (DbLedgerStorage) registered under the fleet's `/ledgers`, identified as
    `127.0.0.1:<port>`; `start` returns once its registration is in ZooKeeper."""

    def __init__(self, directory: Path, zk: str, **settings: object):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        super().__init__(self.directory / "bookie.log")
        self.zk = zk
        self.port = free_port()
        self.bookie_id = f"127.0.0.1:{self.port}"
        self.conf = write_conf(
            self.directory / "bookie.conf", zk, **{**BOOKIE_SETTINGS, **settings}, bookiePort=self.port,
            journalDirectories=self.directory / "journal", ledgerDirectories=self.directory / "ledgers",
            ledgerStorageClass=STORAGE_CLASSES["db"],
        )

    def start(self, zk_session, timeout: float = 60.0) -> JavaBookie:
        registration = f"/ledgers/available/{self.bookie_id}"
        self.launch(java_command(BOOKIE_MAIN, "-c", self.conf), lambda: zk_session.exists(registration), timeout,
                    f"Java bookie {self.bookie_id} did not register")
        return self


def started_side_by_side(bookies: list[JavaBookie], zk_session) -> list[JavaBookie]:
    """`bookies` started at once (a JVM's start takes seconds on a loaded machine); returned once all registered."""
    with ThreadPoolExecutor(len(bookies)) as pool:
        return list(pool.map(lambda bookie: bookie.start(zk_session), bookies))
