"""The Spark repair job against real ZooKeeper, real bookie processes and a real local SparkSession."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest
from prometheus_client import REGISTRY

from bookfleet.bench.repair import LedgerShape, fill_ledgers, verify_replicas
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.writeset import write_set
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import LedgerState, MetadataStore
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.replication.spark_repair import RepairJob, run_repair
from bookfleet.spark import app_path, spark_submit_command
from tests.fixtures.bookies import lose_bookie
from tests.fixtures.waiting import wait_until

pytestmark = pytest.mark.spark

SHAPE = LedgerShape(ensemble_size=3, write_quorum=2, ack_quorum=2)


def test_lost_bookie_of_50_ledgers_is_repaired(spark, zk, zk_connect, bookie_fleet):
    victim, *_ = bookie_fleet.start(3)
    expected = asyncio.run(fill_ledgers(zk_connect, 50, 20, 512, SHAPE))
    bookie_fleet.start(1)
    assert len(lose_bookie(zk, victim)) == 50

    summary = run_repair(zk_connect)

    assert summary.failures == [] and summary.data_loss == {}
    assert summary.ledgers == 50 and summary.fragments == 50
    # with E=3, Qw=2 a position holds 2 of every 3 entries: 20 entries -> 14 or 13 copies per ledger
    assert 13 * 50 <= summary.entries <= 14 * 50 and summary.bytes > summary.entries * 512
    assert UnderReplication(zk).ledger_ids() == []
    store = MetadataStore(zk)
    assert store.ledgers_on_bookie(victim.bookie_id) == []
    assert all(victim.bookie_id not in store.read(ledger_id)[0].bookies() for ledger_id in expected)
    assert asyncio.run(verify_replicas(zk_connect, expected)) == []


def test_a_bookie_lost_during_a_repair_keeps_its_marker(spark, zk, zk_connect, bookie_fleet):
    first, second, _ = bookie_fleet.start(3)
    expected = asyncio.run(fill_ledgers(zk_connect, 4, 10, 200, LedgerShape(3, 3, 2)))
    bookie_fleet.start(2)
    lose_bookie(zk, first)
    job = RepairJob(zk)
    works = job.prepare(None)  # planned and locked against the first loss only
    lose_bookie(zk, second)  # the auditor merges the second loss into the markers meanwhile

    job.copy(lambda planned_bytes: spark, works, None)

    assert job.summary.failures == [] and job.summary.ledgers == 4  # copies read from the last survivor
    under_replication = UnderReplication(zk)
    markers = under_replication.markers()
    assert [set(m.missing_bookies) for m in markers] == [{first.bookie_id, second.bookie_id}] * 4
    assert sorted(job.summary.pending) == sorted(expected)
    rerun = run_repair(zk_connect)
    assert (rerun.ledgers, rerun.failures) == (4, [])
    assert under_replication.ledger_ids() == []
    assert asyncio.run(verify_replicas(zk_connect, expected)) == []


def test_open_ledger_is_fenced_and_closed_after_its_grace_period(spark, zk, zk_connect, bookie_fleet):
    victim, *_ = bookie_fleet.start(3)
    ledger_id, digests = asyncio.run(write_without_closing(zk_connect, 30))
    bookie_fleet.start(1)
    lose_bookie(zk, victim)
    under_replication = UnderReplication(zk)

    young = run_repair(zk_connect, open_grace_s=3600)
    assert (young.ledgers, young.pending, young.failures) == (0, [ledger_id], [])
    assert under_replication.ledger_ids() == [ledger_id]

    summary = run_repair(zk_connect, open_grace_s=0)
    assert (summary.ledgers, summary.failures) == (1, [])
    metadata = MetadataStore(zk).read(ledger_id)[0]
    assert metadata.is_closed and metadata.last_entry_id == 29
    assert victim.bookie_id not in metadata.bookies()
    assert asyncio.run(verify_replicas(zk_connect, {ledger_id: digests})) == []


def test_a_writers_fresh_mark_on_an_old_marker_restarts_the_open_ledger_grace(zk, zk_connect, bookie_fleet):
    """A replica check marked the ledger two hours ago; its writer, riding through, has just named a bookie it went
    on without. The grace counts from that mark, so repair does not fence the live writer at once."""
    bookie_fleet.start(5)  # two spares: both named bookies could be replaced, so only the grace holds repair back
    ledger_id, _ = asyncio.run(write_without_closing(zk_connect, 10))
    checked, skipped, _ = MetadataStore(zk).read(ledger_id)[0].segments[-1].bookies
    two_hours_ago = int(time.time() * 1000) - 2 * 3600 * 1000
    zk.create(
        zkpaths.underreplicated(ledger_id),
        f'replica: "{checked}"\nctime: {two_hours_ago}\n'.encode(),  # as BookKeeper's auditor writes it
        makepath=True,
    )
    under_replication = UnderReplication(zk)
    marker = under_replication.mark(ledger_id, [skipped], missed_entries=True)
    assert marker.ctime == two_hours_ago and marker.grace_start > two_hours_ago

    job = RepairJob(zk, open_grace_s=600)
    assert job.prepare(None) == []
    assert (job.summary.pending, job.summary.failures) == ([ledger_id], [])
    assert MetadataStore(zk).read(ledger_id)[0].state == LedgerState.OPEN  # its writer was not fenced


async def write_without_closing(zk_connect: str, entries: int) -> tuple[int, list[bytes]]:
    """A ledger whose writer went away without closing it: its metadata stays OPEN.

    Qw=3 > Qa=2, so recovery can rewrite its tail to Qa survivors (the client's recovery does no ensemble change).
    """
    payloads = [os.urandom(100) for _ in range(entries)]
    async with BookKeeper(zk_connect) as bookkeeper:
        writer = await bookkeeper.create_ledger(3, 3, 2)
        await asyncio.gather(*(writer.append(payload) for payload in payloads))
    return writer.ledger_id, [hashlib.sha256(payload).digest() for payload in payloads]


def test_repair_killed_half_way_converges_on_rerun(spark, zk, zk_connect, bookie_fleet):
    victim, *_ = bookie_fleet.start(3)
    expected = asyncio.run(fill_ledgers(zk_connect, 20, 30, 256, SHAPE))
    bookie_fleet.start(1)
    marked = lose_bookie(zk, victim)
    under_replication = UnderReplication(zk)

    # a separate driver process, throttled so it is still busy when it is killed mid-run
    driver = subprocess.Popen(
        [sys.executable, "-m", "bookfleet", "repair", "--zk", zk_connect, "--master", "local[1]",
         "--throttle-mb-s", "0.05", "--json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        wait_until(lambda: len(under_replication.ledger_ids()) < len(marked), 120, "the first repaired ledger")
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    left = under_replication.ledger_ids()
    assert 0 < len(left) < len(marked), "the driver was killed half-way"

    # locks of the dead driver expire with its session; the rerun retries until it gets them (as the runner does)
    summaries = []
    wait_until(lambda: summaries.append(run_repair(zk_connect)) or not under_replication.ledger_ids(), 60, "rerun")
    assert all(s.failures == [] for s in summaries)
    assert sum(s.ledgers for s in summaries) == len(left)
    assert asyncio.run(verify_replicas(zk_connect, expected)) == []
    assert MetadataStore(zk).ledgers_on_bookie(victim.bookie_id) == []


def test_entries_without_any_replica_are_data_loss_not_retried(spark, zk, zk_connect, bookie_fleet):
    first, second, _ = bookie_fleet.start(3)
    expected = asyncio.run(fill_ledgers(zk_connect, 4, 9, 256, SHAPE))
    bookie_fleet.start(2)
    lose_bookie(zk, first)
    lose_bookie(zk, second)
    store = MetadataStore(zk)
    lost = {}
    for ledger_id in expected:
        ensemble = store.read(ledger_id)[0].segments[0].bookies
        gone = {ensemble.index(first.bookie_id), ensemble.index(second.bookie_id)}
        lost[ledger_id] = [e for e in range(9) if set(write_set(e, 3, 2)) <= gone]
    assert all(len(entries) == 3 for entries in lost.values())  # one write set in three is exactly the lost pair

    lost_before = REGISTRY.get_sample_value("bookfleet_repair_data_loss_entries_total") or 0

    summary = run_repair(zk_connect)

    assert summary.failures == []
    assert summary.data_loss == lost
    assert REGISTRY.get_sample_value("bookfleet_repair_data_loss_entries_total") == lost_before + 12
    loss_lines = [line for line in summary.lines() if line.startswith("DATA LOSS")]
    assert len(loss_lines) == 4 and "3 entries" in loss_lines[0]
    under_replication = UnderReplication(zk)
    assert {r.ledger_id: list(r.entries) for r in under_replication.data_losses()} == lost
    assert under_replication.ledger_ids() == []  # given up, not left marked for a retry loop
    again = run_repair(zk_connect)
    assert (again.ledgers, again.entries, again.data_loss) == (0, 0, {})
    gone = {ledger_id: set(entries) for ledger_id, entries in lost.items()}
    assert asyncio.run(verify_replicas(zk_connect, expected, skip=gone)) == []


def test_spark_submit_command_for_local_runs_and_cluster_images():
    local = spark_submit_command("local[2]", "zk:2181/chroot", [7, 9], throttle_mb_s=5)
    assert local[0].endswith("pyspark/bin/spark-submit") and local[1:3] == ["--master", "local[2]"]
    app = local.index(app_path("spark_repair", None))
    assert local[app].endswith("bookfleet/replication/spark_repair.py")
    assert local[app + 1 :] == ["--zk", "zk:2181/chroot", "--ledger", "7", "--ledger", "9", "--throttle-mb-s", "5"]
    assert f"spark.pyspark.python={sys.executable}" in local

    cluster = spark_submit_command("k8s://https://api:6443", "zk:2181", executors=4, executor_memory="2g", image="bf:1")
    assert "local:///opt/bookfleet/spark_repair.py" in cluster
    for conf in ("spark.kubernetes.container.image=bf:1", "spark.executor.instances=4", "spark.executor.memory=2g"):
        assert conf in cluster
    assert cluster[cluster.index("--deploy-mode") + 1] == "cluster"


def test_bad_flags_are_named(zk_connect):
    result = subprocess.run(
        [sys.executable, "-m", "bookfleet", "repair", "--zk", zk_connect, "--throttle-mb-s", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "--throttle-mb-s must be positive, got 0.0" in result.stderr


def test_nothing_is_repaired_while_replication_is_disabled(spark, zk, zk_connect):
    under_replication = UnderReplication(zk)
    under_replication.mark(5, ["bookie-gone"])
    under_replication.disable()

    summary = run_repair(zk_connect)

    assert summary.disabled and summary.ledgers == 0
    assert "disabled" in summary.lines()[0]
    assert under_replication.ledger_ids() == [5]
