"""The operator's metrics: passes and errors counted around each reconciliation, decisions counted where their Events
are posted, ledger health summed per namespace (the scrape of a running operator is in test_operator.py)."""

from __future__ import annotations

import pytest

from bookfleet.kube import metrics
from bookfleet.kube.actions import PostEvent, act
from bookfleet.kube.api import KubeApi
from bookfleet.kube.context import OperatorContext
from bookfleet.kube.ledgers import RecordLedgerHealth


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


def test_a_pass_is_counted_timed_and_its_error_counted():
    passes, errors = (sample("bookfleet_operator_reconciles_total", resource="unit"),
                      sample("bookfleet_operator_reconcile_errors_total", resource="unit"))
    with metrics.reconciling("unit"):
        pass
    with pytest.raises(RuntimeError), metrics.reconciling("unit"):
        raise RuntimeError("ZooKeeper went away")
    assert sample("bookfleet_operator_reconciles_total", resource="unit") == passes + 2
    assert sample("bookfleet_operator_reconcile_errors_total", resource="unit") == errors + 1
    assert sample("bookfleet_operator_reconcile_seconds_count", resource="unit") >= 2


def test_posted_events_count_and_a_bookie_repair_counts_once_not_per_ledger():
    def counts() -> tuple[float, ...]:
        return (sample("bookfleet_operator_events_total", kind="Bookie", reason="RepairLaunched", type="Normal"),
                sample("bookfleet_operator_repairs_total", outcome="launched"),
                sample("bookfleet_operator_repairs_total", outcome="failed"),
                sample("bookfleet_operator_bookies_lost_total"),
                sample("bookfleet_operator_events_total", kind="Ledger", reason="RepairLaunched", type="Normal"))

    before = counts()
    bookie = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Bookie", "metadata": {"name": "bk-0", "namespace": "ns"}}
    ledger = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger", "metadata": {"name": "l", "namespace": "ns"}}
    ctx = OperatorContext(EventApi())
    act(ctx, bookie, [PostEvent("BookieLost", "pod gone", warning=True), PostEvent("RepairLaunched", "job"),
                      PostEvent("RepairFailed", "job failed", warning=True)])
    act(ctx, ledger, [PostEvent("RepairLaunched", "job repairs this ledger")])
    act(ctx, ledger, [PostEvent("RepairLaunched", "job", involved=bookie)])
    ctx.api.post_event(bookie, "RepairLaunched", "an action that posts its own Event")
    assert tuple(after - was for after, was in zip(counts(), before, strict=True)) == (3, 3, 1, 1, 1)


def test_ledger_health_is_summed_per_namespace_and_forgotten_with_the_ledger():
    ctx = OperatorContext(EventApi())
    for name, health in (("a", RecordLedgerHealth(True, False)), ("b", RecordLedgerHealth(True, True)),
                         ("c", RecordLedgerHealth())):
        act(ctx, {"metadata": {"name": name, "namespace": "health"}}, [health])
    assert sample("bookfleet_operator_ledgers_under_replicated", namespace="health") == 2
    assert sample("bookfleet_operator_ledgers_data_loss", namespace="health") == 1
    act(ctx, {"metadata": {"name": "a", "namespace": "health"}}, [RecordLedgerHealth()])  # repaired
    metrics.LEDGERS.forget("health", "b")
    for gauge in ("bookfleet_operator_ledgers_under_replicated", "bookfleet_operator_ledgers_data_loss"):
        assert metrics.REGISTRY.get_sample_value(gauge, {"namespace": "health"}) == 0  # shown as 0, not left out
