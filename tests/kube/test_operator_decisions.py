"""The operator's decisions as pure functions: a Bookie's status from observed state, with no API server and no
ZooKeeper, and the kopf settings the handlers register (BookieCluster: test_bookiecluster_reconciler_decisions.py;
the Bookie's whole pass: test_bookie_reconciler_decisions.py; Ledgers: test_ledger_decisions.py; end to end:
test_operator.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from bookfleet.kube import bookies, resources
from bookfleet.kube.models import Bookie, BookiePhase, DesiredState
from bookfleet.meta.registry import BookieInfo, BookieMode
from tests.fixtures.models import bookie_cluster

LOST_AT = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def bookie(desired: DesiredState = DesiredState.WRITABLE, lost_since: dt.datetime | None = None) -> Bookie:
    manifest = resources.bookies_for_cluster(bookie_cluster())[0]
    manifest["spec"]["desiredState"] = desired.value
    return Bookie.model_validate({**manifest, "status": {"lostSince": lost_since}})


def ready_pod(name: str = "bk-0") -> dict:
    return {"metadata": {"name": name, "uid": "u1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def registration(mode: BookieMode = BookieMode.WRITABLE, free: int = 0) -> BookieInfo:
    return BookieInfo(bookie_id="bk-0", address="127.0.0.1:3181", state=mode, free_bytes=free)


@pytest.mark.parametrize(
    ("desired", "lost_since", "pod", "info", "phase"),
    [
        (DesiredState.WRITABLE, None, None, None, BookiePhase.PENDING),  # new: no pod yet
        (DesiredState.WRITABLE, None, ready_pod(), None, BookiePhase.PENDING),  # pod ready, not registered yet
        (DesiredState.WRITABLE, None, {"metadata": {"name": "bk-0"}}, registration(), BookiePhase.PENDING),
        (DesiredState.WRITABLE, None, ready_pod(), registration(), BookiePhase.RUNNING),
        (DesiredState.WRITABLE, None, ready_pod(), registration(BookieMode.READ_ONLY), BookiePhase.READ_ONLY),
        (DesiredState.WRITABLE, LOST_AT, None, None, BookiePhase.LOST),
        (DesiredState.WRITABLE, LOST_AT, ready_pod(), registration(), BookiePhase.LOST),  # until the loss is cleared
        (DesiredState.READ_ONLY, None, ready_pod(), registration(BookieMode.READ_ONLY), BookiePhase.DECOMMISSIONING),
        (DesiredState.READ_ONLY, LOST_AT, None, None, BookiePhase.DECOMMISSIONING),
    ],
)
def test_bookie_phase(desired, lost_since, pod, info, phase):
    status = bookies.decide_status(bookie(desired, lost_since), pod, info, 4, lost_since)
    assert status["phase"] == phase.value
    assert status["registered"] == (info is not None) and status["ledgers"] == 4
    assert status["pod"] == ("bk-0" if pod else None)


def test_bookie_disk_usage_comes_from_its_registration():
    quota = resources.quantity_bytes(bookie().spec.storage.ledgers.size)
    status = bookies.decide_status(bookie(), ready_pod(), registration(free=quota // 4), 0, None)
    assert status["diskUsage"] == 0.75
    assert bookies.decide_status(bookie(), None, None, 0, None)["diskUsage"] is None


def test_the_operator_lists_its_resources_in_pages_at_start_up():
    """kopf's first LIST of each watched resource is paginated: 100,000 Ledgers are not one response held whole."""
    import kopf

    from bookfleet.kube import handlers

    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings)
    assert settings.watching.chunk_size is not None and 0 < settings.watching.chunk_size <= 1000
