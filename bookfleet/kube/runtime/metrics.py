"""The operator's Prometheus metrics, in one registry served by `bookfleet operator --metrics-port`.

Every metric carries the BookieCluster it is about (labels `namespace` and `bookiecluster`), so alerts and dashboards
say which fleet. Counted in two places only: each reconciliation pass (`reconciling`, around every timer handler) and
each decision the act step announces as an Event (`record_event`, from `KubeApi.post_event`, which `actions.PostEvent`
and every other action that posts one go through), so a reconciler adds no metric code of its own. A fleet's health
(`FleetHealth`: what its ZooKeeper's under-replication markers, DATA_LOSS records and registrations say, every
ledger counted whether or not a Ledger resource shows it, and its rollout and repairs) is set by each cluster pass's
act step and served by `Fleets` until the cluster's loop stops in this replica.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from bookfleet.kube.resources.names import LABEL_CLUSTER

REGISTRY = CollectorRegistry()
CLUSTER_LABELS = ("namespace", "bookiecluster")
"""`bookiecluster`, not `cluster`: Prometheus setups that gather many Kubernetes clusters keep `cluster` for those."""

RECONCILES = Counter("bookfleet_operator_reconciles", "Reconciliation passes, by resource",
                     ["resource", *CLUSTER_LABELS], registry=REGISTRY)
RECONCILE_ERRORS = Counter("bookfleet_operator_reconcile_errors",
                           "Reconciliation passes that raised (the next pass starts over)",
                           ["resource", *CLUSTER_LABELS], registry=REGISTRY)
RECONCILE_SECONDS = Histogram("bookfleet_operator_reconcile_seconds", "Duration of one reconciliation pass",
                              ["resource", *CLUSTER_LABELS], registry=REGISTRY)
EVENTS = Counter("bookfleet_operator_events", "Kubernetes Events posted: one per decision, by kind and reason",
                 ["kind", "reason", "type", *CLUSTER_LABELS], registry=REGISTRY)
THROTTLED = Counter("bookfleet_operator_api_throttled",
                    "Requests the API server answered 429 Too Many Requests (each sent again after its Retry-After)",
                    registry=REGISTRY)
"""The API server's, not one cluster's: the only metric without a cluster label."""
BOOKIES_LOST = Counter("bookfleet_operator_bookies_lost", "Bookies declared lost", CLUSTER_LABELS, registry=REGISTRY)
REPAIRS = Counter("bookfleet_operator_repairs", "Repairs of lost bookies: launched, succeeded, failed, gave_up",
                  ["outcome", *CLUSTER_LABELS], registry=REGISTRY)

COUNTED_EVENTS: dict[tuple[str, str], tuple[Counter, tuple[str, ...]]] = {
    ("Bookie", "BookieLost"): (BOOKIES_LOST, ()),
    ("Bookie", "RepairLaunched"): (REPAIRS, ("launched",)),
    ("Bookie", "RepairSucceeded"): (REPAIRS, ("succeeded",)),
    ("Bookie", "RepairFailed"): (REPAIRS, ("failed",)),
    ("Bookie", "RepairGaveUp"): (REPAIRS, ("gave_up",)),
}
"""Events (kind, reason) that also count in a named metric; a repair covers many ledgers, so its outcome is counted
once, on the Bookie's Event, never on each Ledger's."""


def cluster_of(body: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, BookieCluster name) of an object: a BookieCluster's own name, a Bookie's or Ledger's
    spec.cluster, else the operator's cluster label ("" when it has none)."""
    meta = body.get("metadata") or {}
    if body.get("kind") == "BookieCluster":
        name = meta.get("name", "")
    else:
        name = (body.get("spec") or {}).get("cluster") or (meta.get("labels") or {}).get(LABEL_CLUSTER, "")
    return meta.get("namespace", ""), name


def record_event(involved: Mapping[str, Any], reason: str, warning: bool) -> None:
    """Count one decision the act step posted as an Event about `involved`."""
    fleet = cluster_of(involved)
    kind = involved.get("kind", "")
    EVENTS.labels(kind, reason, "Warning" if warning else "Normal", *fleet).inc()
    named = COUNTED_EVENTS.get((kind, reason))
    if named is not None:
        counter, labels = named
        counter.labels(*labels, *fleet).inc()


@contextmanager
def reconciling(resource: str, body: Mapping[str, Any]) -> Iterator[None]:
    """Count and time one pass over `body`, a `resource` (plural); an exception is counted as an error and
    re-raised."""
    labels = (resource, *cluster_of({"kind": "BookieCluster", **body} if resource == "bookieclusters" else body))
    RECONCILES.labels(*labels).inc()
    started = time.monotonic()
    try:
        yield
    except Exception:
        RECONCILE_ERRORS.labels(*labels).inc()
        raise
    finally:
        RECONCILE_SECONDS.labels(*labels).observe(time.monotonic() - started)


@dataclass(frozen=True)
class FleetHealth:
    """What a cluster pass saw of its fleet: the figures its alerts are on (charts/bookfleet, the PrometheusRule)."""

    under_replicated: int = 0
    """Ledgers with an under-replication marker in ZooKeeper (every ledger, with or without a Ledger resource)."""
    data_loss: int = 0
    """Ledgers with a DATA_LOSS record."""
    oldest_marker_ms: int | None = None
    """When (ms since the epoch) the oldest marker was made; None: nothing is marked."""
    writable_by_zone: Mapping[str, int] = field(default_factory=dict)
    """Writable registered bookies per zone ("" for bookies without one); the cluster's zones show 0 when empty."""
    rollout_stuck: bool = False
    repairs_given_up: int = 0
    """Bookies whose repair (of a loss or a drain) failed every attempt and waits for a person."""


class Fleets(Collector):
    """Each cluster's latest `FleetHealth`, as gauges; the oldest marker's age is computed at the scrape."""

    def __init__(self, clock=time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._fleets: dict[tuple[str, str], FleetHealth] = {}

    def record(self, namespace: str, name: str, health: FleetHealth) -> None:
        with self._lock:
            self._fleets[(namespace, name)] = health

    def forget(self, namespace: str, name: str) -> None:
        """The cluster's loop stopped here (deleted, or another replica acts for it): its figures are not ours."""
        with self._lock:
            self._fleets.pop((namespace, name), None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = list(CLUSTER_LABELS)
        under = GaugeMetricFamily("bookfleet_operator_ledgers_under_replicated",
                                  "Ledgers with a copy missing on some bookie (ZooKeeper's markers)", labels=labels)
        lost = GaugeMetricFamily("bookfleet_operator_ledgers_data_loss",
                                 "Ledgers with entries no replica holds any more (DATA_LOSS records)", labels=labels)
        oldest = GaugeMetricFamily("bookfleet_operator_oldest_under_replicated_seconds",
                                   "Age of the oldest under-replication marker (0: none)", labels=labels)
        writable = GaugeMetricFamily("bookfleet_operator_writable_bookies", "Writable registered bookies, by zone",
                                     labels=[*labels, "zone"])
        stuck = GaugeMetricFamily("bookfleet_operator_rollout_stuck", "1 while the cluster's rollout is halted",
                                  labels=labels)
        gave_up = GaugeMetricFamily("bookfleet_operator_repairs_given_up",
                                    "Bookies whose repair failed every attempt (a person must look)", labels=labels)
        with self._lock:
            fleets = sorted(self._fleets.items())
        now_ms = self._clock() * 1000
        for key, health in fleets:
            under.add_metric(key, health.under_replicated)
            lost.add_metric(key, health.data_loss)
            age = 0.0 if health.oldest_marker_ms is None else max(0.0, (now_ms - health.oldest_marker_ms) / 1000)
            oldest.add_metric(key, age)
            for zone, count in sorted(health.writable_by_zone.items()):
                writable.add_metric([*key, zone], count)
            stuck.add_metric(key, int(health.rollout_stuck))
            gave_up.add_metric(key, health.repairs_given_up)
        yield from (under, lost, oldest, writable, stuck, gave_up)


FLEETS = Fleets()
REGISTRY.register(FLEETS)


def serve(port: int, address: str = "0.0.0.0") -> None:
    """Serve /metrics on `port` from a daemon thread (the process's life)."""
    start_http_server(port, addr=address, registry=REGISTRY)
