"""Where an add's tail latency goes, measured during a half load (`bench client`'s, and the Java bench client's in
`bench bookkeeper`), stage by stage.

p99 many times p50 has several suspects on a shared 2-core machine; each is measured, not guessed:
- the client: how late its 1 ms pacing ticks wake (`client_loop_lag_*`), and its garbage collector's pauses
  (`client_gc_*`; ours from `gc.callbacks`, the JVM's from its collectors' beans, reported by the Java client);
- the bookies (ours): their own add latency from receipt to durable, their journal group commits' write+fdatasync,
  how late their event loop ran a 10 ms timer, how long their memtable flushes took and how long adds held by a full
  memtable waited for one, as their `/metrics` histograms count them during the phase (`bookie_add_*`,
  `journal_sync_*`, `bookie_loop_lag_*`, `flush_*`, `memtable_wait_*`: bucket upper bounds of p50, p99 and the
  longest), how many adds they counted (`bookie_adds`, the phase's own adds when the window is right) and how many
  add batches a full memtable held (`memtable_waits`). A sync's p99 counts syncs, not adds: one 30 ms sync in a
  3 s phase at 60,000 adds/s holds 1% of its adds and hides under the syncs' p99, so the longest is reported too;
- scheduling: how long each process's threads sat runnable but waiting for a core (`run_queue_wait_ms_per_s`, from
  `/proc/<pid>/task/*/schedstat`) and how much CPU each used (`cpu_cores`).
What the client sees beyond the bookie's own add figure is the client, the network path and the bookie's loop
before it reads the request (its loop lag).
"""

from __future__ import annotations

import gc
import os
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bookfleet.bench.baseline import percentile
from bookfleet.bench.bookie import _cpu_seconds as cpu_seconds
from bookfleet.fleet import BookieProcess

ADDS = "bookie_add_latency_seconds"
MEMTABLE_WAITS = "bookie_memtable_wait_seconds"
HISTOGRAMS = {
    "bookie_add_latency_seconds": "bookie_add",
    "bookie_journal_sync_latency_seconds": "journal_sync",
    "bookie_event_loop_lag_seconds": "bookie_loop_lag",
    "bookie_flush_seconds": "flush",
    "bookie_memtable_wait_seconds": "memtable_wait",
}


def run_queue_wait_s(pid: int) -> float:
    """Seconds the threads of `pid` have spent runnable but not running (waiting for a core), so far."""
    waited = 0
    for schedstat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            waited += int(schedstat.read_text().split()[1])
        except (OSError, IndexError):
            continue  # a thread that ended meanwhile
    return waited / 1e9


def bucket_counts(bookie: BookieProcess) -> dict[str, list[tuple[float, float]]]:
    """The bookie's latency histograms: name -> [(upper bound in seconds, cumulative count)]."""
    with urllib.request.urlopen(bookie.http_url("/metrics"), timeout=10, context=bookie.http_context()) as answer:
        text = answer.read().decode()
    histograms: dict[str, list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name in HISTOGRAMS:
            histograms[family.name] = [
                (float(sample.labels["le"]), sample.value) for sample in family.samples
                if sample.name.endswith("_bucket")
            ]
    return histograms


def bucket_quantile(before: list[tuple[float, float]], after: list[tuple[float, float]], fraction: float) -> float:
    """The upper bound (seconds) of the bucket holding the `fraction` quantile of what was counted in between."""
    counts = [(bound, late - early) for (bound, late), (_, early) in zip(after, before, strict=True)]
    total = counts[-1][1]
    if not total:
        return float("nan")
    return next(bound for bound, count in counts if count >= fraction * total)


@dataclass
class ProcessWatch:
    """CPU and run-queue wait of named processes between `start` and `stop`."""

    pids: dict[str, int]
    started: float = 0.0
    before: dict[str, tuple[float, float]] = field(default_factory=dict)

    def _read(self) -> dict[str, tuple[float, float]]:
        return {name: (cpu_seconds(pid), run_queue_wait_s(pid)) for name, pid in self.pids.items()}

    def start(self) -> None:
        self.started, self.before = time.perf_counter(), self._read()

    def stop(self) -> dict[str, dict[str, float]]:
        elapsed, after = time.perf_counter() - self.started, self._read()
        return {
            "cpu_cores": {name: round((after[name][0] - self.before[name][0]) / elapsed, 3) for name in self.pids},
            "run_queue_wait_ms_per_s": {
                name: round((after[name][1] - self.before[name][1]) / elapsed * 1000, 1) for name in self.pids
            },
        }


class GcPauses:
    """Durations of the garbage collector's runs in this process while installed."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._began = 0.0

    def _callback(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._began)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def client_figures(lags: Sequence[float], gc_pauses: Sequence[float]) -> dict:
    """Our client's part: its pacing ticks' lags and its collections' pauses (seconds), in milliseconds."""
    tick_lags = sorted(lags)
    return {
        "client_loop_lag_p50_ms": percentile(tick_lags, 0.50) * 1000,
        "client_loop_lag_p99_ms": percentile(tick_lags, 0.99) * 1000,
        "client_loop_lag_max_ms": (tick_lags[-1] if tick_lags else float("nan")) * 1000,
        "client_gc_runs": len(gc_pauses),
        "client_gc_max_ms": max(gc_pauses, default=0.0) * 1000,
        "client_gc_total_ms": sum(gc_pauses) * 1000,
    }


class LatencyProfile:
    """The processes' and the bookies' part above for one load phase, whichever client drives it: `start()` at its
    start, `report()` at its end. `metered` are the bookies whose histograms are read: ours; a stock bookie has none
    of them, only its pid."""

    def __init__(self, client_pid: int, bookie_pids: Sequence[int], metered: Sequence[BookieProcess] = ()):
        self.bookies = metered
        self.watch = ProcessWatch(
            {"client": client_pid} | {f"bookie{index}": pid for index, pid in enumerate(bookie_pids)}
        )
        self.histograms_before: list[dict] = []

    def start(self) -> None:
        self.histograms_before = [bucket_counts(bookie) for bookie in self.bookies]
        self.watch.start()

    def report(self) -> dict:
        processes = self.watch.stop()
        histograms_after = [bucket_counts(bookie) for bookie in self.bookies]
        report: dict = {**processes, "load_average_1m": os.getloadavg()[0]}
        for metric, name in ((ADDS, "bookie_adds"), (MEMTABLE_WAITS, "memtable_waits")):
            report[name] = [
                int(after[metric][-1][1] - before[metric][-1][1])
                for before, after in zip(self.histograms_before, histograms_after, strict=True)
            ]
        for metric, prefix in HISTOGRAMS.items():
            for fraction, label in ((0.5, "p50"), (0.99, "p99"), (1.0, "max")):
                report[f"{prefix}_{label}_ms_upper"] = [
                    bucket_quantile(before[metric], after[metric], fraction) * 1000
                    for before, after in zip(self.histograms_before, histograms_after, strict=True)
                ]
        return report
