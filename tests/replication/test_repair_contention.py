"""Repair runs contending for ledgers' repair locks (two lost bookies of a zone: one Job each, both reading every
marker). A run does its own work, then waits for the locks another repair holds and finishes what that repair left:
one run, nothing left pending while the other repair is alive. Real ZooKeeper, real bookie processes, a real local
SparkSession; a second ZooKeeper session stands in for the other repair's driver where the test needs to choose
when it lets go."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from bookfleet.bench.repair import LedgerShape, fill_ledgers, verify_replicas
from bookfleet.meta import zk as zkclient
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.replication.spark_repair import ZK_SESSION_TIMEOUT, RepairJob, run_repair
from tests.fixtures.bookies import lose_bookie
from tests.fixtures.waiting import wait_until

pytestmark = pytest.mark.spark

SHAPE = LedgerShape(ensemble_size=3, write_quorum=2, ack_quorum=2)
LEDGERS = 8
RUN_ENDS = 300.0
"""How long a test waits for a run in a thread to end: a guard against a hang, far above any lock wait used here."""


def lost_bookie_ledgers(zk, zk_connect, bookie_fleet) -> dict[int, list[bytes]]:
    """LEDGERS ledgers on three bookies, a spare, and one of the three lost: every ledger marked."""
    victim, *_ = bookie_fleet.start(3)
    expected = asyncio.run(fill_ledgers(zk_connect, LEDGERS, 20, 256, SHAPE))
    bookie_fleet.start(1)
    assert sorted(lose_bookie(zk, victim)) == sorted(expected)
    return expected


def test_ledgers_another_repair_held_are_finished_in_the_same_run(spark, zk, zk_connect, bookie_fleet):
    """Another repair holds four ledgers' locks. Once the run did its own ledgers, that repair finishes two (clears
    their markers and lets go, in one transaction, as a repair's commit does) and lets go of two without clearing
    them (it failed on them). The run counts the first two done elsewhere, repairs the other two, and ends with
    nothing pending, in one run."""
    expected = lost_bookie_ledgers(zk, zk_connect, bookie_fleet)
    finished, failed = sorted(expected)[:2], sorted(expected)[2:4]
    other = zkclient.connect(zk_connect)
    try:
        other_repair = UnderReplication(other)
        assert other_repair.acquire_all([*finished, *failed], "the other repair") == {*finished, *failed}
        under_replication = UnderReplication(zk)
        with ThreadPoolExecutor(1) as pool:
            run = pool.submit(run_repair, zk_connect)
            wait_until(lambda: under_replication.ledger_ids() == sorted([*finished, *failed]), RUN_ENDS,
                       "the run's own ledgers repaired")
            for marker in other_repair.read_markers(finished).values():
                txn = other.transaction()
                other_repair.clear_in(txn, marker)
                assert other_repair.release_in(txn, marker.ledger_id)
                assert not any(isinstance(result, Exception) for result in txn.commit())
            for ledger_id in failed:
                other_repair.release(ledger_id)
            summary = run.result(RUN_ENDS)
    finally:
        other.stop()
        other.close()

    assert (summary.pending, summary.failures, summary.locked_elsewhere) == ([], [], [])
    assert summary.done_elsewhere == finished
    assert summary.ledgers == LEDGERS - len(finished)
    assert "2 done by another repair, 0 still marked, 0 failure(s)" in summary.lines()[0]
    assert under_replication.ledger_ids() == []
    repaired = {ledger_id: digests for ledger_id, digests in expected.items() if ledger_id not in finished}
    assert asyncio.run(verify_replicas(zk_connect, repaired)) == []


def test_a_dead_holders_ledgers_are_repaired_once_its_session_ends(spark, zk, zk_connect, bookie_fleet):
    """The other repair's driver dies holding locks: they go with its ZooKeeper session, and the run repairs the
    ledgers itself instead of ending with them still marked."""
    expected = lost_bookie_ledgers(zk, zk_connect, bookie_fleet)
    held = sorted(expected)[:3]
    other = zkclient.connect(zk_connect, timeout=ZK_SESSION_TIMEOUT)
    assert UnderReplication(other).acquire_all(held, "a driver about to die") == set(held)
    under_replication = UnderReplication(zk)
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(run_repair, zk_connect)
        try:
            wait_until(lambda: under_replication.ledger_ids() == held, RUN_ENDS, "the run's own ledgers repaired")
        finally:
            other.stop()  # its session ends with the connection; nobody releases anything
            other.close()
        summary = run.result(RUN_ENDS)

    assert (summary.pending, summary.failures, summary.done_elsewhere) == ([], [], [])
    assert summary.ledgers == LEDGERS
    assert under_replication.ledger_ids() == []
    assert asyncio.run(verify_replicas(zk_connect, expected)) == []


def test_a_holder_that_never_lets_go_leaves_its_ledgers_pending_after_the_wait(spark, zk, zk_connect, bookie_fleet):
    """A stuck holder keeps a run no longer than its lock wait; the run reports those ledgers still marked and
    locked elsewhere (the operator retries the bookie's repair as before), and repaired the rest."""
    expected = lost_bookie_ledgers(zk, zk_connect, bookie_fleet)
    held = sorted(expected)[:3]
    with ThreadPoolExecutor(1) as pool:
        other = zkclient.connect(zk_connect)
        try:
            assert UnderReplication(other).acquire_all(held, "a stuck repair") == set(held)
            summary = pool.submit(run_repair, zk_connect, lock_wait_s=2.0).result(RUN_ENDS)
            assert UnderReplication(zk).ledger_ids() == held
        finally:
            other.stop()  # also lets a run that overstayed its wait end
            other.close()

    assert (summary.pending, summary.locked_elsewhere, summary.done_elsewhere) == (held, held, [])
    assert (summary.ledgers, summary.failures) == (LEDGERS - len(held), [])
    assert "3 still marked (3 locked by another repair), 0 failure(s)" in summary.lines()[0]


def test_the_second_of_two_runs_that_finds_every_lock_held_ends_with_them_done(spark, zk_connect, bookie_fleet):
    """Two repairs at once, as the two Jobs of a lost zone's bookies: the first locks every marked ledger, the second
    starts while the first copies and finds every lock held. It waits, then counts them done by the first: no
    ledger pending, none repaired twice."""
    with zkclient.session(zk_connect) as zk:
        expected = lost_bookie_ledgers(zk, zk_connect, bookie_fleet)
    second_tried = threading.Event()
    with (
        zkclient.session(zk_connect, ZK_SESSION_TIMEOUT) as first_zk,
        zkclient.session(zk_connect, ZK_SESSION_TIMEOUT) as second_zk,
        ThreadPoolExecutor(2) as pool,
    ):
        first, second = RepairJob(first_zk), RepairJob(second_zk)
        copy, lock_and_plan = first.copy, second.lock_and_plan

        def copy_once_the_second_tried(*args):
            assert second_tried.wait(RUN_ENDS), "the second run never tried the locks"
            copy(*args)

        def tried(*args):
            try:
                return lock_and_plan(*args)
            finally:
                second_tried.set()

        first.copy, second.lock_and_plan = copy_once_the_second_tried, tried
        first_run = pool.submit(first.run, lambda planned_bytes: spark)
        wait_until(lambda: len(first.under_replication.held) == LEDGERS, RUN_ENDS, "the first run's locks")
        second_summary = pool.submit(second.run, lambda planned_bytes: spark).result(RUN_ENDS)
        first_summary = first_run.result(RUN_ENDS)

    assert (first_summary.ledgers, first_summary.pending, first_summary.failures) == (LEDGERS, [], [])
    assert second_summary.done_elsewhere == sorted(expected)
    assert (second_summary.ledgers, second_summary.pending, second_summary.failures) == (0, [], [])
    assert asyncio.run(verify_replicas(zk_connect, expected)) == []
