"""The operator's Prometheus metrics, in one registry served by `bookfleet operator --metrics-port`.

Counted in two places only: each reconciliation pass (`reconciling`, around every timer handler) and each decision the
act step announces as an Event (`record_event`, from `KubeApi.post_event`, which `actions.PostEvent` and every other
action that posts one go through), so a reconciler adds no metric code of its own. Ledger health is a gauge per Ledger
resource, set by the Ledger reconciler's act step and summed at scrape time.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry()

RECONCILES = Counter("bookfleet_operator_reconciles", "Reconciliation passes, by resource", ["resource"],
                     registry=REGISTRY)
RECONCILE_ERRORS = Counter("bookfleet_operator_reconcile_errors",
                           "Reconciliation passes that raised (the next pass starts over)", ["resource"],
                           registry=REGISTRY)
RECONCILE_SECONDS = Histogram("bookfleet_operator_reconcile_seconds", "Duration of one reconciliation pass",
                              ["resource"], registry=REGISTRY)
EVENTS = Counter("bookfleet_operator_events", "Kubernetes Events posted: one per decision, by kind and reason",
                 ["kind", "reason", "type"], registry=REGISTRY)
THROTTLED = Counter("bookfleet_operator_api_throttled",
                    "Requests the API server answered 429 Too Many Requests (each sent again after its Retry-After)",
                    registry=REGISTRY)
BOOKIES_LOST = Counter("bookfleet_operator_bookies_lost", "Bookies declared lost", registry=REGISTRY)
REPAIRS = Counter("bookfleet_operator_repairs", "Repairs of lost bookies: launched, succeeded, failed", ["outcome"],
                  registry=REGISTRY)

COUNTED_EVENTS: dict[tuple[str, str], tuple[Counter, tuple[str, ...]]] = {
    ("Bookie", "BookieLost"): (BOOKIES_LOST, ()),
    ("Bookie", "RepairLaunched"): (REPAIRS, ("launched",)),
    ("Bookie", "RepairSucceeded"): (REPAIRS, ("succeeded",)),
    ("Bookie", "RepairFailed"): (REPAIRS, ("failed",)),
}
"""Events (kind, reason) that also count in a named metric; a repair covers many ledgers, so its outcome is counted
once, on the Bookie's Event, never on each Ledger's."""


def record_event(kind: str, reason: str, warning: bool) -> None:
    """Count one decision the act step posted as an Event."""
    EVENTS.labels(kind, reason, "Warning" if warning else "Normal").inc()
    named = COUNTED_EVENTS.get((kind, reason))
    if named is not None:
        counter, labels = named
        (counter.labels(*labels) if labels else counter).inc()


@contextmanager
def reconciling(resource: str) -> Iterator[None]:
    """Count and time one pass over a `resource` (plural); an exception is counted as an error and re-raised."""
    RECONCILES.labels(resource).inc()
    started = time.monotonic()
    try:
        yield
    except Exception:
        RECONCILE_ERRORS.labels(resource).inc()
        raise
    finally:
        RECONCILE_SECONDS.labels(resource).observe(time.monotonic() - started)


class LedgerHealth(Collector):
    """Under-replicated and data-loss Ledgers per namespace, from each Ledger's latest pass. Only the unhealthy ones
    are held, and the namespaces seen (a 0 for each): the flags of 100,000 healthy Ledgers took 16 MB and every
    scrape walked them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._namespaces: set[str] = set()
        self._under_replicated: set[tuple[str, str]] = set()
        self._data_loss: set[tuple[str, str]] = set()

    def record(self, namespace: str, name: str, under_replicated: bool, data_loss: bool) -> None:
        key = (namespace, name)
        with self._lock:
            self._namespaces.add(namespace)
            for held, flagged in ((self._under_replicated, under_replicated), (self._data_loss, data_loss)):
                if flagged:
                    held.add(key)
                else:
                    held.discard(key)

    def forget(self, namespace: str, name: str) -> None:
        """The Ledger resource is gone: it no longer counts."""
        with self._lock:
            self._under_replicated.discard((namespace, name))
            self._data_loss.discard((namespace, name))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        under = GaugeMetricFamily("bookfleet_operator_ledgers_under_replicated",
                                  "Ledgers with a copy missing on some bookie", labels=["namespace"])
        lost = GaugeMetricFamily("bookfleet_operator_ledgers_data_loss",
                                 "Ledgers with entries no replica holds any more", labels=["namespace"])
        with self._lock:
            namespaces = sorted(self._namespaces)
            under_counts = collections.Counter(namespace for namespace, _ in self._under_replicated)
            lost_counts = collections.Counter(namespace for namespace, _ in self._data_loss)
        for namespace in namespaces:
            under.add_metric([namespace], under_counts[namespace])
            lost.add_metric([namespace], lost_counts[namespace])
        yield under
        yield lost


LEDGERS = LedgerHealth()
REGISTRY.register(LEDGERS)


def serve(port: int, address: str = "0.0.0.0") -> None:
    """Serve /metrics on `port` from a daemon thread (the process's life)."""
    start_http_server(port, addr=address, registry=REGISTRY)
