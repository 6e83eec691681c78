"""`bench bookkeeper --matrix` at a tiny size: one cell of each kind (the Java client on a Java bookie and on ours,
our client on a Java bookie), a few hundred 64 KiB entries each. Figures are checked for being real and consistent
with one another, never for speed."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bookfleet.bench import bookkeeper
from bookfleet.bench.bookkeeper import BOOKIE_RATIOS, CLIENT_RATIOS
from bookfleet.bookie.http import LATENCY_BUCKETS


def test_the_bookie_matrix_gives_each_cell_measured_figures_and_ratios_of_those_figures(tmp_path):
    command = [
        sys.executable, "-m", "bookfleet", "--log-level", "WARNING", "bench", "bookkeeper", "--matrix",
        "--scenario", "one-bookie-64k", "--protocol", "v2", "--seconds", "0.5", "--warmup", "0",
        "--dir", str(tmp_path), "--json",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = result.stdout.strip().splitlines()
    report = json.loads(line)
    assert report["matrix"] == "one-bookie-64k" and report["entry_size"] == 64 << 10
    assert report["raw_fsync_mb_per_s"] > 0 and report["cpu_loop_ns_per_iteration"] > 0
    assert "journalSyncData" in report["java_bookie_settings"]
    cells = {(cell["client"], cell["bookie"]): cell for cell in report["cells"]}
    assert list(cells) == [("java-v2", "java-db"), ("java-v2", "bookfleet"), ("bookfleet", "java-db")]

    for name, cell in cells.items():
        figures = cell["figures"]
        assert figures["full_entries"] > 0 and figures["half_entries"] > 0, (name, figures)
        assert figures["half_rate_target"] == pytest.approx(figures["full_entries_per_s"] / 2), (name, figures)
        assert 0 < figures["half_p50_ms"] <= figures["half_p99_ms"], (name, figures)
        # the bookie's CPU and the client's, each from its own processes
        assert figures["full_bookies_cpu_us_per_entry"] > 0 and figures["full_client_cpu_us_per_entry"] > 0, name
        # the half load's profile, one implementation whichever client: the processes' CPU and run-queue waits,
        # the client's pacing ticks and collections (the JVM reports its own)
        assert list(figures["half_cpu_cores"]) == list(figures["half_run_queue_wait_ms_per_s"]) == ["client", "bookie0"]
        assert figures["half_cpu_cores"]["client"] > 0, (name, figures)
        assert figures["half_client_loop_lag_p50_ms"] <= figures["half_client_loop_lag_p99_ms"] \
            <= figures["half_client_loop_lag_max_ms"], (name, figures)
        assert 0 <= figures["half_client_gc_max_ms"] <= figures["half_client_gc_total_ms"], (name, figures)
        assert figures["half_client_gc_runs"] >= (figures["half_client_gc_total_ms"] > 0), (name, figures)

    # our bookie's own figures over exactly the half load: it counted the adds the Java client timed, no more
    ours_half = cells["java-v2", "bookfleet"]["figures"]
    assert ours_half["half_bookie_adds"] == [ours_half["half_entries"]]
    bounds = [bound * 1000 for bound in LATENCY_BUCKETS]
    for histogram in ("bookie_add", "journal_sync", "bookie_loop_lag"):
        (p50,), (p99,), (longest,) = (
            ours_half[f"half_{histogram}_{figure}_ms_upper"] for figure in ("p50", "p99", "max")
        )
        assert p50 <= p99 <= longest and {p50, p99, longest} <= {*bounds, math.inf}, (histogram, ours_half)
    # a Java bookie has no such histograms
    assert cells["java-v2", "java-db"]["figures"]["half_bookie_adds"] == []

    java_bookie = cells["java-v2", "java-db"]["figures"]
    ours = cells["java-v2", "bookfleet"]
    assert ours["bookfleet_bookie_over_java_bookie"] == {
        "java-db": {name: pytest.approx(ours["figures"][figure] / java_bookie[figure])
                    for name, figure in BOOKIE_RATIOS.items()}
    }
    our_client = cells["bookfleet", "java-db"]
    assert our_client["bookfleet_client_over_java_client"] == {
        "java-v2": {name: pytest.approx(our_client["figures"][figure] / java_bookie[figure])
                    for name, figure in CLIENT_RATIOS.items()}
    }


def test_each_cell_of_the_matrix_deletes_its_data_before_the_next_and_is_compared_with_its_own_client(
    tmp_path, monkeypatch
):
    """Twelve 64 KiB cells kept until the scenario ended would fill the disk (as the paired run's pairs once did),
    and a ratio must divide figures of the same client: Java V3 on bookfleet's bookies by Java V3 on Java's."""
    present: list[list[str]] = []
    throughput = {"java-v2": 100.0, "java-v3": 50.0, "bookfleet": 80.0}

    def write(client_name: str, run: Path, bookie_speed: float = 1.0) -> dict:
        run.mkdir(parents=True)
        (run / "data").write_bytes(b"entries")
        present.append(sorted(str(path.parent.relative_to(tmp_path)) for path in tmp_path.rglob("data")))
        figures = dict.fromkeys({*BOOKIE_RATIOS.values(), *CLIENT_RATIOS.values()}, 1.0)
        return figures | {"full_entries_per_s": throughput[client_name] * bookie_speed}

    class Java:
        def measure(self, scenario, storage, protocol, seconds, warmup, run: Path) -> dict:
            return write(f"java-{protocol}", run)

    def java_client_on_ours(java, zk, scenario, protocol, args, run: Path) -> dict:
        return write(f"java-{protocol}", run, bookie_speed=2.0)

    monkeypatch.setattr(bookkeeper, "_java_client_on_our_bookies", java_client_on_ours)
    monkeypatch.setattr(bookkeeper, "_our_client_on_java_bookies",
                        lambda java, zk, scenario, storage, args, run: write("bookfleet", run))
    monkeypatch.setattr(bookkeeper.baseline, "same_run_baselines", lambda root, entry_size: {})
    args = argparse.Namespace(storage=["db"], protocol=["v2", "v3"], seconds=1.0, warmup=0.0)
    report = bookkeeper._matrix_report(bookkeeper.SCENARIOS["e3-64k"], Java(), "zk", tmp_path, args, "asyncio")
    assert [(cell["client"], cell["bookie"]) for cell in report["cells"]] == [
        ("java-v2", "java-db"), ("java-v2", "bookfleet"), ("java-v3", "java-db"), ("java-v3", "bookfleet"),
        ("bookfleet", "java-db"),
    ]
    assert present == [[f"e3-64k-cell-{index}"] for index in range(5)]
    assert not list(tmp_path.rglob("data"))
    assert [cell["bookfleet_bookie_over_java_bookie"]["java-db"]["adds_per_s"] for cell in report["cells"][1:4:2]] \
        == [2.0, 2.0]
    assert {name: ratio["adds_per_s"] for name, ratio in report["cells"][4]["bookfleet_client_over_java_client"]
            .items()} == {"java-v2": 0.8, "java-v3": 1.6}
