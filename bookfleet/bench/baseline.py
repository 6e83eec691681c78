"""Same-run baselines, so every figure is reported next to what this disk and this CPU can do right now.

Machines of one kind differ by 2x or more in CPU speed, so a CPU-bound figure means little alone: every benchmark
reports the time of a fixed pure-Python loop measured in the same run, and CPU costs also in iterations of it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path

from bookfleet import eventloop
from bookfleet.commanderror import CommandError


def raw_fsync_bandwidth(directory: Path, block_size: int, seconds: float = 2.0) -> dict[str, float]:
    """Write `block_size` blocks with fdatasync after each, in `directory`, for about `seconds`: the rate, and the
    disk's own tail (p99, max), the floor under any add's p99."""
    block = os.urandom(block_size)
    fd, path = tempfile.mkstemp(prefix="baseline-", dir=directory)
    latencies = []
    try:
        deadline = time.perf_counter() + seconds
        while (start := time.perf_counter()) < deadline:
            os.write(fd, block)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(path)
    elapsed = sum(latencies)
    latencies.sort()
    return {
        "raw_fsync_ops_per_s": len(latencies) / elapsed,
        "raw_fsync_mb_per_s": len(latencies) * block_size / elapsed / 1e6,
        "raw_fsync_p50_ms": latencies[len(latencies) // 2] * 1000,
        "raw_fsync_p99_ms": percentile(latencies, 0.99) * 1000,
        "raw_fsync_max_ms": latencies[-1] * 1000,
    }


SEQUENTIAL_BLOCK = 4 << 20
CPU_LOOP_ITERATIONS = 2_000_000


def sequential_fsync_bandwidth(directory: Path, seconds: float = 2.0) -> dict[str, float]:
    """The disk's streaming limit: large blocks appended with fdatasync after each (what a busy journal does)."""
    figures = raw_fsync_bandwidth(directory, SEQUENTIAL_BLOCK, seconds)
    return {"sequential_fsync_mb_per_s": figures["raw_fsync_mb_per_s"]}


def cpu_loop() -> dict[str, float]:
    """A fixed pure-Python workload (a counting loop), best of three: ns per iteration on this CPU, right now."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        total = 0
        for i in range(CPU_LOOP_ITERATIONS):
            total += i
        best = min(best, time.process_time() - started)
    return {"cpu_loop_ns_per_iteration": best / CPU_LOOP_ITERATIONS * 1e9, "cpu_loop_ms": best * 1000}


def same_run_baselines(directory: Path, block_size: int, seconds: float = 2.0) -> dict[str, float]:
    """Everything a benchmark is compared with: fsync of its own block size, the streaming limit, the CPU loop, and
    the machine's 1-minute load average as they were measured (a shared machine's figures swing with it)."""
    return {
        **raw_fsync_bandwidth(directory, block_size, seconds),
        **sequential_fsync_bandwidth(directory, seconds),
        **cpu_loop(),
        "load_average_1m": os.getloadavg()[0],
    }


def in_loop_iterations(cpu_us: float, baselines: dict[str, float]) -> float:
    """A CPU cost in iterations of the baseline loop: comparable across machines of different speed."""
    return cpu_us * 1000 / baselines["cpu_loop_ns_per_iteration"]


def latency_samples() -> array[float]:
    """Where a load keeps its latencies: a flat array, not a list of a million float objects, which every
    generation-2 collection of the load's process visits one by one (40-90 ms pauses, about one a second, that
    were part of the figure)."""
    return array("d")


def load_summary(samples: Sequence[float], elapsed: float, entry_size: int) -> dict[str, float]:
    """Entries/s, MB/s and p50/p99/p99.9 latency (ms) of a load from its latencies (seconds)."""
    latencies = sorted(samples)
    count = len(latencies)
    return {
        "entries": count,
        "entries_per_s": count / elapsed,
        "mb_per_s": count * entry_size / elapsed / 1e6,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "p999_ms": percentile(latencies, 0.999) * 1000,
    }


def tls_figures(plain: dict, secure: dict, prefix: str, sides: Iterable[str]) -> dict[str, float]:
    """A `--tls` run next to the plain one of the same benchmark: its figures as `tls_*`, its throughput as a
    fraction of the plain one and the extra CPU per entry of each side (`<prefix><side>_cpu_us_per_entry`)."""
    figures = {f"tls_{name}": value for name, value in secure.items()}
    throughput = f"{prefix}entries_per_s"
    figures[f"tls_{prefix}throughput_fraction_of_plain"] = secure[throughput] / plain[throughput]
    for side in sides:
        cpu = f"{prefix}{side}_cpu_us_per_entry"
        figures[f"tls_extra_{side}_cpu_us_per_entry"] = secure[cpu] - plain[cpu]
    return figures


def add_event_loop_argument(parser) -> None:
    """`--event-loop`: what the benchmark's load and the bookies it starts run on."""
    parser.add_argument(
        "--event-loop", choices=eventloop.CHOICES, default="auto",
        help="event loop of the load and of the bookies (default auto: uvloop when installed)",
    )


def chosen_event_loop(choice: str) -> str:
    """What `--event-loop` runs on here (uvloop or asyncio); a clear error when uvloop is asked for and missing."""
    try:
        return eventloop.name(choice)
    except eventloop.EventLoopUnavailable as exc:
        raise CommandError(str(exc)) from None


def print_report(report: dict, as_json: bool) -> None:
    """One JSON object, or one aligned `name: value` line per figure."""
    if as_json:
        print(json.dumps(report))
        return
    for name, value in report.items():
        print(f"{name:>24}: {value:.3f}" if isinstance(value, float) else f"{name:>24}: {value}")


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]
