"""`bookfleet bench bookkeeper`: our client and bookies side by side with Apache BookKeeper's, same run, same disk.

Absolute figures do not travel between machines; a ratio against the reference does. Each scenario measures our
side exactly as `bookfleet bench client` does (one writer, `--in-flight` adds pipelined for `--seconds`, then half
that rate, paced per millisecond), then the Java side doing the same through BookKeeper's own client against Java
bookies (hack/bookkeeper-bench, built into ~/.cache/bookfleet/bookkeeper-<v>/ by scripts/build-bookkeeper.sh),
alternating ours, Java, ours, Java: one pair per Java variant (ledger storage x wire protocol), each ratio taken
against the run of ours just before it. Latency percentiles are true ones on both sides (every sample sorted here,
HdrHistogram there). Every line carries the same-run disk and CPU baselines and the Java settings used.

`--matrix` compares the bookies alone: the same Java bench client (V2, V3) on Java bookies and then on ours, each
cell on bookies of its own, the bookies' CPU per entry read from /proc of the bookie processes only; then our client
on Java bookies. Each cell runs the same two loads (full, then half of its own full-load rate, paced).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from bookfleet import spark as sparksettings
from bookfleet.bench import baseline, client, repair
from bookfleet.bench.latency_profile import LatencyProfile
from bookfleet.commanderror import CommandError
from bookfleet.fleet import BookieFleet, BookieProcess
from bookfleet.meta import zk as zkclient
from bookfleet.meta.registry import BookieRegistry
from bookfleet.zkserver import ZooKeeperServer, free_port

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-bookkeeper.sh"

STORAGE_CLASSES = {
    "db": "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage",
    "sorted": "org.apache.bookkeeper.bookie.SortedLedgerStorage",
}
PROTOCOLS = ("v2", "v3")

# Sized for a 2-core, shared machine: a fixed heap (no resizing pauses), G1 with a short pause goal, and direct
# memory for Netty's buffers and DbLedgerStorage's write cache and read-ahead cache; the module openings
# BookKeeper's own scripts pass on Java 17 (Netty's direct buffers, the journal's page-cache advice).
JAVA17_OPENS = [
    "--add-opens", "java.base/java.io=ALL-UNNAMED", "--add-opens", "java.base/java.nio=ALL-UNNAMED",
    "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED", "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-exports", "java.base/jdk.internal.misc=ALL-UNNAMED", "-Dio.netty.tryReflectionSetAccessible=true",
]
BOOKIE_JVM = ["-Xms512m", "-Xmx512m", "-XX:MaxDirectMemorySize=512m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=10",
              "-XX:+ParallelRefProcEnabled", "-XX:+DisableExplicitGC", *JAVA17_OPENS]
CLIENT_JVM = ["-Xms512m", "-Xmx512m", "-XX:MaxDirectMemorySize=512m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=10",
              *JAVA17_OPENS]

# Group commit as our bookie does it (no wait: the journal is synced as soon as its queue drains, batches grow with
# the load), capped at BookKeeper's default 2 ms wait and 512 KiB; fdatasync of every journal write, as ours.
BOOKIE_SETTINGS = {
    "journalSyncData": "true",
    "journalAdaptiveGroupWrites": "true",
    "journalFlushWhenQueueEmpty": "true",
    "journalMaxGroupWaitMSec": "2",
    "journalBufferedWritesThreshold": str(512 << 10),
    "dbStorage_writeCacheMaxSizeMb": "64",
    "dbStorage_readAheadCacheMaxSizeMb": "32",
    "dbStorage_rocksDB_blockCacheSize": str(32 << 20),
    "numAddWorkerThreads": "1",
    "autoRecoveryDaemonEnabled": "false",
    "httpServerEnabled": "false",
    "diskUsageThreshold": "0.99",
    "diskUsageWarnThreshold": "0.98",
    "allowLoopback": "true",
    "listeningInterface": "lo",
    "advertisedAddress": "127.0.0.1",
    "useHostNameAsBookieID": "false",
}


# AutoRecovery as BookKeeper deploys it by default: an auditor elected among the bookies and a replication worker
# in each, no delay after a loss; a killed bookie is seen lost when its ZooKeeper session (4 s, the least this
# ZooKeeper grants) expires. Our side marks the lost bookie's ledgers the moment it is killed (`bench repair`).
RECOVERY_SETTINGS = {
    "autoRecoveryDaemonEnabled": "true",
    "lostBookieRecoveryDelay": "0",
    "zkTimeout": "4000",
}
RECOVERY_BOOKIES = 4
RECOVERY_SHAPE = (3, 2, 2)  # E, Qw, Qa: `bench repair`'s ledgers


@dataclass(frozen=True)
class RecoveryCase:
    """What the lost bookie held a share of: `ledgers` closed ledgers of `entries` entries of `entry_size` bytes."""

    name: str
    ledgers: int
    entries: int
    entry_size: int


BULK_ENTRIES_PER_LEDGER = 256
BULK_ENTRY_SIZE = 64 << 10
RECOVERY_CASES = ("ledgers", "bulk")


def recovery_case(name: str, bulk_mib: int) -> RecoveryCase:
    """Many small ledgers (ZooKeeper and per-ledger work), or `bulk_mib` of 64 KiB entries in ledgers of 16 MiB
    (bytes moved: 1 GiB by default, as `bench repair --ledgers 64 --entries 256 --entry-size 65536`)."""
    if name == "ledgers":
        return RecoveryCase(name, 1000, 100, 1024)
    ledger_bytes = BULK_ENTRIES_PER_LEDGER * BULK_ENTRY_SIZE
    if bulk_mib <= 0 or (bulk_mib << 20) % ledger_bytes:
        raise CommandError(f"--bulk-mib must be a positive multiple of {ledger_bytes >> 20}")
    return RecoveryCase(name, (bulk_mib << 20) // ledger_bytes, BULK_ENTRIES_PER_LEDGER, BULK_ENTRY_SIZE)


@dataclass(frozen=True)
class Scenario:
    name: str
    bookies: int
    ensemble: int
    write_quorum: int
    ack_quorum: int
    entry_size: int

    @property
    def in_flight(self) -> int:
        """`bench client`'s 2000 adds in flight, or 16 MiB worth of larger entries (more only adds queueing)."""
        return max(16, min(2000, (16 << 20) // self.entry_size))


SCENARIOS = {
    scenario.name: scenario
    for scenario in (
        Scenario("one-bookie", 1, 1, 1, 1, 1024),
        Scenario("e3", 3, 3, 3, 2, 1024),
        Scenario("one-bookie-64k", 1, 1, 1, 1, 64 << 10),
        Scenario("e3-64k", 3, 3, 3, 2, 64 << 10),
    )
}
PAIRED_SCENARIOS = ("one-bookie", "e3", "one-bookie-64k")
"""The default run's: each side's own client and bookies (e3-64k only in `--matrix`, which takes every scenario)."""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bookkeeper", help="our client and bookies against Apache BookKeeper's Java ones (development; needs Java)"
    )
    parser.add_argument(
        "--scenario", action="append", choices=list(SCENARIOS),
        help="one-bookie (E=Qw=Qa=1, 1 KiB), e3 (3 bookies E3/Qw3/Qa2, 1 KiB), one-bookie-64k, e3-64k (repeatable; "
        "default: the first three, all four with --matrix)",
    )
    parser.add_argument("--storage", action="append", choices=list(STORAGE_CLASSES),
                        help="Java ledger storage (repeatable; default db and sorted, db alone with --matrix)")
    parser.add_argument("--protocol", action="append", choices=PROTOCOLS,
                        help="Java client wire protocol (repeatable; default v2 and v3)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--matrix", action="store_true",
        help="instead: bookie against bookie, per scenario the same Java client (each --protocol) on Java bookies "
        "and on ours, then our client on Java bookies; ratios ours/Java of adds/s and of the bookies' CPU per entry",
    )
    mode.add_argument(
        "--recovery", action="store_true",
        help="instead: per --recovery-case, a bookie of 4 is killed; seconds until every ledger is back at Qw, our "
        "auditor + Spark repair against the Java bookies' AutoRecovery",
    )
    parser.add_argument(
        "--recovery-case", action="append", choices=list(RECOVERY_CASES),
        help="ledgers: 1,000 ledgers x 100 x 1 KiB; bulk: --bulk-mib of 64 KiB entries in ledgers of 256 "
        "(repeatable; default both)",
    )
    parser.add_argument("--cold-spark", action="store_true",
                        help="--recovery: our repair on a Spark session that has run no job (default: warmed up)")
    parser.add_argument("--bulk-mib", type=int, default=1024,
                        help="--recovery bulk case: MiB written, a multiple of 16 (default 1024: 1 GiB)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each load phase (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="unmeasured full load before the Java client's measured one, for its JIT (default 2)")
    parser.add_argument("--java-dir", type=Path,
                        help="the built reference (default: run scripts/build-bookkeeper.sh, which caches it)")
    baseline.add_event_loop_argument(parser)
    parser.add_argument("--dir", type=Path, help="where ZooKeeper and the bookies keep data (default: temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per scenario")
    parser.set_defaults(handler=handle)


def built_reference() -> Path:
    """The cached jars and compiled bench (built on first use, once per BookKeeper version)."""
    try:
        built = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        raise CommandError(f"building the Java reference failed:\n{exc.stderr[-3000:]}") from None
    return Path(built.stdout.strip().splitlines()[-1])


class JavaSide:
    """Java bookies and the Java load client of one reference build, in a cluster of their own under `root`."""

    def __init__(self, reference: Path, zk: str, directory: Path):
        self.classpath = f"{reference / 'classes'}:{reference / 'lib' / '*'}"
        self.zk = zk
        self.directory = directory

    def _java(self, jvm: list[str], main: str, *args: str) -> list[str]:
        return ["java", *jvm, "-cp", self.classpath, main, *args]

    def measure(self, scenario: Scenario, storage: str, protocol: str, seconds: float, warmup: float,
                run: Path) -> dict:
        """One load of `scenario` on Java bookies keeping their data under `run`."""
        root = f"/bookkeeper-java/{scenario.name}-{storage}-{protocol}"
        with self.bookies(scenario.bookies, storage, root, run) as bookies:
            return self.load(scenario, protocol, root, [bookie.pid for bookie in bookies], seconds, warmup, run)

    @contextlib.contextmanager
    def bookies(self, count: int, storage: str, root: str, run: Path) -> Iterator[list[subprocess.Popen]]:
        """`count` Java bookies of the cluster under `root`, their data under `run`; stopped on leaving."""
        bookies = [self._start_bookie(run / f"bookie-{index}", root, storage)[0] for index in range(count)]
        try:
            yield bookies
        finally:
            self._stop(bookies)

    def load(self, scenario: Scenario, protocol: str, root: str, bookie_pids: list[int], seconds: float,
             warmup: float, run: Path, metered: Sequence[BookieProcess] = ()) -> dict:
        """The Java bench client's loads on whichever bookies serve the cluster under `root` (Java's or ours), the
        bookies' CPU read from /proc of `bookie_pids`; the bookies' logs are under `run`. Its half load is profiled
        as `bench client`'s is (`latency_profile`), the histograms read from `metered` (ours)."""
        options = {
            "ensemble": scenario.ensemble, "write_quorum": scenario.write_quorum,
            "ack_quorum": scenario.ack_quorum, "entry_size": scenario.entry_size,
            "in_flight": scenario.in_flight, "seconds": seconds, "warmup": warmup, "protocol": protocol,
            "bookie_pids": ",".join(map(str, bookie_pids)),
        }
        run.mkdir(parents=True, exist_ok=True)
        log_path = run / "client.log"
        with open(log_path, "wb") as log:
            client = subprocess.Popen(
                self._java(CLIENT_JVM, "BookKeeperBench", "load", self.zk, root,
                           *(f"{name}={value}" for name, value in options.items())),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
            )
        watchdog = threading.Timer(seconds * 4 + warmup + 180, client.kill)
        watchdog.start()
        try:
            half = _profiled_half_load(client, LatencyProfile(client.pid, bookie_pids, metered))
            output = client.stdout.read()
            client.wait()
        finally:
            watchdog.cancel()
            if client.poll() is None:
                client.kill()
                client.wait()
        figures = self._figures(client.returncode, output, log_path.read_text(errors="replace"), run)
        return figures | {f"half_{name}": value for name, value in half.items()}

    def recover(self, ledgers: int, entries: int, entry_size: int) -> dict:
        """Java bookies with AutoRecovery on; the Java client writes the ledgers, kills the first bookie and
        times until no ledger's ensembles name it."""
        run = self.directory / "recovery"
        root = f"/bookkeeper-java/{run.name}"
        bookies = [self._start_bookie(run / f"bookie-{index}", root, "db", RECOVERY_SETTINGS)
                   for index in range(RECOVERY_BOOKIES)]
        victim, victim_port = bookies[0]
        ensemble, write_quorum, ack_quorum = RECOVERY_SHAPE
        options = {
            "ledgers": ledgers, "entries": entries, "entry_size": entry_size, "bookies": RECOVERY_BOOKIES,
            "ensemble": ensemble, "write_quorum": write_quorum, "ack_quorum": ack_quorum,
            "victim": f"127.0.0.1:{victim_port}", "victim_pid": victim.pid,
        }
        try:
            load = subprocess.run(
                self._java(CLIENT_JVM, "RecoveryBench", self.zk, root,
                           *(f"{name}={value}" for name, value in options.items())),
                capture_output=True, text=True, timeout=3600,
            )
        finally:
            self._stop([bookie for bookie, _ in bookies])
        return self._figures(load.returncode, load.stdout, load.stderr, run)

    @staticmethod
    def _stop(bookies: list[subprocess.Popen]) -> None:
        for bookie in bookies:
            bookie.terminate()
        for bookie in bookies:
            bookie.wait(timeout=60)

    @staticmethod
    def _figures(returncode: int, output: str, errors: str, run: Path) -> dict:
        if returncode != 0:
            raise CommandError(f"the Java side failed:\n{errors[-3000:]}\n{_bookie_logs(run)}")
        return json.loads(output.strip().splitlines()[-1])

    def _start_bookie(
        self, directory: Path, root: str, storage: str, extra: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen, int]:
        directory.mkdir(parents=True)
        port = free_port()
        settings = {
            **BOOKIE_SETTINGS,
            **(extra or {}),
            "bookiePort": str(port),
            "metadataServiceUri": f"zk+hierarchical://{self.zk}{root}",
            "journalDirectories": str(directory / "journal"),
            "ledgerDirectories": str(directory / "ledgers"),
            "ledgerStorageClass": STORAGE_CLASSES[storage],
        }
        conf = directory / "bookie.conf"
        conf.write_text("".join(f"{name}={value}\n" for name, value in settings.items()))
        with open(directory / "bookie.log", "wb") as log:
            process = subprocess.Popen(
                self._java(BOOKIE_JVM, "BookKeeperBench", "bookie", self.zk, root, str(conf)),
                stdout=log, stderr=subprocess.STDOUT,
            )
        return process, port


def _profiled_half_load(client: subprocess.Popen, profile: LatencyProfile) -> dict:
    """Answer the Java client's phase edges on its stdout, taking `profile`'s readings at each before it goes on:
    the profile of its half load, or nothing if it ended before the phase's end (its exit status says why)."""
    readings = {"half-load start": profile.start, "half-load end": profile.report}
    for line in client.stdout:
        reading = readings.get(line.strip())
        if reading is None:
            continue
        figures = reading()
        client.stdin.write("\n")
        client.stdin.flush()
        if figures is not None:
            return figures
    return {}


def _bookie_logs(run: Path) -> str:
    """The tails of the logs of the bookies (Java's or ours) that kept their data under `run`."""
    return "".join(path.read_text(errors="replace")[-2000:] for path in run.glob("bookie-*/bookie.log"))


def _client_settings(scenario: Scenario, args: argparse.Namespace) -> argparse.Namespace:
    """`bookfleet bench client`'s settings for `scenario`."""
    return argparse.Namespace(
        bookies=scenario.bookies, ensemble=scenario.ensemble, write_quorum=scenario.write_quorum,
        ack_quorum=scenario.ack_quorum, entry_size=scenario.entry_size, seconds=args.seconds,
        in_flight=scenario.in_flight, event_loop=args.event_loop,
    )


def _ours(zk: str, directory: Path, scenario: Scenario, args: argparse.Namespace) -> dict:
    """`bookfleet bench client`'s loads on a fleet of our bookies of its own."""
    return client._measure(zk, directory, _client_settings(scenario, args))


def _cluster_of_its_own(zk: str, run: Path) -> tuple[str, str]:
    """One matrix cell's cluster in the shared ZooKeeper: the connect string with a chroot (as bookfleet's bookies
    and client take it) and the same cluster's ledgers root as BookKeeper's configuration names it. The chroot's
    node is made here: a session opened on a chroot not there yet works, but warns."""
    with zkclient.session(zk, auth=zkclient.NO_AUTH, tls_dir=zkclient.NO_TLS) as session:
        session.ensure_path(f"/{run.name}")
    return f"{zk}/{run.name}", f"/{run.name}/ledgers"


def _java_client_on_our_bookies(
    java: JavaSide, zk: str, scenario: Scenario, protocol: str, args: argparse.Namespace, run: Path
) -> dict:
    """The Java bench client's loads on a fleet of our bookies of its own (it waits for their registrations)."""
    chroot, root = _cluster_of_its_own(zk, run)
    with BookieFleet(chroot, run) as fleet:
        bookies = fleet.start(scenario.bookies, log_level="WARNING", event_loop=args.event_loop)
        figures = java.load(scenario, protocol, root, [bookie.process.pid for bookie in bookies], args.seconds,
                            args.warmup, run, metered=bookies)
        fleet.stop()
    return figures


def _our_client_on_java_bookies(
    java: JavaSide, zk: str, scenario: Scenario, storage: str, args: argparse.Namespace, run: Path
) -> dict:
    """`bookfleet bench client`'s loads on Java bookies of a cluster of their own."""
    chroot, root = _cluster_of_its_own(zk, run)
    with java.bookies(scenario.bookies, storage, root, run) as bookies:
        _wait_registered(chroot, bookies, run)
        return client.measure_against(chroot, _client_settings(scenario, args), [bookie.pid for bookie in bookies])


def _wait_registered(zk: str, bookies: list[subprocess.Popen], run: Path, timeout: float = 120.0) -> None:
    """Return once every one of `bookies` is registered under `zk`: our client takes the bookies it finds, and a
    JVM's start takes seconds (BookKeeper's client waits by itself)."""
    deadline = time.monotonic() + timeout
    with zkclient.session(zk, auth=zkclient.NO_AUTH, tls_dir=zkclient.NO_TLS) as session:
        registry = BookieRegistry(session)
        while len(registry.ids()) < len(bookies):
            if time.monotonic() > deadline or any(bookie.poll() is not None for bookie in bookies):
                raise CommandError(f"the Java bookies did not all register:\n{_bookie_logs(run)}")
            time.sleep(0.2)


RATIOS = {
    # name: (figure, True when higher is better for us)
    "throughput": ("full_entries_per_s", True),
    "half_p50": ("half_p50_ms", False),
    "half_p99": ("half_p99_ms", False),
    "half_p999": ("half_p999_ms", False),
    "bookies_cpu_per_entry": ("full_bookies_cpu_us_per_entry", False),
    "client_cpu_per_entry": ("full_client_cpu_us_per_entry", False),
}
BOOKIE_RATIOS = {
    # name: figure; ours over Java's bookie under the same client (adds/s > 1 and the rest < 1: ours is better)
    "adds_per_s": "full_entries_per_s",
    "bookies_cpu_per_entry": "full_bookies_cpu_us_per_entry",
    "half_p50": "half_p50_ms",
    "half_p99": "half_p99_ms",
}
CLIENT_RATIOS = {
    # name: figure; our client over Java's on the same Java bookies
    "adds_per_s": "full_entries_per_s",
    "client_cpu_per_entry": "full_client_cpu_us_per_entry",
    "half_p50": "half_p50_ms",
    "half_p99": "half_p99_ms",
}


def quotients(ours: dict, java: dict, figures: dict[str, str]) -> dict[str, float]:
    """Ours over Java for each named figure."""
    return {name: ours[figure] / java[figure] for name, figure in figures.items()}


def ratios(ours: dict, java: dict) -> dict[str, float]:
    """Ours over Java for each compared figure (throughput > 1 and latency or CPU < 1 mean ours is better)."""
    named = {f"{name}_ours_over_java": figure for name, (figure, _) in RATIOS.items()}
    return quotients(ours, java, named)


def _shape(scenario: Scenario, args: argparse.Namespace, loop_name: str) -> dict:
    """What every report of a scenario says of its load."""
    return {
        "bookies": scenario.bookies,
        "ensemble": scenario.ensemble,
        "write_quorum": scenario.write_quorum,
        "ack_quorum": scenario.ack_quorum,
        "entry_size": scenario.entry_size,
        "in_flight": scenario.in_flight,
        "seconds": args.seconds,
        "java_warmup_seconds": args.warmup,
        "event_loop": loop_name,
    }


JAVA_SETTINGS = {
    "java_bookie_jvm": " ".join(BOOKIE_JVM),
    "java_client_jvm": " ".join(CLIENT_JVM),
    "java_bookie_settings": BOOKIE_SETTINGS,
}


def _scenario_report(
    scenario: Scenario, java: JavaSide, zk: str, root: Path, args: argparse.Namespace, loop_name: str
) -> dict:
    baselines = baseline.same_run_baselines(root, scenario.entry_size)
    runs = []
    for index, (storage, protocol) in enumerate(itertools.product(args.storage, args.protocol)):
        pair = root / f"{scenario.name}-{index}"
        ours = _ours(zk, pair / "ours", scenario, args)
        reference = java.measure(scenario, storage, protocol, args.seconds, args.warmup, pair / "java")
        shutil.rmtree(pair)  # a 64 KiB pair writes gigabytes: kept, eight pairs filled the disk (bookies read-only)
        runs.append({"java": f"{storage}-{protocol}", "ours": ours, "java_figures": reference,
                     **ratios(ours, reference)})
    return {
        "scenario": scenario.name,
        **_shape(scenario, args, loop_name),
        "order": "ours, java per pair; pairs in the order listed",
        "runs": runs,
        **baselines,
        **JAVA_SETTINGS,
    }


def _matrix_report(
    scenario: Scenario, java: JavaSide, zk: str, root: Path, args: argparse.Namespace, loop_name: str
) -> dict:
    """Per Java client protocol, the Java client on Java bookies (each --storage) and right after on ours, our
    bookies' figures over Java's; then our client on Java bookies, its figures over each Java client's there."""
    baselines = baseline.same_run_baselines(root, scenario.entry_size)
    cells: list[dict] = []

    def cell(client_name: str, bookie_name: str, measure: Callable[[Path], dict]) -> dict:
        run = root / f"{scenario.name}-cell-{len(cells)}"
        figures = measure(run)
        shutil.rmtree(run)  # a 64 KiB cell writes gigabytes
        cells.append({"client": client_name, "bookie": bookie_name, "figures": figures})
        return cells[-1]

    java_clients: dict[str, dict[str, dict]] = {}  # Java client -> Java storage -> figures
    for protocol in args.protocol:
        client_name = f"java-{protocol}"
        on_java = java_clients[client_name] = {
            storage: cell(client_name, f"java-{storage}", partial(
                java.measure, scenario, storage, protocol, args.seconds, args.warmup
            ))["figures"]
            for storage in args.storage
        }
        ours = cell(client_name, "bookfleet", partial(_java_client_on_our_bookies, java, zk, scenario, protocol, args))
        ours["bookfleet_bookie_over_java_bookie"] = {
            f"java-{storage}": quotients(ours["figures"], figures, BOOKIE_RATIOS)
            for storage, figures in on_java.items()
        }
    for storage in args.storage:
        ours = cell("bookfleet", f"java-{storage}", partial(_our_client_on_java_bookies, java, zk, scenario, storage,
                                                            args))
        ours["bookfleet_client_over_java_client"] = {
            name: quotients(ours["figures"], on_java[storage], CLIENT_RATIOS) for name, on_java in java_clients.items()
        }
    return {
        "matrix": scenario.name,
        **_shape(scenario, args, loop_name),
        "order": "cells in the order listed, each on bookies of its own, stopped before the next",
        "cells": cells,
        **baselines,
        **JAVA_SETTINGS,
    }


def _recovery_report(reference: Path, case: RecoveryCase, args: argparse.Namespace) -> dict:
    """Ours (`bench repair`: 4 bookies, E3/Qw2/Qa2, the lost bookie's ledgers marked at once, Spark local[2]), then
    Java's AutoRecovery on the same shape, each in a ZooKeeper and directory of its own."""
    ensemble, write_quorum, ack_quorum = RECOVERY_SHAPE
    ours = repair.measure(argparse.Namespace(
        ledgers=case.ledgers, entries=case.entries, entry_size=case.entry_size, bookies=RECOVERY_BOOKIES,
        write_quorum=write_quorum, master="local[2]", throttle_mb_s=None, no_verify=False, json=True,
        cold_spark=args.cold_spark,
    ))
    sparksettings.session("local[2]").stop()  # its executors and task threads must not take Java's cores
    with tempfile.TemporaryDirectory(prefix="bench-bookkeeper-recovery-", dir=args.dir) as tmp:
        root = Path(tmp)
        with ZooKeeperServer(root / "zookeeper") as zookeeper:
            java = JavaSide(reference, zookeeper.connect, root / "java").recover(
                case.ledgers, case.entries, case.entry_size
            )
        java["load_average_1m"] = os.getloadavg()[0]
    return {
        "scenario": f"recovery-{case.name}",
        "ledgers": case.ledgers,
        "entries_per_ledger": case.entries,
        "entry_size": case.entry_size,
        "data_written_mib": case.ledgers * case.entries * case.entry_size / (1 << 20),
        "bookies": RECOVERY_BOOKIES,
        "ensemble": [ensemble, write_quorum, ack_quorum],
        "order": "ours, then java",
        "ours": ours,
        "java_figures": java,
        "java_settings": {"storage": "db", **RECOVERY_SETTINGS},
        "java_bookie_jvm": " ".join(BOOKIE_JVM),
        # how many times faster ours is (target: 5)
        "recovery_java_seconds_over_ours": java["seconds_loss_to_full_replication"]
        / ours["seconds_loss_to_full_replication"],
    }


def handle(args: argparse.Namespace) -> int:
    loop_name = baseline.chosen_event_loop(args.event_loop)
    if args.seconds <= 0 or args.warmup < 0:
        raise CommandError("--seconds must be positive and --warmup not negative")
    args.storage = args.storage or (["db"] if args.matrix else list(STORAGE_CLASSES))
    args.protocol = args.protocol or list(PROTOCOLS)
    reference = args.java_dir or built_reference()
    if args.recovery:
        for case in [recovery_case(name, args.bulk_mib) for name in args.recovery_case or RECOVERY_CASES]:
            report = _recovery_report(reference, case, args)
            print(json.dumps(report) if args.json else json.dumps(report, indent=2), flush=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-bookkeeper-", dir=args.dir) as tmp:
        root = Path(tmp)
        with ZooKeeperServer(root / "zookeeper") as zookeeper:
            java = JavaSide(reference, zookeeper.connect, root / "java")
            measure, text = (_matrix_report, _print_matrix_text) if args.matrix else (_scenario_report, _print_text)
            for name in args.scenario or (list(SCENARIOS) if args.matrix else PAIRED_SCENARIOS):
                report = measure(SCENARIOS[name], java, zookeeper.connect, root, args, loop_name)
                if args.json:
                    print(json.dumps(report), flush=True)
                else:
                    text(report)
    return 0


def _print_heading(name: str, report: dict) -> None:
    """The scenario's shape and its disk's fsync baseline, above its figures."""
    print(f"{name}: {report['entry_size']} B, E{report['ensemble']}/Qw{report['write_quorum']}/"
          f"Qa{report['ack_quorum']}, raw fsync {report['raw_fsync_mb_per_s']:.1f} MB/s")


def _print_text(report: dict) -> None:
    """A readable summary: per Java variant, both sides' throughput and half-load p99 and their ratios."""
    _print_heading(report["scenario"], report)
    for run in report["runs"]:
        ours, java = run["ours"], run["java_figures"]
        print(f"  vs {run['java']:>9}: {ours['full_entries_per_s']:9.0f} vs {java['full_entries_per_s']:9.0f} "
              f"entries/s ({run['throughput_ours_over_java']:.2f}x), half p99 {ours['half_p99_ms']:.2f} vs "
              f"{java['half_p99_ms']:.2f} ms")


def _print_matrix_text(report: dict) -> None:
    """A readable summary: per cell, adds/s, half-load p50/p99 and CPU per entry, and the ratios to Java's side."""
    _print_heading(report["matrix"], report)
    for measured in report["cells"]:
        figures = measured["figures"]
        print(f"  {measured['client']:>9} on {measured['bookie']:<9}: {figures['full_entries_per_s']:9.0f} adds/s, "
              f"half p50/p99 {figures['half_p50_ms']:.2f}/{figures['half_p99_ms']:.2f} ms, CPU per entry bookies "
              f"{figures['full_bookies_cpu_us_per_entry']:.1f} client {figures['full_client_cpu_us_per_entry']:.1f} µs")
        if figures.get("half_bookie_adds"):
            print("    half load, our bookies' own p99/longest (≤ bucket): add " + _upper_bounds(figures, "bookie_add")
                  + ", journal sync " + _upper_bounds(figures, "journal_sync") + ", loop lag "
                  + _upper_bounds(figures, "bookie_loop_lag") + ", flush " + _upper_bounds(figures, "flush")
                  + ", memtable wait " + _upper_bounds(figures, "memtable_wait") + " ms in "
                  + ", ".join(map(str, figures["half_memtable_waits"])) + " held batches; run-queue wait ms/s "
                  + ", ".join(f"{name} {wait:.0f}" for name, wait in figures["half_run_queue_wait_ms_per_s"].items()))
        over = measured.get("bookfleet_bookie_over_java_bookie") or measured.get("bookfleet_client_over_java_client")
        for against, ratio in (over or {}).items():
            print(f"    over {against}: " + ", ".join(f"{name} {value:.2f}x" for name, value in ratio.items()))


def _upper_bounds(figures: dict, histogram: str) -> str:
    return ", ".join(f"{p99:g}/{longest:g}" for p99, longest in zip(
        figures[f"half_{histogram}_p99_ms_upper"], figures[f"half_{histogram}_max_ms_upper"], strict=True
    ))
