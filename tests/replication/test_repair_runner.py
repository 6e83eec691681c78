"""The repair runner of the standalone fleet, launching the repair job through spark-submit when markers appear."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest

from bookfleet import spark as sparksettings
from bookfleet.bench.repair import LedgerShape, fill_ledgers, verify_replicas
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.replication.runner import AutoRecoveryRunner, RepairRunner
from bookfleet.zkserver import free_port
from tests.fixtures.bookies import lose_bookie
from tests.fixtures.waiting import wait_until

pytestmark = pytest.mark.spark


def test_runner_waits_for_the_switch_then_repairs_through_spark_submit(zk, zk_connect, bookie_fleet):
    victim, *_ = bookie_fleet.start(4)
    expected = asyncio.run(fill_ledgers(zk_connect, 6, 10, 200, LedgerShape(3, 2, 2)))
    under_replication = UnderReplication(zk)
    under_replication.disable()
    marked = lose_bookie(zk, victim)
    runner = RepairRunner(zk, zk_connect, mode="spark-submit", master="local[1]", poll_interval=0.1).start()
    try:
        # disabled: it keeps looking without launching anything
        wait_until(lambda: runner.checks >= 3, what="three checks")
        assert runner.summaries == [] and under_replication.ledger_ids() == sorted(marked)
        under_replication.enable()
        wait_until(lambda: not under_replication.ledger_ids(), 120, "the repair")
    finally:
        runner.stop()
    assert under_replication.ledger_ids() == []
    assert sum(s.ledgers for s in runner.summaries) == len(marked)
    assert all(s.failures == [] for s in runner.summaries)
    assert asyncio.run(verify_replicas(zk_connect, expected)) == []


def test_auto_recovery_serves_the_repair_counters(zk_connect):
    port = free_port()
    with AutoRecoveryRunner(zk_connect, metrics_port=port, poll_interval=0.1) as recovery:
        assert recovery.auditor.wait_active(30)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            metrics = reply.read().decode()
    assert "bookfleet_repair_data_loss_entries_total" in metrics
    assert "bookfleet_repair_bytes_total" in metrics


def test_the_in_process_runner_warms_its_spark_session_before_any_loss(zk, zk_connect):
    """The first repair after a loss must not pay the session's start and first job (class loading, JIT, the Python
    daemon's start: as much CPU as a small repair's copying): the runner pays them when it starts."""
    runner = RepairRunner(zk, zk_connect, master="local[1]", poll_interval=0.1).start()
    try:
        wait_until(lambda: runner.checks > 0, timeout=300, what="the runner polling the markers")
        assert UnderReplication(zk).ledger_ids() == []  # no loss happened: the job ran for the warm-up alone
        tracker = sparksettings.session("local[1]").sparkContext.statusTracker()
        assert tracker.getJobIdsForGroup(sparksettings.WARM_UP_JOB_GROUP)
    finally:
        runner.stop()
