"""The replica audit job finds replicas that are gone although their bookie is up, and marks those ledgers."""

from __future__ import annotations

import asyncio

import pytest

from bookfleet import wire
from bookfleet.bench.repair import LedgerShape, fill_ledgers, verify_replicas
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import MetadataStore
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.replication.spark_audit import run_audit
from bookfleet.replication.spark_repair import run_repair
from tests.fixtures.bookies import lose_bookie

pytestmark = pytest.mark.spark


def test_audit_marks_ledgers_whose_bookie_lost_its_data(spark, zk, zk_connect, bookie_fleet):
    bookies = bookie_fleet.start(4)
    expected = asyncio.run(fill_ledgers(zk_connect, 8, 12, 300, LedgerShape(3, 2, 2)))

    healthy = run_audit(zk_connect)
    assert (healthy.ledgers, healthy.fragments, healthy.entries) == (8, 8, 8 * 12)
    assert healthy.replicas == 8 * 12 * 2 and healthy.marked == {} and healthy.failures == []

    # the bookie comes back on empty disks under its old id: registered and serving, but holding nothing
    victim = bookies[0]
    victim.stop()
    victim.wipe()
    zk.delete(zkpaths.cookie(victim.bookie_id))
    victim.start().wait_ready()
    on_victim = MetadataStore(zk).ledgers_on_bookie(victim.bookie_id)
    assert on_victim

    sampled = run_audit(zk_connect, sample=0.25)
    assert sorted(sampled.marked) == on_victim and sampled.entries < healthy.entries
    full = run_audit(zk_connect)
    assert full.marked == {ledger_id: [victim.bookie_id] for ledger_id in on_victim}
    assert "short on" in full.lines()[1]
    under_replication = UnderReplication(zk)
    assert [(m.ledger_id, set(m.missing_bookies)) for m in under_replication.markers()] == [
        (ledger_id, {victim.bookie_id}) for ledger_id in on_victim
    ]

    # and the repair job puts the replicas back (on the one bookie outside each ensemble)
    summary = run_repair(zk_connect)
    assert summary.failures == [] and summary.ledgers == len(on_victim)
    assert under_replication.ledger_ids() == []
    assert asyncio.run(verify_replicas(zk_connect, expected)) == []
    assert run_audit(zk_connect).marked == {}

    # a bookie that cannot be asked (stopped: unregistered, its last known address refuses) is a failure, not a mark
    silent = bookies[1]
    silent.stop()
    unreachable = run_audit(zk_connect)
    assert unreachable.marked == {} and under_replication.ledger_ids() == []
    assert unreachable.failures and all(silent.bookie_id in failure for failure in unreachable.failures)


def test_ledgers_of_every_digest_type_are_audited_and_repaired_with_their_own_passwords(
    spark, zk, zk_connect, bookie_fleet
):
    """Each ledger's digest type and password come from its metadata, as BookKeeper's replication worker takes them:
    no password is configured anywhere, and each ledger has its own."""
    victim, *_ = bookie_fleet.start(4)
    expected = {}
    for number, digest_type in enumerate(wire.DigestType):
        shape = LedgerShape(3, 2, 2, digest_type, b"password %d" % number)
        expected |= asyncio.run(fill_ledgers(zk_connect, 2, 9, 200, shape))

    healthy = run_audit(zk_connect)
    assert (healthy.ledgers, healthy.marked, healthy.failures) == (len(expected), {}, [])

    on_victim = lose_bookie(zk, victim)
    summary = run_repair(zk_connect)
    assert (summary.failures, summary.data_loss, summary.ledgers) == ([], {}, len(on_victim))
    assert asyncio.run(verify_replicas(zk_connect, expected)) == []
    assert run_audit(zk_connect).marked == {}
