"""`bookfleet bench repair`: restore a lost bookie's replicas and report MB/s, ledgers/min and time to full
replication, next to the same-run raw fsync baseline.

The scenario helpers (`fill_ledgers`, `verify_replicas`) are also what `bookfleet demo` and the repair tests use:
write ledgers whose payload digests are remembered, then check every replica on every bookie its segment names.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bookfleet import wire
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.connection import BookieClient, BookieError
from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import MetadataStore
from bookfleet.meta.registry import BookieRegistry
from bookfleet.replication.repair import Reply
from bookfleet.replication.replicacheck import ALL, ReplicaRange, entries_to_check, read_copies, verdict
from bookfleet.zkserver import four_letter_word

WRITES_IN_FLIGHT = 256
LEDGERS_IN_FLIGHT = 8
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class LedgerShape:
    ensemble_size: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    digest_type: wire.DigestType = wire.DigestType.CRC32C
    password: bytes = b""


async def fill_ledgers(
    zk: str, ledgers: int, entries: int, entry_size: int, shape: LedgerShape = LedgerShape(),
    on_ledger: Callable[[int], None] | None = None,
) -> dict[int, list[bytes]]:
    """Write and close `ledgers` ledgers; returns ledger id -> the sha256 of each entry's payload."""
    expected: dict[int, list[bytes]] = {}
    slots = asyncio.Semaphore(LEDGERS_IN_FLIGHT)

    async def one(bookkeeper: BookKeeper) -> None:
        async with slots:
            writer = await bookkeeper.create_ledger(
                shape.ensemble_size, shape.write_quorum, shape.ack_quorum, shape.digest_type, shape.password
            )
            block = os.urandom(entry_size + entries)
            payloads = [block[i : i + entry_size] for i in range(entries)]
            for start in range(0, entries, WRITES_IN_FLIGHT):
                await asyncio.gather(*(writer.append(p) for p in payloads[start : start + WRITES_IN_FLIGHT]))
            await writer.close()
            expected[writer.ledger_id] = [hashlib.sha256(p).digest() for p in payloads]
            if on_ledger:
                on_ledger(writer.ledger_id)

    async with BookKeeper(zk) as bookkeeper:
        await asyncio.gather(*(one(bookkeeper) for _ in range(ledgers)))
    return expected


def payload_digest(digester: wire.Digester, raw: bytes) -> bytes:
    """The sha256 of an encoded entry's payload, as `fill_ledgers` remembers it."""
    return hashlib.sha256(wire.decode_entry(digester, raw).payload).digest()


async def verify_replicas(
    zk: str, expected: dict[int, list[bytes]], skip: dict[int, set[int]] | None = None
) -> list[str]:
    """Problems found: every entry must sit, byte-identical, on each of the Qw bookies its segment names.

    Reads each replica directly from its bookie (not through a quorum reader, which would hide a missing copy).
    `skip` names entries known to be lost.
    """
    skip = skip or {}
    problems: list[str] = []
    with zkclient.session(zk) as client:
        store = MetadataStore(client)
        addresses = {info.bookie_id: info.address for info in BookieRegistry(client).all()}
        metadata = {ledger_id: store.read(ledger_id)[0] for ledger_id in expected}
    clients: dict[str, BookieClient] = {}
    slots = asyncio.Semaphore(32)

    async def check(ledger_id: int, replica: ReplicaRange, bookie: str, digester: wire.Digester) -> None:
        wanted = entries_to_check(replica, ALL, frozenset(skip.get(ledger_id, ())))
        if not wanted:
            return
        if bookie not in addresses:
            problems.append(f"ledger {ledger_id}: bookie {bookie} of segment {replica.segment_index} is not registered")
            return
        async with slots:
            if bookie not in clients:
                clients[bookie] = await BookieClient.connect(addresses[bookie], bookie_id=bookie)
            try:
                copies = await read_copies(clients[bookie], ledger_id, wanted, whole_range=True)
            except BookieError as exc:
                copies = {}
                problems.append(f"ledger {ledger_id}: bookie {bookie}: {exc}")
        for entry_id in wanted:
            raw = copies.get(entry_id)
            reply = verdict(raw, ledger_id, entry_id, digester)
            if reply is Reply.HAS and payload_digest(digester, raw) == expected[ledger_id][entry_id]:
                continue
            state = "is missing" if reply is Reply.LACKS else "differs"
            problems.append(f"ledger {ledger_id} entry {entry_id} {state} on bookie {bookie}")

    checks = []
    for ledger_id, meta in metadata.items():
        if meta.last_entry_id + 1 != len(expected[ledger_id]):
            problems.append(f"ledger {ledger_id}: last entry {meta.last_entry_id}, wrote {len(expected[ledger_id])}")
        digester = wire.Digester(meta.digest_type, meta.password)
        for fragment in meta.fragments():
            if fragment.last_entry_id is None:
                continue
            for position, bookie in enumerate(fragment.bookies):
                replica = ReplicaRange.of_fragment(ledger_id, fragment, position, meta.write_quorum)
                checks.append(check(ledger_id, replica, bookie, digester))
    try:
        await asyncio.gather(*checks)
    finally:
        for bookie_client in clients.values():
            await bookie_client.close()
    return problems


@dataclass(frozen=True, slots=True)
class ProcessCpu:
    parent: int
    command: str
    seconds: float


def process_tree_cpu() -> dict[int, ProcessCpu]:
    """CPU used so far by this process and each of its descendants (Linux /proc), by pid.

    A descendant's figure includes the children it reaped (Spark's Python daemon reaps its workers); this
    process's does not, so a bookie killed by the bench is counted nowhere once it is gone."""
    processes: dict[int, ProcessCpu] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, _, tail = stat.read_text().rpartition(")")
        except OSError:
            continue  # exited meanwhile
        fields = tail.split()
        own = 2 if int(stat.parent.name) == os.getpid() else 4  # utime, stime (, cutime, cstime)
        seconds = sum(map(int, fields[11 : 11 + own])) / CLOCK_TICKS
        processes[int(stat.parent.name)] = ProcessCpu(int(fields[1]), head.partition("(")[2], seconds)
    tree: dict[int, ProcessCpu] = {}
    parents = {os.getpid()}
    while parents:
        tree |= {pid: processes[pid] for pid in parents if pid in processes}
        parents = {pid for pid, process in processes.items() if process.parent in parents and pid not in tree}
    return tree


def cpu_by_role(before: dict[int, ProcessCpu], after: dict[int, ProcessCpu], roles: dict[int, str]) -> dict:
    """CPU seconds spent between two `process_tree_cpu` snapshots, per role: `roles` names some pids (and their
    descendants), this process is the driver, any other descendant is Spark's: its JVM or its Python workers."""

    def role(pid: int) -> str:
        if pid == os.getpid():
            return "driver"
        top = pid
        while top not in roles and after[top].parent in after and after[top].parent != os.getpid():
            top = after[top].parent
        return roles.get(top, "spark_jvm" if after[pid].command == "java" else "spark_python")

    spent: dict[str, float] = {}
    for pid, process in after.items():
        earlier = before.get(pid)
        spent[role(pid)] = spent.get(role(pid), 0.0) + process.seconds - (earlier.seconds if earlier else 0.0)
    return spent


def zookeeper_requests(port: int) -> int:
    """Packets the ZooKeeper server has received so far (every request and ping of every client)."""
    answer = four_letter_word(port, "srvr")
    return int(next(line for line in answer.splitlines() if line.startswith("Received:")).split(":")[1])


def register(benches) -> None:
    parser = benches.add_parser("repair", help="restore a killed bookie's replicas with the Spark repair job")
    parser.add_argument("--ledgers", type=int, default=1000)
    parser.add_argument("--entries", type=int, default=100, help="entries per ledger")
    parser.add_argument("--entry-size", type=int, default=1024, help="payload bytes per entry")
    parser.add_argument("--bookies", type=int, default=4, help="bookies before the kill (at least 4)")
    parser.add_argument("--write-quorum", type=int, default=2, help="Qw of the E=3 ledgers (2 or 3)")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--throttle-mb-s", type=float, help="repair throttle")
    parser.add_argument("--no-verify", action="store_true", help="skip checking every replica afterwards")
    parser.add_argument("--cold-spark", action="store_true",
                        help="repair on a session that has run no job yet (default: warmed up, as the runner's)")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.set_defaults(handler=run_bench)


def run_bench(args) -> int:
    import json

    result = measure(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0 if not result["failures"] and not result["replica_problems"] else 1


def measure(args) -> dict:
    """One loss and its repair (also the `bench bookkeeper --recovery` side of ours): the report's figures."""
    import tempfile
    import time

    from bookfleet import spark as sparksettings
    from bookfleet.bench.baseline import in_loop_iterations, same_run_baselines
    from bookfleet.commanderror import CommandError
    from bookfleet.fleet import BookieFleet
    from bookfleet.replication.auditor import mark_lost_bookie
    from bookfleet.replication.spark_repair import run_repair
    from bookfleet.zkserver import ZooKeeperServer

    if args.bookies < 4 or min(args.ledgers, args.entries, args.entry_size) < 1 or args.write_quorum not in (2, 3):
        raise CommandError("need --bookies >= 4, positive --ledgers/--entries/--entry-size and --write-quorum 2 or 3")
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, flush=True))
    with tempfile.TemporaryDirectory(prefix="bench-repair-") as scratch:
        root = Path(scratch)
        baseline = same_run_baselines(root, args.entry_size)
        with ZooKeeperServer(root / "zookeeper") as server, BookieFleet(server.connect, root / "bookies") as fleet:
            bookies = fleet.start(args.bookies)
            spark = sparksettings.session(args.master, app_name="bookfleet-repair")  # JVM start is not repair time
            if not args.cold_spark:
                sparksettings.warm_up(spark)  # as the standalone runner's session is when a loss comes
            say(f"writing {args.ledgers} ledgers x {args.entries} x {args.entry_size} B")
            started = time.monotonic()
            shape = LedgerShape(3, args.write_quorum, 2)
            expected = asyncio.run(fill_ledgers(server.connect, args.ledgers, args.entries, args.entry_size, shape))
            write_seconds = time.monotonic() - started
            victim = bookies[0]
            say(f"killing {victim.bookie_id}; repairing")
            roles = {bookie.process.pid: "bookies" for bookie in bookies[1:]} | {server.process.pid: "zookeeper"}
            with zkclient.session(server.connect) as client:
                lost_at = time.monotonic()
                victim.kill9()
                cpu_before, requests_before = process_tree_cpu(), zookeeper_requests(server.port)
                marked = mark_lost_bookie(client, victim.bookie_id)
                summary = run_repair(server.connect, master=args.master, throttle_mb_s=args.throttle_mb_s)
                recovered = time.monotonic() - lost_at
                cpu = cpu_by_role(cpu_before, process_tree_cpu(), roles)
                requests = zookeeper_requests(server.port) - requests_before
            problems = [] if args.no_verify else asyncio.run(verify_replicas(server.connect, expected))
    entries = max(1, summary.entries)
    result = {
        "bench": "repair",
        "ledgers": args.ledgers,
        "entries_per_ledger": args.entries,
        "entry_size": args.entry_size,
        "ensemble": [3, args.write_quorum, 2],
        "master": args.master,
        "spark_session": "cold" if args.cold_spark else "warmed up",
        "bookies": args.bookies,
        "data_written_mb": round(sum(map(len, expected.values())) * args.entry_size / 1e6, 1),
        "write_seconds": round(write_seconds, 2),
        "ledgers_marked": len(marked),
        "ledgers_repaired": summary.ledgers,
        "entries_restored": summary.entries,
        "mb_restored": round(summary.bytes / 1e6, 2),
        "repair_seconds": round(summary.seconds, 2),
        "mb_per_s": round(summary.bytes / 1e6 / summary.seconds, 2),
        "ledgers_per_min": round(summary.ledgers / summary.seconds * 60),
        "seconds_loss_to_full_replication": round(recovered, 2),
        "cpu_us_per_entry": round(sum(cpu.values()) / entries * 1e6, 1),
        "cpu_us_per_entry_by_process": {name: round(cpu[name] / entries * 1e6, 1) for name in sorted(cpu)},
        "cpu_per_entry_loop_iterations": round(in_loop_iterations(sum(cpu.values()) / entries * 1e6, baseline)),
        "zookeeper_requests_per_ledger": round(requests / max(1, summary.ledgers), 1),
        "failures": len(summary.failures),
        "replica_problems": len(problems),
        "verified": not args.no_verify,
        "baseline": {key: round(value, 3) for key, value in baseline.items()},
    }
    return result
