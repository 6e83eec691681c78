"""`bookfleet bench silent-bookie`: how long a writer takes to replace a connected bookie that stops answering, and
what it holds for that bookie meanwhile.

An embedded ZooKeeper and E+1 bookie processes start in a temp dir. Each round a new ledger takes paced adds; one of
its bookies is frozen (SIGSTOP: connected, silent) and the time until the writer's metadata names a replacement is
taken, with the most the writer held for lagging bookies (`LedgerWriter.lagging_bytes`, bounded by
`max_lagging_bytes`). The target is `add_timeout` + 1 s. Same-run baseline: the same rounds with the bookie killed
(SIGKILL: its connection resets at once), the cost of noticing a plain failure and changing the ensemble.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from bookfleet.bench import baseline
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.writer import WriterSettings
from bookfleet.commanderror import CommandError
from bookfleet.fleet import BookieFleet, BookieProcess
from bookfleet.zkserver import ZooKeeperServer


def register(subparsers) -> None:
    parser = subparsers.add_parser("silent-bookie", help="time to replace a bookie that stops answering")
    parser.add_argument("--rounds", type=int, default=5, help="bookies frozen, and killed, one per round (default 5)")
    parser.add_argument("--add-timeout", type=float, default=10.0, help="the writer's add_timeout (default 10)")
    parser.add_argument("--rate", type=float, default=1000.0, help="adds a second during a round (default 1000)")
    parser.add_argument("--entry-size", type=int, default=1024, help="payload bytes per entry (default 1024)")
    parser.add_argument("--dir", type=Path, help="where ZooKeeper and the bookies keep data (default: temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=handle)


async def _round(bk: BookKeeper, bookies: dict[str, BookieProcess], args: argparse.Namespace, freeze: bool) -> dict:
    """One ledger under paced adds; its second bookie frozen (or killed) once adds flow: (seconds, held bytes)."""
    writer = await bk.create_ledger(3, 3, 2)
    payload, errors = os.urandom(args.entry_size), []
    victim = bookies[writer.metadata.segments[0].bookies[1]]
    held, stopped_at = 0, None
    start = time.monotonic()
    issued = 0
    while len(writer.metadata.segments) == 1 and not errors:
        now = time.monotonic()
        if stopped_at is None and now - start > 1.0:
            os.kill(victim.process.pid, signal.SIGSTOP if freeze else signal.SIGKILL)
            stopped_at = now
        due = int((now - start) * args.rate) - issued
        for _ in range(due):
            writer.append_callback(payload, lambda _id, error: error is None or errors.append(error))
        issued += due
        held = max(held, writer.lagging_bytes)
        await asyncio.sleep(0.001)
    replaced_after = time.monotonic() - stopped_at
    if freeze:
        os.kill(victim.process.pid, signal.SIGCONT)
    await writer.close()
    if errors:
        raise CommandError(f"the writer failed instead of replacing {victim.bookie_id}: {errors[0]}")
    if not freeze:  # reaped first: a SIGKILLed process can still be exiting when the writer has replaced it
        await asyncio.to_thread(lambda: (victim.process.wait(), victim.start().wait_ready(120)))
    return {"seconds": replaced_after, "held_bytes": held}


async def _run(zk: str, bookies: list[BookieProcess], args: argparse.Namespace) -> dict:
    by_id = {bookie.bookie_id: bookie for bookie in bookies}
    settings = WriterSettings(add_timeout=args.add_timeout)
    result: dict[str, float] = {}
    async with BookKeeper(zk, settings) as bk:
        for name, freeze in (("silent", True), ("killed", False)):
            rounds = [await _round(bk, by_id, args, freeze) for _ in range(args.rounds)]
            seconds = [r["seconds"] for r in rounds]
            result[f"{name}_replaced_after_s_median"] = statistics.median(seconds)
            result[f"{name}_replaced_after_s_max"] = max(seconds)
            result[f"{name}_held_bytes_max"] = max(r["held_bytes"] for r in rounds)
    result["target_s"] = args.add_timeout + 1.0
    result["max_lagging_bytes"] = settings.max_lagging_bytes
    return result


def handle(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.add_timeout <= 0 or args.rate <= 0 or args.entry_size < 0:
        raise CommandError("--rounds must be at least 1, --add-timeout and --rate positive, --entry-size >= 0")
    with tempfile.TemporaryDirectory(prefix="bench-silent-", dir=args.dir) as tmp:
        root = Path(tmp)
        with ZooKeeperServer(root / "zookeeper") as zookeeper, BookieFleet(zookeeper.connect, root / "b") as fleet:
            bookies = fleet.start(4, log_level="WARNING")
            result = asyncio.run(_run(zookeeper.connect, bookies, args))
            fleet.stop()
    report = {"rounds": args.rounds, "add_timeout": args.add_timeout, "rate": args.rate,
              "entry_size": args.entry_size, **result}
    baseline.print_report(report, args.json)
    return 0
