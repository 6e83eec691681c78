"""`bookfleet bench bookkeeper`: our client and bookies side by side with Apache BookKeeper's, same run, same disk.

Absolute figures do not travel between machines; a ratio against the reference does. Each scenario measures our
side exactly as `bookfleet bench client` does (one writer, `--in-flight` adds pipelined for `--seconds`, then half
that rate, paced per millisecond), then the Java side doing the same through BookKeeper's own client against Java
bookies (hack/bookkeeper-bench, built into ~/.cache/bookfleet/bookkeeper-<v>/ by scripts/build-bookkeeper.sh),
alternating ours, Java, ours, Java: one pair per Java variant (ledger storage x wire protocol), each ratio taken
against the run of ours just before it. Latency percentiles are true ones on both sides (every sample sorted here,
HdrHistogram there). Every line carries the same-run disk and CPU baselines and the Java settings used.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bookfleet import spark as sparksettings
from bookfleet.bench import baseline, client, repair
from bookfleet.commanderror import CommandError
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
    )
}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bookkeeper", help="our client and bookies against Apache BookKeeper's Java ones (development; needs Java)"
    )
    parser.add_argument(
        "--scenario", action="append", choices=list(SCENARIOS),
        help="one-bookie (E=Qw=Qa=1, 1 KiB), e3 (3 bookies E3/Qw3/Qa2, 1 KiB), one-bookie-64k (repeatable; "
        "default all)",
    )
    parser.add_argument("--storage", action="append", choices=list(STORAGE_CLASSES),
                        help="Java ledger storage (repeatable; default db and sorted)")
    parser.add_argument("--protocol", action="append", choices=PROTOCOLS,
                        help="Java client wire protocol (repeatable; default v2 and v3)")
    parser.add_argument(
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
        bookies = [self._start_bookie(run / f"bookie-{index}", root, storage)[0] for index in range(scenario.bookies)]
        try:
            options = {
                "ensemble": scenario.ensemble, "write_quorum": scenario.write_quorum,
                "ack_quorum": scenario.ack_quorum, "entry_size": scenario.entry_size,
                "in_flight": scenario.in_flight, "seconds": seconds, "warmup": warmup, "protocol": protocol,
                "bookie_pids": ",".join(str(bookie.pid) for bookie in bookies),
            }
            load = subprocess.run(
                self._java(CLIENT_JVM, "BookKeeperBench", "load", self.zk, root,
                           *(f"{name}={value}" for name, value in options.items())),
                capture_output=True, text=True, timeout=seconds * 4 + warmup + 180,
            )
        finally:
            self._stop(bookies)
        return self._figures(load, run)

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
        return self._figures(load, run)

    @staticmethod
    def _stop(bookies: list[subprocess.Popen]) -> None:
        for bookie in bookies:
            bookie.terminate()
        for bookie in bookies:
            bookie.wait(timeout=60)

    @staticmethod
    def _figures(load: subprocess.CompletedProcess, run: Path) -> dict:
        if load.returncode != 0:
            logs = "".join(path.read_text()[-2000:] for path in run.glob("bookie-*/bookie.log"))
            raise CommandError(f"the Java side failed:\n{load.stderr[-3000:]}\n{logs}")
        return json.loads(load.stdout.strip().splitlines()[-1])

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


def _ours(zk: str, directory: Path, scenario: Scenario, args: argparse.Namespace) -> dict:
    """`bookfleet bench client`'s loads on a fleet of our bookies of its own."""
    settings = argparse.Namespace(
        bookies=scenario.bookies, ensemble=scenario.ensemble, write_quorum=scenario.write_quorum,
        ack_quorum=scenario.ack_quorum, entry_size=scenario.entry_size, seconds=args.seconds,
        in_flight=scenario.in_flight, event_loop=args.event_loop,
    )
    return client._measure(zk, directory, settings)


RATIOS = {
    # name: (figure, True when higher is better for us)
    "throughput": ("full_entries_per_s", True),
    "half_p50": ("half_p50_ms", False),
    "half_p99": ("half_p99_ms", False),
    "half_p999": ("half_p999_ms", False),
    "bookies_cpu_per_entry": ("full_bookies_cpu_us_per_entry", False),
    "client_cpu_per_entry": ("full_client_cpu_us_per_entry", False),
}


def ratios(ours: dict, java: dict) -> dict[str, float]:
    """Ours over Java for each compared figure (throughput > 1 and latency or CPU < 1 mean ours is better)."""
    return {f"{name}_ours_over_java": ours[figure] / java[figure] for name, (figure, _) in RATIOS.items()}


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
        "bookies": scenario.bookies,
        "ensemble": scenario.ensemble,
        "write_quorum": scenario.write_quorum,
        "ack_quorum": scenario.ack_quorum,
        "entry_size": scenario.entry_size,
        "in_flight": scenario.in_flight,
        "seconds": args.seconds,
        "java_warmup_seconds": args.warmup,
        "event_loop": loop_name,
        "order": "ours, java per pair; pairs in the order listed",
        "runs": runs,
        **baselines,
        "java_bookie_jvm": " ".join(BOOKIE_JVM),
        "java_client_jvm": " ".join(CLIENT_JVM),
        "java_bookie_settings": BOOKIE_SETTINGS,
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
    args.storage = args.storage or list(STORAGE_CLASSES)
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
            for name in args.scenario or list(SCENARIOS):
                report = _scenario_report(SCENARIOS[name], java, zookeeper.connect, root, args, loop_name)
                if args.json:
                    print(json.dumps(report), flush=True)
                else:
                    _print_text(report)
    return 0


def _print_text(report: dict) -> None:
    """A readable summary: per Java variant, both sides' throughput and half-load p99 and their ratios."""
    print(f"{report['scenario']}: {report['entry_size']} B, E{report['ensemble']}/Qw{report['write_quorum']}/"
          f"Qa{report['ack_quorum']}, raw fsync {report['raw_fsync_mb_per_s']:.1f} MB/s")
    for run in report["runs"]:
        ours, java = run["ours"], run["java_figures"]
        print(f"  vs {run['java']:>9}: {ours['full_entries_per_s']:9.0f} vs {java['full_entries_per_s']:9.0f} "
              f"entries/s ({run['throughput_ours_over_java']:.2f}x), half p99 {ours['half_p99_ms']:.2f} vs "
              f"{java['half_p99_ms']:.2f} ms")

