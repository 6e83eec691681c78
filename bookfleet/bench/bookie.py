"""`bookfleet bench bookie`: add throughput and latency of one real bookie process, next to raw fsync bandwidth.

The bookie runs as its own process (temp dirs, embedded ZooKeeper, fsync'd journal) exactly as `bookfleet bookie`
would; the load comes from pipelined BookieClient connections, several adds in flight on each. The raw baseline is
write+fdatasync of blocks of the entry size in the same temp dir, measured in the same run before the load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

from bookfleet import wire
from bookfleet.bench.baseline import percentile, raw_fsync_bandwidth
from bookfleet.cli import CommandError
from bookfleet.client.connection import BookieClient
from bookfleet.fleet import BookieProcess
from bookfleet.zkserver import ZooKeeperServer


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
    parser.add_argument("--dir", type=Path, help="where the bookie's dirs go (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=handle)


async def _load(address: str, entry_size: int, seconds: float, connections: int, in_flight: int) -> dict:
    digester = wire.Digester(wire.DigestType.CRC32C)
    key = wire.master_key(b"bench")
    payload = os.urandom(entry_size)
    latencies: list[float] = []
    clients = [await BookieClient.connect(address) for _ in range(connections)]
    deadline = 0.0

    async def worker(client: BookieClient, ledger_id: int, next_ids: list[int]) -> None:
        record = latencies.append
        clock = time.perf_counter
        while (started := clock()) < deadline:
            entry_id = next_ids[0]
            next_ids[0] += 1
            entry = wire.encode_entry(digester, ledger_id, entry_id, entry_id - 1, (entry_id + 1) * entry_size, payload)
            await client.add_entry(key, entry)
            record(clock() - started)

    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    await asyncio.gather(
        *(worker(client, n + 1, ids) for n, client in enumerate(clients) for ids in [[0]] for _ in range(in_flight))
    )
    elapsed = time.perf_counter() - started
    for client in clients:
        await client.close()
    latencies.sort()
    return {
        "entries": len(latencies),
        "entries_per_s": len(latencies) / elapsed,
        "mb_per_s": len(latencies) * entry_size / elapsed / 1e6,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def _bookie_flags(args: argparse.Namespace) -> dict[str, str]:
    flags = {}
    for flag in args.bookie_flag:
        name, sep, value = flag.partition("=")
        if not sep:
            raise CommandError(f"--bookie-flag {flag!r} is not NAME=VALUE")
        flags[name.removeprefix("--").replace("-", "_")] = value
    return flags


def handle(args: argparse.Namespace) -> int:
    # Enough in flight to fill big journal batches; more would only add queueing delay to the latency figures.
    args.in_flight = args.in_flight or max(16, min(256, (4 << 20) // args.entry_size))
    with tempfile.TemporaryDirectory(prefix="bench-bookie-", dir=args.dir) as tmp:
        root = Path(tmp)
        baseline = raw_fsync_bandwidth(root, args.entry_size)
        with ZooKeeperServer(root / "zookeeper") as zookeeper:
            bookie = BookieProcess(
                "bench-bookie", zookeeper.connect, root / "bookie", log_level="WARNING", **_bookie_flags(args)
            )
            try:
                bookie.start().wait_ready()
                result = asyncio.run(
                    _load(bookie.address, args.entry_size, args.seconds, args.connections, args.in_flight)
                )
            finally:
                bookie.stop()
    report = {
        "entry_size": args.entry_size,
        "seconds": args.seconds,
        "connections": args.connections,
        "in_flight": args.connections * args.in_flight,
        "bookie_flags": args.bookie_flag,
        **result,
        **baseline,
        "fraction_of_raw_fsync": result["mb_per_s"] / baseline["raw_fsync_mb_per_s"],
    }
    if args.json:
        print(json.dumps(report))
    else:
        for name, value in report.items():
            print(f"{name:>24}: {value:.3f}" if isinstance(value, float) else f"{name:>24}: {value}")
    return 0
