"""Same-run baselines, so every figure is reported next to what this disk can do right now."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path


def raw_fsync_bandwidth(directory: Path, block_size: int, seconds: float = 2.0) -> dict[str, float]:
    """Write `block_size` blocks with fdatasync after each, in `directory`, for about `seconds`."""
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
    }


def load_summary(latencies: list[float], elapsed: float, entry_size: int) -> dict[str, float]:
    """Entries/s, MB/s and p50/p99 latency (ms) of a load; sorts `latencies` (seconds) in place."""
    latencies.sort()
    count = len(latencies)
    return {
        "entries": count,
        "entries_per_s": count / elapsed,
        "mb_per_s": count * entry_size / elapsed / 1e6,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]
