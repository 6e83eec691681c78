"""The benchmarks run and report their figures with a same-run baseline (no speed is asserted: that is their job)."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bookfleet.bench import bookkeeper, kube_operator
from bookfleet.bench.baseline import tls_figures
from bookfleet.bench.latency_profile import bucket_quantile
from bookfleet.cli import build_parser
from bookfleet.commanderror import CommandError


@pytest.mark.parametrize(
    ("bench", "keys"),
    [
        (["bookie", "--seconds", "1", "--tls"], ["entries_per_s", "mb_per_s", "p50_ms", "p99_ms", "raw_fsync_mb_per_s",
          "sequential_fsync_mb_per_s", "cpu_loop_ns_per_iteration", "bookie_cpu_per_entry_loop_iterations",
          "tls_entries_per_s", "tls_bookie_cpu_us_per_entry", "tls_throughput_fraction_of_plain"]),
        (
            ["client", "--bookies", "3", "-e", "3", "-w", "3", "-a", "2", "--seconds", "1", "--tls"],
            ["full_entries_per_s", "full_p99_ms", "half_entries_per_s", "half_p99_ms", "raw_fsync_ops_per_s",
             "cpu_loop_ns_per_iteration", "full_client_cpu_loop_iterations", "tls_full_entries_per_s",
             "tls_full_throughput_fraction_of_plain"],
        ),
        (
            ["silent-bookie", "--rounds", "1", "--add-timeout", "1", "--rate", "200"],
            ["silent_replaced_after_s_median", "killed_replaced_after_s_median", "target_s", "max_lagging_bytes"],
        ),
    ],
)
def test_bench_prints_one_json_object_with_its_baseline(bench, keys, tmp_path):
    command = [sys.executable, "-m", "bookfleet", "--log-level", "WARNING", "bench", *bench]
    result = subprocess.run([*command, "--dir", str(tmp_path), "--json"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    for key in keys:
        assert figures[key] > 0, (key, figures)


def test_tls_figures_stand_next_to_the_plain_run():
    plain = {"full_entries_per_s": 100.0, "full_client_cpu_us_per_entry": 5.0, "full_bookies_cpu_us_per_entry": 30.0}
    secure = {"full_entries_per_s": 80.0, "full_client_cpu_us_per_entry": 6.5, "full_bookies_cpu_us_per_entry": 40.0}
    assert tls_figures(plain, secure, "full_", ("client", "bookies")) == {
        "tls_full_entries_per_s": 80.0,
        "tls_full_client_cpu_us_per_entry": 6.5,
        "tls_full_bookies_cpu_us_per_entry": 40.0,
        "tls_full_throughput_fraction_of_plain": 0.8,
        "tls_extra_client_cpu_us_per_entry": 1.5,
        "tls_extra_bookies_cpu_us_per_entry": 10.0,
    }


def test_bench_bookkeeper_runs_both_sides_with_acknowledged_entries(tmp_path):
    """The Java reference path (Maven jars, the compiled Java client, Java bookies) must not rot: a short run of
    the first scenario gives a line with both sides, each with entries acknowledged, and their ratio."""
    command = [
        sys.executable, "-m", "bookfleet", "--log-level", "WARNING", "bench", "bookkeeper", "--scenario", "one-bookie",
        "--storage", "db", "--protocol", "v2", "--seconds", "2", "--warmup", "0", "--dir", str(tmp_path), "--json",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["scenario"] == "one-bookie" and figures["raw_fsync_mb_per_s"] > 0
    (run,) = figures["runs"]
    assert run["java"] == "db-v2"
    for side in ("ours", "java_figures"):
        assert run[side]["full_entries"] > 0 and run[side]["half_entries"] > 0, (side, run)
    assert run["throughput_ours_over_java"] > 0


def test_each_pair_of_the_reference_bench_deletes_its_data_before_the_next_pair_runs(tmp_path, monkeypatch):
    """A 64 KiB pair writes gigabytes on each side: kept until the scenario ended, a full run's pairs filled the disk
    and the bookies turned read-only mid-run (the run then failed with NotEnoughBookies)."""
    present: list[list[str]] = []

    def write(directory: Path) -> dict:
        directory.mkdir(parents=True)
        (directory / "data").write_bytes(b"entries")
        present.append(sorted(str(path.parent.relative_to(tmp_path)) for path in tmp_path.rglob("data")))
        return {figure: 1.0 for figure, _ in bookkeeper.RATIOS.values()}

    class Java:
        def measure(self, scenario, storage, protocol, seconds, warmup, run: Path) -> dict:
            return write(run)

    monkeypatch.setattr(bookkeeper, "_ours", lambda zk, directory, scenario, args: write(directory))
    monkeypatch.setattr(bookkeeper.baseline, "same_run_baselines", lambda root, entry_size: {})
    args = argparse.Namespace(storage=["db", "sorted"], protocol=["v2"], seconds=1.0, warmup=0.0)
    report = bookkeeper._scenario_report(bookkeeper.SCENARIOS["one-bookie-64k"], Java(), "zk", tmp_path, args,
                                         "asyncio")
    assert [run["java"] for run in report["runs"]] == ["db-v2", "sorted-v2"]
    assert present == [["one-bookie-64k-0/ours"], ["one-bookie-64k-0/java", "one-bookie-64k-0/ours"],
                       ["one-bookie-64k-1/ours"], ["one-bookie-64k-1/java", "one-bookie-64k-1/ours"]]
    assert not list(tmp_path.rglob("data"))


def test_the_scale_bench_without_go_says_so_in_one_line_and_succeeds(tmp_path):
    """kwok and the control plane are built from Go modules: a machine without Go skips the bench, it does not fail."""
    command = [sys.executable, "-m", "bookfleet", "bench", "operator", "--scale", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env={"PATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines() == ["bench operator --scale: skipped: no Go toolchain on PATH (the"
                                                  " control plane and kwok are built from Go modules)"]


def test_a_bookie_histograms_quantile_is_the_upper_bound_of_its_bucket_in_the_phase():
    """Only what a phase added counts: 1,000 fast adds before it must not hide its own slower ones."""
    before = [(0.001, 1000.0), (0.01, 1000.0), (0.1, 1000.0), (float("inf"), 1000.0)]
    after = [(0.001, 1010.0), (0.01, 1060.0), (0.1, 1100.0), (float("inf"), 1100.0)]
    assert bucket_quantile(before, after, 0.5) == 0.01
    assert bucket_quantile(before, after, 0.99) == 0.1
    assert math.isnan(bucket_quantile(before, before, 0.99))


def test_the_zookeeper_side_of_the_scale_bench_measures_every_read_it_names():
    """`--scale --zookeeper-only` (no Kubernetes, no Go): status (also as its own command), the auditor's passes,
    repair planning and a lost bookie's remaining ledgers, each with its ZooKeeper requests counted by the server,
    beside raw reads of the same tree; then status once a whole zone is lost (every ledger marked)."""
    command = [sys.executable, "-m", "bookfleet", "bench", "operator", "--scale", "--zookeeper-only", "--bookies", "6",
               "--ledgers", "30", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run = json.loads(result.stdout)
    assert run["mark_lost_bookie_items"] == run["remaining_ledgers_items"] == run["repair_planning_items"] == 15
    assert run["auditor_check_metadata_items"] == 30
    # A scan of the metadata (BookKeeper keeps no index by bookie): listings of the ledger levels, then multiRead
    # requests of up to 250 records, so a handful for 30 ledgers and about 400 at 100,000.
    assert 1 < run["remaining_ledgers_zk_requests"] <= 6
    assert all(run[f"{read}_zk_requests"] > 0
               for read in ("status", "status_cli", "status_cli_json", "auditor_taking_office", "repair_planning"))
    assert run["status_zk_requests_by_kind"]["GetData"] > 0
    assert run["raw_ledger_ids_listed"] == 30 and run["raw_pipelined_get_per_s"] > 0
    assert run["zone_lost_under_replicated"] == 30 and run["zone_lost_status_cli_zk_requests"] > 0  # a zone lost


def test_bench_operator_outside_a_source_checkout_says_it_is_a_development_command(tmp_path, monkeypatch):
    """Its harness is test tooling, not in the wheel: an install without the checkout gets one line, not a trace."""
    monkeypatch.setattr(kube_operator, "CHECKOUT", tmp_path)
    args = build_parser().parse_args(["bench", "operator", "--json"])
    with pytest.raises(CommandError, match="development command: it runs tests/operatorbench of a source checkout"):
        args.handler(args)


def test_bench_operator_partition_is_a_variant_of_the_zone_loss():
    args = build_parser().parse_args(["bench", "operator", "--partition", "--json"])
    with pytest.raises(CommandError, match="--partition is a variant of --zone-loss"):
        args.handler(args)
