"""`bench bookkeeper --matrix` at a tiny size: one cell of each kind (the Java client on a Java bookie and on ours,
our client on a Java bookie), a few hundred 64 KiB entries each. Figures are checked for being real and consistent
with one another, never for speed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bookfleet.bench.bookkeeper import BOOKIE_RATIOS, CLIENT_RATIOS


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
    assert list(cells["bookfleet", "java-db"]["figures"]["half_cpu_cores"]) == ["client", "bookie0"]

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
