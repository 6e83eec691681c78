"""`bookfleet bench client`: ledger add throughput and latency through the real client and real bookie processes.

An embedded ZooKeeper and N bookie processes start in a temp dir; one `LedgerWriter` keeps `--in-flight` adds
pipelined for `--seconds` (full load), then adds at half the rate it reached (latency when not saturated); the
client's own CPU per entry shows how much of the machine the bookies had left. The raw
write+fdatasync baseline of blocks of the entry size is measured in the same dir, in the same run, before the load.
With `--tls` a second fleet serving mutual TLS takes the same loads right after, reported next to the plain one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from array import array
from functools import partial
from pathlib import Path

from bookfleet import eventloop
from bookfleet.bench import baseline
from bookfleet.bench.bookie import _cpu_seconds
from bookfleet.bench.latency_profile import GcPauses, LatencyProfile, client_figures
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.writer import LedgerWriter
from bookfleet.commanderror import CommandError
from bookfleet.fleet import BookieFleet
from bookfleet.security.certs import CertificateAuthority, write_tls_dir
from bookfleet.security.roles import Role
from bookfleet.security.tls import use_client_tls
from bookfleet.zkserver import ZooKeeperServer


def register(subparsers) -> None:
    parser = subparsers.add_parser("client", help="ledger add throughput and latency through the client")
    parser.add_argument("--bookies", type=int, default=3, help="bookie processes (default 3)")
    parser.add_argument("-e", "--ensemble", type=int, default=3, help="ensemble size E (default 3)")
    parser.add_argument("-w", "--write-quorum", type=int, default=3, help="write quorum Qw (default 3)")
    parser.add_argument("-a", "--ack-quorum", type=int, default=2, help="ack quorum Qa (default 2)")
    parser.add_argument("--entry-size", type=int, default=1024, help="payload bytes per entry (default 1024)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each load phase (default 10)")
    parser.add_argument("--in-flight", type=int, default=2000, help="adds in flight at full load (default 2000)")
    parser.add_argument("--tls", action="store_true", help="also measure a fleet serving mutual TLS, same run")
    baseline.add_event_loop_argument(parser)
    parser.add_argument("--dir", type=Path, help="where ZooKeeper and the bookies keep data (default: temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=handle)


async def _full_load(writer: LedgerWriter, payload: bytes, seconds: float, in_flight: int) -> array[float]:
    """Keep `in_flight` adds outstanding: each completion issues the next one (callbacks: no future, no task)."""
    clock = time.perf_counter
    latencies = baseline.latency_samples()
    finished = asyncio.get_running_loop().create_future()
    deadline = clock() + seconds
    outstanding = 0

    def issue() -> None:
        nonlocal outstanding
        outstanding += 1
        writer.append_callback(payload, partial(completed, clock()))

    def completed(started: float, _entry_id: int, error: BaseException | None) -> None:
        nonlocal outstanding
        outstanding -= 1
        if error is not None:
            if not finished.done():
                finished.set_exception(error)
            return
        now = clock()
        latencies.append(now - started)
        if now < deadline:
            issue()
        elif outstanding == 0 and not finished.done():
            finished.set_result(None)

    for _ in range(in_flight):
        issue()
    await finished
    return latencies


async def _paced_load(
    writer: LedgerWriter, payload: bytes, seconds: float, rate: float
) -> tuple[array[float], array[float]]:
    """Issue adds at `rate` per second, those due at each millisecond tick, and time each one; also how late each
    tick woke (the client's event-loop lag). Only a count of the outstanding adds is kept (holding every add would
    make the garbage collector's pauses part of the figure)."""
    clock = time.perf_counter
    latencies, tick_lags = baseline.latency_samples(), baseline.latency_samples()
    finished = asyncio.get_running_loop().create_future()
    outstanding = 0
    start = clock()
    deadline = start + seconds

    def completed(started: float, _entry_id: int, error: BaseException | None) -> None:
        nonlocal outstanding
        outstanding -= 1
        if error is None:
            latencies.append(clock() - started)
        if outstanding == 0 and clock() >= deadline and not finished.done():
            finished.set_result(None)

    issued = 0
    while (now := clock()) < deadline:
        due = int((now - start) * rate) - issued
        for _ in range(due):
            writer.append_callback(payload, partial(completed, now))
        outstanding += due
        issued += due
        delay = 0.001 - (clock() - start) % 0.001  # to the next tick, whatever this one cost
        wake = clock() + delay
        await asyncio.sleep(delay)
        tick_lags.append(clock() - wake)
    if outstanding:
        await finished
    return latencies, tick_lags


async def _run(zk: str, args: argparse.Namespace, bookie_pids: list[int], profile: LatencyProfile) -> dict:
    """Both loads through one writer; the bookies' CPU per entry from /proc of `bookie_pids` alone."""
    payload = os.urandom(args.entry_size)

    def bookies_cpu() -> float:
        return sum(_cpu_seconds(pid) for pid in bookie_pids)

    async with BookKeeper(zk) as bookkeeper:
        writer = await bookkeeper.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum)
        eventloop.freeze_start_up_heap()  # as a latency-minded application does (docs/benchmarks.md), and bookies
        started, cpu, bookie_cpu = time.perf_counter(), time.process_time(), bookies_cpu()
        full = await _full_load(writer, payload, args.seconds, args.in_flight)
        full_summary = baseline.load_summary(full, time.perf_counter() - started, args.entry_size)
        full_summary["client_cpu_us_per_entry"] = (time.process_time() - cpu) / max(len(full), 1) * 1e6
        full_summary["bookies_cpu_us_per_entry"] = (bookies_cpu() - bookie_cpu) / max(len(full), 1) * 1e6
        half_rate = full_summary["entries_per_s"] / 2
        started = time.perf_counter()
        profile.start()
        with GcPauses() as gc_pauses:
            half, tick_lags = await _paced_load(writer, payload, args.seconds, half_rate)
        half_summary = baseline.load_summary(half, time.perf_counter() - started, args.entry_size)
        half_summary |= client_figures(tick_lags, gc_pauses.pauses) | profile.report()
        await writer.close()
    return {
        **{f"full_{name}": value for name, value in full_summary.items()},
        "half_rate_target": half_rate,
        **{f"half_{name}": value for name, value in half_summary.items()},
    }


def _measure(zk: str, directory: Path, args: argparse.Namespace, ca: CertificateAuthority | None = None) -> dict:
    """Both loads on a fleet of its own (serving mutual TLS with `ca`), stopped afterwards."""
    with BookieFleet(zk, directory, ca=ca) as fleet:
        bookies = fleet.start(args.bookies, log_level="WARNING", event_loop=args.event_loop)
        pids = [bookie.process.pid for bookie in bookies]
        result = eventloop.run(_run(zk, args, pids, LatencyProfile(os.getpid(), pids, bookies)), args.event_loop)
        fleet.stop()
    return result


def measure_against(zk: str, args: argparse.Namespace, bookie_pids: list[int]) -> dict:
    """Both loads on bookies started elsewhere (Apache BookKeeper's, registered under `zk`), known by their pids."""
    profile = LatencyProfile(os.getpid(), bookie_pids)
    return eventloop.run(_run(zk, args, bookie_pids, profile), args.event_loop)


def handle(args: argparse.Namespace) -> int:
    loop_name = baseline.chosen_event_loop(args.event_loop)
    if not args.bookies >= args.ensemble >= args.write_quorum >= args.ack_quorum >= 1:
        raise CommandError(
            f"need bookies >= E >= Qw >= Qa >= 1, got bookies={args.bookies} E={args.ensemble} "
            f"Qw={args.write_quorum} Qa={args.ack_quorum}"
        )
    if args.seconds <= 0 or args.in_flight < 1 or args.entry_size < 0:
        raise CommandError("--seconds must be positive, --in-flight at least 1 and --entry-size at least 0")
    with tempfile.TemporaryDirectory(prefix="bench-client-", dir=args.dir) as tmp:
        root = Path(tmp)
        baselines = baseline.same_run_baselines(root, args.entry_size)
        with ZooKeeperServer(root / "zookeeper") as zookeeper:
            result = _measure(zookeeper.connect, root / "plain", args)
            secure = None
            if args.tls:
                ca = CertificateAuthority.create()
                use_client_tls(write_tls_dir(root / "client-tls", ca.issue("bench", [Role.CLIENT])))
                secure = _measure(zookeeper.connect, root / "tls", args, ca)
    report = {
        "bookies": args.bookies,
        "ensemble": args.ensemble,
        "write_quorum": args.write_quorum,
        "ack_quorum": args.ack_quorum,
        "entry_size": args.entry_size,
        "seconds": args.seconds,
        "in_flight": args.in_flight,
        "event_loop": loop_name,
        **result,
        "full_client_cpu_loop_iterations": baseline.in_loop_iterations(
            result["full_client_cpu_us_per_entry"], baselines
        ),
        **baselines,
    }
    if secure is not None:
        report.update(baseline.tls_figures(result, secure, "full_", ("client", "bookies")))
    baseline.print_report(report, args.json)
    return 0
