"""`bookfleet bench bookie`: add throughput and latency of one real bookie process, next to raw fsync bandwidth.

The bookie runs as its own process (temp dirs, embedded ZooKeeper, fsync'd journal) exactly as `bookfleet bookie`
would; the load comes from pipelined BookieClient connections, several adds in flight on each, each ack sending the
next add from its callback (the ledger writer's path: no task or future per add, since the load generator must not be
the bottleneck; its CPU per entry is reported next to the bookie's). The raw baseline is
write+fdatasync of blocks of the entry size in the same temp dir, measured in the same run before the load.
The ledgers are created in ZooKeeper first, as a bookie only takes ledgers that exist there. With `--tls` a second
bookie serving mutual TLS takes the same load right after, and its figures are reported next to the plain ones.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from bookfleet import bkwire, eventloop, wire
from bookfleet.bench.baseline import (
    add_event_loop_argument,
    chosen_event_loop,
    in_loop_iterations,
    latency_samples,
    load_summary,
    print_report,
    same_run_baselines,
    tls_figures,
)
from bookfleet.client.connection import BookieClient, next_txn
from bookfleet.commanderror import CommandError
from bookfleet.fleet import LOOPBACK_NAMES, BookieProcess
from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import MetadataStore, new_metadata
from bookfleet.security.certs import CertificateAuthority, write_tls_dir
from bookfleet.security.roles import Role
from bookfleet.security.tls import ReloadingContext, client_context
from bookfleet.zkserver import ZooKeeperServer


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def register(subparsers) -> None:
    parser = subparsers.add_parser("bookie", help="ADD_ENTRY throughput and latency of one bookie process")
    parser.add_argument("--entry-size", type=int, default=1024, help="payload bytes per entry (default 1024)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the measured load (default 10)")
    parser.add_argument("--connections", type=int, default=4, help="client connections, one ledger each")
    parser.add_argument(
        "--in-flight", type=int, help="adds in flight per connection (default: about 4 MiB worth, 16 to 256)"
    )
    parser.add_argument(
        "--bookie-flag", action="append", default=[], metavar="NAME=VALUE",
        help="pass --NAME VALUE to the bookie, e.g. journal-max-wait=0 (repeatable)",
    )
    parser.add_argument("--tls", action="store_true", help="also measure a bookie serving mutual TLS, same run")
    add_event_loop_argument(parser)
    parser.add_argument("--dir", type=Path, help="where the bookie's dirs go (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=handle)


async def _load(
    address: str,
    bookie_pid: int,
    ledger_ids: list[int],
    entry_size: int,
    seconds: float,
    in_flight: int,
    tls: ReloadingContext | None,
) -> dict:
    digester = wire.Digester(wire.DigestType.CRC32C)
    key = wire.master_key(b"bench")
    requests = {ledger_id: bkwire.AddRequestEncoder(ledger_id, key, 0) for ledger_id in ledger_ids}
    entry_size_encoded = wire.ENTRY_HEADER.size + digester.size + entry_size
    payload = os.urandom(entry_size)
    latencies = latency_samples()
    record = latencies.append
    clock = time.perf_counter
    clients = [await BookieClient.connect(address, tls=tls) for _ in ledger_ids]
    done = asyncio.get_running_loop().create_future()
    open_slots = len(ledger_ids) * in_flight
    deadline = 0.0

    def add(client: BookieClient, ledger_id: int, next_ids: list[int]) -> None:
        entry_id = next_ids[0]
        next_ids[0] += 1
        length = (entry_id + 1) * entry_size
        txn = next_txn()
        head = requests[ledger_id].frame_head(txn, entry_id, entry_size_encoded)
        body = wire.encode_entry(digester, ledger_id, entry_id, entry_id - 1, length, payload, head)
        client.add_entry_callback(body, txn, acked, (clock(), client, ledger_id, next_ids))

    def acked(sent: tuple[float, BookieClient, int, list[int]], error: BaseException | None) -> None:
        nonlocal open_slots
        started, *slot = sent
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
            return
        now = clock()
        record(now - started)
        if now < deadline:
            add(*slot)
            return
        open_slots -= 1
        if not open_slots:
            done.set_result(None)

    deadline = clock() + seconds
    started = clock()
    client_cpu, bookie_cpu = time.process_time(), _cpu_seconds(bookie_pid)
    for ledger_id, client in zip(ledger_ids, clients, strict=True):
        next_ids = [0]
        for _ in range(in_flight):
            add(client, ledger_id, next_ids)
    await done
    elapsed = time.perf_counter() - started
    client_cpu, bookie_cpu = time.process_time() - client_cpu, _cpu_seconds(bookie_pid) - bookie_cpu
    for client in clients:
        await client.close()
    return {
        **load_summary(latencies, elapsed, entry_size),
        "bookie_cpu_us_per_entry": bookie_cpu / len(latencies) * 1e6,
        "client_cpu_us_per_entry": client_cpu / len(latencies) * 1e6,
    }


def _bookie_flags(args: argparse.Namespace) -> dict[str, str]:
    flags = {}
    for flag in args.bookie_flag:
        name, sep, value = flag.partition("=")
        if not sep:
            raise CommandError(f"--bookie-flag {flag!r} is not NAME=VALUE")
        flags[name.removeprefix("--").replace("-", "_")] = value
    return flags


def _measure(
    zk: str, bookie_id: str, directory: Path, args: argparse.Namespace, ca: CertificateAuthority | None = None
) -> dict:
    """One bookie process under the load; with `ca`, it serves mutual TLS and the load presents a client certificate."""
    flags: dict[str, object] = {"event_loop": args.event_loop, **_bookie_flags(args)}
    tls = None
    if ca is not None:
        flags["tls_dir"] = write_tls_dir(directory / "tls", ca.issue(bookie_id, [Role.BOOKIE], LOOPBACK_NAMES))
        tls = client_context(write_tls_dir(directory / "client", ca.issue("bench", [Role.CLIENT])))
    bookie = BookieProcess(bookie_id, zk, directory, log_level="WARNING", **flags)
    with zkclient.session(zk) as session:
        store = MetadataStore(session)
        ledger_ids = [store.create(new_metadata([bookie.bookie_id], 1, 1)) for _ in range(args.connections)]
    try:
        bookie.start().wait_ready()
        load = _load(bookie.address, bookie.process.pid, ledger_ids, args.entry_size, args.seconds, args.in_flight, tls)
        return eventloop.run(load, args.event_loop)
    finally:
        bookie.stop()


def handle(args: argparse.Namespace) -> int:
    loop_name = chosen_event_loop(args.event_loop)
    # Enough in flight to fill big journal batches; more would only add queueing delay to the latency figures.
    args.in_flight = args.in_flight or max(16, min(256, (4 << 20) // args.entry_size))
    with tempfile.TemporaryDirectory(prefix="bench-bookie-", dir=args.dir) as tmp:
        root = Path(tmp)
        baseline = same_run_baselines(root, args.entry_size)
        with ZooKeeperServer(root / "zookeeper") as zookeeper:
            result = _measure(zookeeper.connect, "bench-bookie", root / "bookie", args)
            secure = None
            if args.tls:
                ca = CertificateAuthority.create()
                secure = _measure(zookeeper.connect, "bench-tls-bookie", root / "tls", args, ca)
    report = {
        "entry_size": args.entry_size,
        "seconds": args.seconds,
        "connections": args.connections,
        "in_flight": args.connections * args.in_flight,
        "bookie_flags": args.bookie_flag,
        "event_loop": loop_name,
        **result,
        **baseline,
        "fraction_of_raw_fsync": result["mb_per_s"] / baseline["raw_fsync_mb_per_s"],
        "fraction_of_sequential_fsync": result["mb_per_s"] / baseline["sequential_fsync_mb_per_s"],
        "bookie_cpu_per_entry_loop_iterations": in_loop_iterations(result["bookie_cpu_us_per_entry"], baseline),
        "client_cpu_per_entry_loop_iterations": in_loop_iterations(result["client_cpu_us_per_entry"], baseline),
    }
    if secure is not None:
        report.update(tls_figures(result, secure, "", ("bookie", "client")))
    print_report(report, args.json)
    return 0
