"""The operator's metrics: passes and errors counted around each reconciliation, decisions counted where their Events
are posted, each under its BookieCluster; a fleet's health from ZooKeeper (the scrape of a running operator is in
test_operator.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from bookfleet.kube.reconcilers import clusters
from bookfleet.kube.reconcilers.actions import PostEvent, act
from bookfleet.kube.runtime import metrics
from bookfleet.kube.runtime.api import KubeApi
from bookfleet.kube.runtime.context import OperatorContext
from bookfleet.meta.underreplication import UnderReplication


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


class EventApi(KubeApi):
    """The real post_event; the Event object it would create goes nowhere."""

    def __init__(self) -> None:
        super().__init__(client=object())  # type: ignore[arg-type]

    def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> dict | None:
        raise AssertionError("the chart's ServiceAccount may create Events, not read them")

    def create(self, manifest: dict) -> dict:
        return manifest


BOOKIE = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Bookie", "metadata": {"name": "bk-0", "namespace": "ns"},
          "spec": {"cluster": "bk"}}


def test_a_pass_is_counted_timed_and_its_error_counted_under_its_cluster():
    cluster = {"metadata": {"name": "unit", "namespace": "ns"}}  # kopf's body of a BookieCluster: its own name
    labels = {"resource": "bookieclusters", "namespace": "ns", "bookiecluster": "unit"}
    passes, errors = (sample("bookfleet_operator_reconciles_total", **labels),
                      sample("bookfleet_operator_reconcile_errors_total", **labels))
    with metrics.reconciling("bookieclusters", cluster):
        pass
    with pytest.raises(RuntimeError), metrics.reconciling("bookieclusters", cluster):
        raise RuntimeError("ZooKeeper went away")
    assert sample("bookfleet_operator_reconciles_total", **labels) == passes + 2
    assert sample("bookfleet_operator_reconcile_errors_total", **labels) == errors + 1
    assert sample("bookfleet_operator_reconcile_seconds_count", **labels) >= 2
    with metrics.reconciling("bookies", BOOKIE):  # a Bookie's pass counts under its spec.cluster
        pass
    assert sample("bookfleet_operator_reconciles_total", resource="bookies", namespace="ns", bookiecluster="bk") >= 1


def test_posted_events_count_under_their_cluster_and_a_bookie_repair_counts_once_not_per_ledger():
    fleet = {"namespace": "ns", "bookiecluster": "bk"}

    def counts() -> tuple[float, ...]:
        return (sample("bookfleet_operator_events_total", kind="Bookie", reason="RepairLaunched", type="Normal",
                       **fleet),
                sample("bookfleet_operator_repairs_total", outcome="launched", **fleet),
                sample("bookfleet_operator_repairs_total", outcome="failed", **fleet),
                sample("bookfleet_operator_repairs_total", outcome="gave_up", **fleet),
                sample("bookfleet_operator_bookies_lost_total", **fleet),
                sample("bookfleet_operator_events_total", kind="Ledger", reason="RepairLaunched", type="Normal",
                       **fleet))

    before = counts()
    ledger = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger", "metadata": {"name": "l", "namespace": "ns"},
              "spec": {"cluster": "bk"}}
    ctx = OperatorContext(EventApi())
    act(ctx, BOOKIE, [PostEvent("BookieLost", "pod gone", warning=True), PostEvent("RepairLaunched", "job"),
                      PostEvent("RepairFailed", "job failed", warning=True),
                      PostEvent("RepairGaveUp", "failed 6 times", warning=True)])
    act(ctx, ledger, [PostEvent("RepairLaunched", "job repairs this ledger")])
    act(ctx, ledger, [PostEvent("RepairLaunched", "job", involved=BOOKIE)])
    ctx.api.post_event(BOOKIE, "RepairLaunched", "an action that posts its own Event")
    assert tuple(after - was for after, was in zip(counts(), before, strict=True)) == (3, 3, 1, 1, 1, 1)


def test_a_fleets_health_is_served_per_cluster_with_the_oldest_markers_age_at_the_scrape():
    clock = [1_000.0]
    fleets = metrics.Fleets(clock=lambda: clock[0])
    registry = CollectorRegistry()
    registry.register(fleets)
    fleets.record("ns", "bk", metrics.FleetHealth(3, 1, 400_000, {"a": 2, "b": 0}, rollout_stuck=True,
                                                  repairs_given_up=1))
    fleets.record("ns", "calm", metrics.FleetHealth())
    fleet = {"namespace": "ns", "bookiecluster": "bk"}

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("bookfleet_operator_ledgers_under_replicated", **fleet) == 3
    assert value("bookfleet_operator_ledgers_data_loss", **fleet) == 1
    assert value("bookfleet_operator_oldest_under_replicated_seconds", **fleet) == 600
    clock[0] += 60
    assert value("bookfleet_operator_oldest_under_replicated_seconds", **fleet) == 660  # the age grows between passes
    assert (value("bookfleet_operator_writable_bookies", zone="a", **fleet),
            value("bookfleet_operator_writable_bookies", zone="b", **fleet)) == (2, 0)
    assert value("bookfleet_operator_rollout_stuck", **fleet) == 1
    assert value("bookfleet_operator_repairs_given_up", **fleet) == 1
    calm = {"namespace": "ns", "bookiecluster": "calm"}
    assert (value("bookfleet_operator_ledgers_under_replicated", **calm),
            value("bookfleet_operator_oldest_under_replicated_seconds", **calm)) == (0, 0)  # shown, not left out
    fleets.forget("ns", "bk")  # its loop stopped in this replica: another one serves it
    assert value("bookfleet_operator_ledgers_under_replicated", **fleet) is None


def test_the_facts_count_every_marked_ledger_in_zookeeper_not_only_ledger_resources(zk):
    """Ledgers clients create directly (all of Pulsar's) have no Ledger resource: the marker and DATA_LOSS trees are
    read through meta, so each counts."""
    assert clusters.FleetFacts.read(zk) == clusters.FleetFacts()
    under_replication = UnderReplication(zk)
    first = under_replication.mark(7, ["b1:3181"])
    under_replication.mark(1 << 40, ["b2:3181"], lost=True)
    under_replication.mark_data_loss(9, [0, 1])
    facts = clusters.FleetFacts.read(zk)
    assert (facts.under_replicated, facts.data_loss, facts.oldest_marker_ms) == (2, 1, first.ctime)
