"""A whole zone lost, and back (tests/cluster/zoneloss.py), as the cluster tier's long form: `make chaos` runs it,
`make test` skips it. It starts a local cluster of its own (the tier's shared one has lost a node and a spare to
earlier tests by then); the scenario's figures are printed as one JSON line, the same as `make cluster-zone-loss`
prints, and its timings are never asserted."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator

import pytest

from tests.cluster import walkthrough, zoneloss
from tests.cluster.zoneloss import ZoneLoss
from tests.operatorbench import localcluster

LONG = "BOOKFLEET_CLUSTER_LONG"

pytestmark = [
    pytest.mark.cluster, pytest.mark.chaos, pytest.mark.timeout(5400),
    pytest.mark.skipif(not os.environ.get(LONG), reason=f"about 8 min on a local cluster of its own: {LONG}=1"
                                                        " (make chaos)"),
]


@pytest.fixture(scope="module")
def zone_loss(request: pytest.FixtureRequest) -> Iterator[tuple[ZoneLoss, dict]]:
    """The scenario run once on its own cluster, its outcome and figures (the cluster's logs kept if it or a test
    failed)."""
    if shutil.which("go") is None:
        pytest.skip("cluster tier: no Go toolchain on PATH to build Kubernetes from its modules")
    baseline = localcluster.machine_baseline()
    failed_before, scenario_failed = request.session.testsfailed, []
    with walkthrough.running_cluster(keep_logs=lambda: bool(scenario_failed)
                                     or request.session.testsfailed > failed_before) as cluster:
        try:
            walkthrough.install(cluster)
            outcome = zoneloss.zone_loss(cluster)
        except BaseException:
            scenario_failed.append(True)
            raise
        figures = outcome.figures()
        print(json.dumps(localcluster.zone_loss_report(figures, baseline)), flush=True)  # make chaos runs with -s
        yield outcome, figures


def test_no_acknowledged_entry_is_lost_and_every_entry_reads_back_as_written(zone_loss):
    _, figures = zone_loss
    assert figures["acknowledged_entries"] > 0
    assert figures["entries_lost"] == 0, figures
    assert figures["entries_not_as_written"] == 0, figures


def test_the_writer_kept_writing_through_the_cut_with_qa_reachable(zone_loss):
    """Any round that failed would have ended the writer pod Failed, and the scenario with it (client_log): rounds
    ran during the cut, and one after the repairs."""
    outcome, figures = zone_loss
    assert figures["writer_rounds_during_cut"] > 0, figures
    assert "writer_round_after_repairs" in outcome.seconds, figures


def test_exactly_the_ledgers_with_a_replica_in_the_zone_are_marked_and_back_at_qw_on_the_zones_left(zone_loss):
    outcome, figures = zone_loss
    assert "affected_ledgers_at_qw" in outcome.seconds, figures
    assert outcome.marked == outcome.spread.keys(), figures  # the ledgers kept off the zone were never marked
    # Three replicas on two zones: every write set shares a zone now, and the Ledger's status says so.
    assert all(counts and min(counts) >= 1 for counts in outcome.sharing_after.values()), outcome.sharing_after


def test_the_return_starts_no_repair_and_its_bookies_rejoin_on_their_volumes(zone_loss):
    """The cut bookies ran on, cut off from ZooKeeper for minutes, and rejoin without a restart."""
    outcome, figures = zone_loss
    assert figures["repairs_started_by_return"] == 0, outcome.repairs_after_return
    assert figures["volumes_kept_through_return"], (outcome.claims_before, outcome.claims_after)
    assert figures["bookies_rejoined"] == sorted(outcome.returned), outcome.returned
    assert set(outcome.restarts.values()) == {0}, outcome.restarts


def test_the_returning_bookies_copies_of_ledgers_repaired_away_are_garbage_collected(zone_loss):
    """Every affected ledger had its replica in the zone on one of its bookies: the stale copies include them all."""
    outcome, figures = zone_loss
    assert set().union(*outcome.stale.values()) >= set(outcome.spread.values()), outcome.stale
    assert "stale_copies_reclaimed" in outcome.seconds_after_return, figures
    assert figures["stale_copies_left"] == 0, outcome.stale_left
