"""A whole zone lost, and back (tests/cluster/zoneloss.py), and its partition variant (tests/cluster/zonepartition.py),
as the cluster tier's long form: `make chaos` runs them, `make test` skips them. Each starts a local cluster of its own
(the tier's shared one has lost a node and a spare to earlier tests by then); each scenario's figures are printed as
one JSON line, the same as `make cluster-zone-loss` (`make cluster-zone-partition`) prints, and its timings are never
asserted."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import walkthrough, zoneloss, zonepartition
from tests.cluster.walkthrough import LocalCluster
from tests.cluster.zoneloss import ZoneLoss
from tests.cluster.zonepartition import ZonePartition
from tests.operatorbench import localcluster

LONG = "BOOKFLEET_CLUSTER_LONG"

pytestmark = [
    pytest.mark.cluster, pytest.mark.chaos, pytest.mark.timeout(5400),
    pytest.mark.skipif(not os.environ.get(LONG), reason=f"about 8 min on a local cluster of its own: {LONG}=1"
                                                        " (make chaos)"),
]


def on_own_cluster(request: pytest.FixtureRequest, scenario: Callable[[LocalCluster], Any],
                   report: Callable[[dict, dict], dict], process_zones: bool = False) -> Iterator[tuple[Any, dict]]:
    """A scenario run once on a cluster of its own, its outcome and figures (the cluster's logs kept if it or a test
    failed)."""
    if shutil.which("go") is None:
        pytest.skip("cluster tier: no Go toolchain on PATH to build Kubernetes from its modules")
    baseline = localcluster.machine_baseline()
    failed_before, scenario_failed = request.session.testsfailed, []
    with walkthrough.running_cluster(keep_logs=lambda: bool(scenario_failed)
                                     or request.session.testsfailed > failed_before,
                                     process_zones=process_zones) as cluster:
        try:
            walkthrough.install(cluster)
            outcome = scenario(cluster)
        except BaseException:
            scenario_failed.append(True)
            raise
        figures = outcome.figures()
        print(json.dumps(report(figures, baseline)), flush=True)  # make chaos runs with -s
        yield outcome, figures


@pytest.fixture(scope="module")
def zone_loss(request: pytest.FixtureRequest) -> Iterator[tuple[ZoneLoss, dict]]:
    yield from on_own_cluster(request, zoneloss.zone_loss, localcluster.zone_loss_report)


@pytest.fixture(scope="module")
def zone_partition(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[tuple[ZonePartition, dict]]:
    """Its histories (and porcupine's drawings of a violation) stay under $BOOKFLEET_CHAOS_DIR (`make chaos`:
    build/chaos) or in the test's temporary directory."""
    kept = os.environ.get("BOOKFLEET_CHAOS_DIR")
    history_dir = Path(kept).resolve() / "zone-partition" if kept else tmp_path_factory.mktemp("zone-partition")
    yield from on_own_cluster(request, lambda cluster: zonepartition.zone_partition(cluster, history_dir),
                              localcluster.zone_partition_report, zonepartition.PROCESS_ZONES)


@pytest.mark.parametrize("check", zoneloss.checks(zoneloss.LONG_FORM), ids=lambda check: check.__name__)
def test_zone_loss(zone_loss, check):
    check(*zone_loss)


def test_partition_loses_no_acknowledged_entry_and_the_inside_writers_acknowledged_entries_read_back(zone_partition):
    """Both writers' acknowledged adds and the filled ledgers, read back after the heal with what was written."""
    _, figures = zone_partition
    assert figures["inside_acks_before_partition"] > 0 and figures["taker_acks"] > 0, figures
    assert figures["inside_acks_not_read_back"] == 0, figures
    assert figures["entries_lost"] == 0, figures
    assert figures["entries_not_as_written"] == 0, figures


def test_partition_the_inside_writer_gets_no_acknowledgement_past_the_fence(zone_partition):
    """Its zone's one bookie of the ledger is short of Qa: the adds it waits for when cut off, or makes meanwhile,
    wait through the partition; after the heal those past the fence point fail (the ledger is fenced, the writer's
    lease gone), and no add past it is ever acknowledged. (One the bookies outside got before the cut may be
    acknowledged late: recovery found it, it lies within the fence point.)"""
    outcome, figures = zone_partition
    assert figures["inside_writer_ledger_bookies_in_zone"] == 1, figures
    assert figures["fence"] is not None, figures
    assert figures["inside_adds_cut_off"] > 0, figures
    assert outcome.inside_acks_past_fence() == [], outcome.inside_acks_past_fence()[:5]


def test_partition_every_affected_ledger_is_back_at_qw_and_the_heal_starts_no_repair(zone_partition):
    outcome, figures = zone_partition
    assert "affected_ledgers_at_qw" in outcome.seconds, figures
    assert figures["repairs_started_by_heal"] == 0, outcome.repairs_after_heal


def test_partition_history_of_both_writers_and_the_read_back_is_legal_for_one_writer(zone_partition):
    """The porcupine checker of the one-writer chaos run (tests/chaos/checker.py) on the three histories."""
    outcome, figures = zone_partition
    assert figures["history"]["acknowledged"] > 0, figures["history"]
    assert outcome.verdict is not None and outcome.verdict.legal, figures["history"]
