"""The operator's decisions as pure functions: every phase of BookieCluster, Bookie and Ledger from observed state,
with no API server and no ZooKeeper (BookieCluster: test_bookiecluster_reconciler_decisions.py; end to end:
test_operator.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from bookfleet.kube import bookies, ledgers, resources
from bookfleet.kube.models import Bookie, BookieCluster, BookiePhase, DesiredState
from bookfleet.meta.metadata import LedgerState, new_metadata
from bookfleet.meta.registry import BookieInfo, BookieMode
from bookfleet.meta.underreplication import Marker

LOST_AT = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def cluster(replicas: int = 3) -> BookieCluster:
    return BookieCluster.model_validate({"metadata": {"name": "bk", "namespace": "default", "uid": "c1"},
                                         "spec": {"replicas": replicas, "zookeeper": "zk:2181"}})


def bookie(desired: DesiredState = DesiredState.WRITABLE, lost_since: dt.datetime | None = None) -> Bookie:
    manifest = resources.bookies_for_cluster(cluster())[0]
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


def test_ledger_status_says_which_write_sets_hold_two_replicas_in_one_zone():
    """After a zone outage, repairs onto the zones left may put two replicas of a write set in one zone: the status
    says so per segment, from the bookies' zones (round-robin by ordinal), known also while they are lost."""
    zoned = cluster(6).model_copy(update={"spec": cluster(6).spec.model_copy(
        update={"zones": ["zone-a", "zone-b", "zone-c"]})})
    zones = ledgers.bookie_zones(zoned)
    ids = [b["spec"]["bookieId"] for b in resources.bookies_for_cluster(zoned)]
    assert [zones[b] for b in ids] == ["zone-a", "zone-b", "zone-c"] * 2
    spread, crowded = new_metadata(ids[:3], 3, 2), new_metadata([ids[1], ids[2], ids[4]], 3, 2)
    assert [s["writeSetsSharingAZone"] for s in ledgers.decide_status(7, spread, None, None, zones)["segments"]] == [0]
    assert [s["writeSetsSharingAZone"] for s in ledgers.decide_status(7, crowded, None, None, zones)["segments"]] \
        == [3]
    assert "writeSetsSharingAZone" not in ledgers.decide_status(7, spread, None, None, {})["segments"][0]


def test_ledger_status_mirrors_metadata_markers_and_repairs():
    metadata = new_metadata(["b1", "b2"], 2, 2)
    fresh = ledgers.decide_status(7, metadata, None, None)
    assert (fresh["ledgerId"], fresh["state"], fresh["lastEntryId"]) == (7, LedgerState.OPEN.value, -1)
    assert fresh["segments"] == [{"firstEntryId": 0, "bookies": ["b1", "b2"]}]
    assert fresh["underReplicated"] is None and fresh["repair"] is None

    closed = metadata.model_copy(update={"state": LedgerState.CLOSED, "last_entry_id": 9, "length": 90})
    marker = Marker(7, frozenset({"b2"}), int(LOST_AT.timestamp() * 1000), 0)
    job = {"metadata": {"name": "repair-1", "creationTimestamp": "2026-01-02T03:05:00Z",
                        "annotations": {"bookfleet.io/repair-attempt": "1"}},
           "status": {"conditions": [{"type": "Complete", "status": "True",
                                      "lastTransitionTime": "2026-01-02T03:06:00Z"}]}}
    earlier = {"metadata": {"name": "repair-0", "creationTimestamp": "2026-01-02T03:04:30Z",
                            "annotations": {"bookfleet.io/repair-attempt": "0"}}, "status": {"failed": 1}}
    repaired = ledgers.decide_status(7, closed, marker, ledgers.repair_status([job, earlier]))
    assert (repaired["state"], repaired["lastEntryId"], repaired["length"]) == ("CLOSED", 9, 90)
    assert repaired["underReplicated"] == {"missingBookies": ["b2"], "since": "2026-01-02T03:04:05Z"}
    assert repaired["repair"] == {"job": "repair-1", "bookieId": None, "state": "Succeeded",
                                  "started": "2026-01-02T03:05:00Z",
                                  "finished": "2026-01-02T03:06:00Z", "attempts": 2}


def test_the_operator_lists_its_resources_in_pages_at_start_up():
    """kopf's first LIST of each watched resource is paginated: 100,000 Ledgers are not one response held whole."""
    import kopf

    from bookfleet.kube import handlers

    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings)
    assert settings.watching.chunk_size is not None and 0 < settings.watching.chunk_size <= 1000
