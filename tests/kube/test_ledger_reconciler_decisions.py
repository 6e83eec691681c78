"""Every transition of a Ledger, decided in pure code: observed state + now -> actions, status and Events, with no API
server and no ZooKeeper (the operator running them end to end is in test_operator.py)."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from bookfleet.kube import resources
from bookfleet.kube.models import Ledger
from bookfleet.kube.reconcilers import ledgers
from bookfleet.kube.reconcilers.actions import Action, PatchStatus, PostEvent, act
from bookfleet.kube.reconcilers.ledgers import CreateLedgerMetadata, ObservedLedger, ReserveLedgerId
from bookfleet.kube.runtime.context import EventTally, ZooKeeperTarget
from bookfleet.meta.metadata import LedgerState, new_metadata
from bookfleet.meta.registry import BookieInfo
from bookfleet.meta.underreplication import DataLoss, Marker
from tests.fixtures.models import bookie_cluster

NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
ZK = "zk:2181"
METADATA = new_metadata(["b1", "b2"], 2, 2).model_copy(update={"state": LedgerState.CLOSED, "last_entry_id": 9,
                                                               "length": 90})


def ledger(**spec: Any) -> Ledger:
    return Ledger.model_validate({"metadata": {"name": "l", "namespace": "ns"},
                                  "spec": {"cluster": "bk", "ensembleSize": 2, "writeQuorum": 2, "ackQuorum": 2,
                                           **spec}})


def bookies(*ids: str, zone: str = "") -> tuple[BookieInfo, ...]:
    return tuple(BookieInfo(bookie_id=i, address="127.0.0.1:1", zone=zone) for i in ids)


def observed(status: dict | None = None, **fields: Any) -> ObservedLedger:
    return ObservedLedger(status=status or {},
                          **{"ledger": ledger(), "cluster": bookie_cluster(namespace="ns"), **fields})


def existing(status: dict | None = None, **fields: Any) -> ObservedLedger:
    """An adopted ledger (spec.ledgerId 7) whose metadata is in ZooKeeper."""
    return observed(status, ledger=ledger(ledgerId=7), metadata=METADATA, **fields)


def decide(observed: ObservedLedger, moment: dt.datetime, rng: random.Random | None = None) -> list[Action]:
    """The actions of one pass."""
    return list(ledgers.decide(observed, moment, rng).actions)


def status_of(actions: list[Action]) -> dict:
    (patch,) = [a for a in actions if isinstance(a, PatchStatus)]
    return patch.changes


def conditions(actions: list[Action]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status_of(actions)["conditions"]}


def events(actions: list[Action]) -> list[tuple[str, bool]]:
    return [(a.reason, a.warning) for a in actions if isinstance(a, PostEvent)]


def next_pass(before: ObservedLedger, actions: list[Action], **fields: Any) -> ObservedLedger:
    """The next pass's observation: the status the first one patched, with `fields` changed in the world."""
    return replace(before, status={**before.status, **status_of(actions)}, **fields)


def job(name: str, attempt: int, outcome: str | None = None, bookie: str = "b2",
        lost_since: str = "2026-01-02T03:04:00+00:00") -> dict:
    ended = {"Complete": {"conditions": [{"type": "Complete", "status": "True",
                                          "lastTransitionTime": "2026-01-02T03:06:00Z"}]},
             "Failed": {"conditions": [{"type": "Failed", "status": "True",
                                        "lastTransitionTime": "2026-01-02T03:06:00Z"}]},
             None: {"active": 1}}[outcome]
    return {"metadata": {"name": name, "creationTimestamp": f"2026-01-02T03:05:0{attempt}Z",
                         "annotations": {"bookfleet.io/repair-attempt": str(attempt), "bookfleet.io/bookie-id": bookie,
                                         "bookfleet.io/lost-since": lost_since}}, "status": ended}


def test_invalid_spec_says_why_once():
    first = ObservedLedger(status={}, spec_errors="spec.ensembleSize: must be >= 1")
    actions = decide(first, NOW)
    assert conditions(actions) == {"Valid": ("False", "InvalidSpec")}
    assert events(actions) == [("InvalidSpec", True)]
    assert events(decide(next_pass(first, actions), NOW)) == []  # an Event only on change


def test_missing_cluster_makes_the_spec_invalid_and_nothing_is_created():
    actions = decide(observed(cluster=None), NOW)
    assert conditions(actions) == {"Valid": ("False", "InvalidSpec")}
    assert "BookieCluster 'bk' does not exist" in status_of(actions)["conditions"][0]["message"]
    assert not any(isinstance(a, ReserveLedgerId | CreateLedgerMetadata) for a in actions)


def test_zones_outside_the_cluster_make_the_spec_invalid():
    zoned = bookie_cluster(namespace="ns", zones=("zone-a",))
    actions = decide(observed(ledger=ledger(zones=["zone-x"]), cluster=zoned), NOW)
    assert conditions(actions) == {"Valid": ("False", "InvalidSpec")}


def test_a_new_ledger_reserves_an_id_then_creates_its_metadata_in_one_pass():
    actions = decide(observed(writable=bookies("b1", "b2", "b3"), password=b"pw"), NOW,
                             rng=random.Random(1))
    reserve, create = actions[:2]
    assert reserve == ReserveLedgerId(ZooKeeperTarget.of(bookie_cluster(namespace="ns")))
    assert isinstance(create, CreateLedgerMetadata) and create.zookeeper.connect == ZK
    ensemble = create.metadata.segments[0].bookies
    assert len(set(ensemble)) == 2 and set(ensemble) <= {"b1", "b2", "b3"}
    assert create.metadata.password == new_metadata(ensemble, 2, 2, password=b"pw").password
    status = status_of(actions)
    assert "ledgerId" not in status  # the reservation writes it, before the metadata is created under it
    assert (status["state"], status["segments"]) == ("OPEN", [{"firstEntryId": 0, "bookies": list(ensemble)}])
    assert conditions(actions) == {"Valid": ("True", "SpecValid"), "DataLoss": ("False", "AllEntriesReplicated"),
                                   "Created": ("True", "Created")}
    assert events(actions) == [("Created", False)]
    assert actions.index(create) < actions.index(next(a for a in actions if isinstance(a, PatchStatus)))


def test_an_id_reserved_by_an_interrupted_pass_is_used_not_reserved_again():
    actions = decide(observed({"ledgerId": 12}, writable=bookies("b1", "b2"), password=b""), NOW)
    assert not any(isinstance(a, ReserveLedgerId) for a in actions)
    assert isinstance(actions[0], CreateLedgerMetadata) and status_of(actions)["ledgerId"] == 12


def test_zones_limit_placement():
    actions = decide(observed(ledger=ledger(ensembleSize=1, writeQuorum=1, ackQuorum=1, zones=["zone-b"]),
                                      cluster=bookie_cluster(namespace="ns", zones=("zone-a", "zone-b")), password=b"",
                                      writable=bookies("a1", zone="zone-a") + bookies("b1", zone="zone-b")), NOW)
    create = next(a for a in actions if isinstance(a, CreateLedgerMetadata))
    assert create.metadata.segments[0].bookies == ("b1",)


def test_zones_of_a_cluster_whose_bookies_take_their_nodes_zones_limit_placement_and_wait_for_bookies_there():
    """A cluster that lists no zones has its zones from the nodes, known as its bookies run: a Ledger naming them is
    valid, placed on bookies registered in them, and, while too few are, waits (passed again) rather than refused."""
    spec = ledger(ensembleSize=2, writeQuorum=2, ackQuorum=2, zones=["zone-a", "zone-b"])
    writable = bookies("a1", zone="zone-a") + bookies("b1", zone="zone-b") + bookies("c1", zone="zone-c")
    actions = decide(observed(ledger=spec, password=b"", writable=writable), NOW)
    create = next(a for a in actions if isinstance(a, CreateLedgerMetadata))
    assert sorted(create.metadata.segments[0].bookies) == ["a1", "b1"]

    waiting = ledgers.decide(observed(ledger=spec, password=b"", writable=writable[:1] + writable[2:]), NOW)
    assert conditions(list(waiting.actions)) == {"Valid": ("True", "SpecValid"),
                                                 "Created": ("False", "NotEnoughBookies")}
    assert waiting.requeue


def test_not_enough_bookies_waits_and_says_why():
    first = observed(writable=bookies("b1"), password=b"")
    actions = decide(first, NOW)
    assert not any(isinstance(a, ReserveLedgerId | CreateLedgerMetadata) for a in actions)
    assert conditions(actions)["Created"] == ("False", "NotEnoughBookies")
    assert events(actions) == [("NotEnoughBookies", True)]
    created = decide(next_pass(first, actions, writable=bookies("b1", "b2")), NOW)
    assert conditions(created)["Created"] == ("True", "Created") and events(created) == [("Created", False)]


def test_a_ledger_waiting_for_bookies_or_its_secret_asks_for_another_pass_and_a_created_one_does_not():
    waiting = ledgers.decide(observed(writable=bookies("b1"), password=b""), NOW)
    no_secret = ledgers.decide(observed(writable=bookies("b1", "b2"), password_problem="secret 's' not found"), NOW)
    created = ledgers.decide(observed(writable=bookies("b1", "b2"), password=b""), NOW)
    assert waiting.requeue and no_secret.requeue
    assert not created.requeue


def test_a_missing_password_secret_blocks_creation():
    actions = decide(observed(writable=bookies("b1", "b2"), password_problem="secret 's' not found"), NOW)
    assert conditions(actions)["Created"] == ("False", "SecretNotFound")
    assert not any(isinstance(a, CreateLedgerMetadata) for a in actions)


def test_an_existing_ledger_is_adopted_and_mirrored():
    actions = decide(existing(), NOW)
    assert not any(isinstance(a, ReserveLedgerId | CreateLedgerMetadata) for a in actions)
    status = status_of(actions)
    assert (status["ledgerId"], status["state"], status["lastEntryId"], status["length"]) == (7, "CLOSED", 9, 90)
    assert status["underReplicated"] is None and status["repair"] is None
    assert conditions(actions) == {"Valid": ("True", "SpecValid"), "DataLoss": ("False", "AllEntriesReplicated")}
    assert events(actions) == []  # healthy: nothing to say


def test_an_id_to_adopt_that_does_not_exist_is_reported_not_created():
    actions = decide(observed(ledger=ledger(ledgerId=7)), NOW)
    assert not any(isinstance(a, ReserveLedgerId | CreateLedgerMetadata) for a in actions)
    assert status_of(actions)["ledgerId"] == 7
    assert conditions(actions) == {"Valid": ("False", "NoSuchLedger")}
    assert events(actions) == [("NoSuchLedger", True)]


def test_a_healthy_ledger_changes_nothing_on_the_next_pass():
    first = existing()
    again = decide(next_pass(first, decide(first, NOW)), NOW + dt.timedelta(seconds=10))
    assert events(again) == []
    assert conditions(again) == conditions(decide(first, NOW))


def test_under_replication_repair_and_recovery_each_post_one_event():
    healthy = existing()
    marker = Marker(7, frozenset({"b2"}), int(NOW.timestamp() * 1000), 0)
    steps = [
        ({"marker": marker}, [("UnderReplicated", True)]),
        ({"repairs": (job("repair-0", 0),)}, [("RepairLaunched", False)]),
        ({"repairs": (job("repair-0", 0, "Failed"),)}, [("RepairFailed", True)]),
        ({"repairs": (job("repair-0", 0, "Failed"), job("repair-1", 1))}, [("RepairLaunched", False)]),
        ({"repairs": (job("repair-0", 0, "Failed"), job("repair-1", 1, "Complete"))}, [("RepairSucceeded", False)]),
        ({"marker": None}, [("FullyReplicated", False)]),
        ({}, []),
    ]
    current = healthy
    for change, expected in steps:
        current = replace(current, **change)
        actions = decide(current, NOW)
        assert events(actions) == expected, change
        current = next_pass(current, actions)
    assert current.status["repair"] == {"job": "repair-1", "bookieId": "b2", "state": "Succeeded",
                                        "started": "2026-01-02T03:05:01Z", "finished": "2026-01-02T03:06:00Z",
                                        "attempts": 2}


def test_a_bookie_loss_posts_one_event_per_reason_on_the_cluster_not_four_on_every_ledger():
    """At 100,000 Ledgers a bookie loss made 400,000 Events (under-replicated, repair launched, succeeded, healed on
    each): now each window posts one per reason on their BookieCluster, with the count and a few of them."""
    posted: list[tuple[str, str, str, bool]] = []
    windows: list[Callable[[], None]] = []
    tally = EventTally(lambda involved, reason, message, warning: posted.append(
        (f"{involved['kind']}/{involved['metadata']['name']}", reason, message, warning)), 60,
        schedule=lambda seconds, then: windows.append(then))
    ctx = SimpleNamespace(events=tally, api=None)  # nothing posted on a Ledger: no API to post with
    marker = Marker(7, frozenset({"b2"}), int(NOW.timestamp() * 1000), 0)
    current = existing()
    for change in ({"marker": marker}, {"repairs": (job("repair-0", 0),)},
                   {"repairs": (job("repair-0", 0, "Complete"),)}, {"marker": None}):
        current = replace(current, **change)
        actions = decide(current, NOW)
        for number in range(10_000):
            act(ctx, {"metadata": {"name": f"ledger-{number}", "namespace": "ns"}},  # type: ignore[arg-type]
                [a for a in actions if isinstance(a, PostEvent)])
        current = next_pass(current, actions)
    assert len(windows) == 1 and posted == []  # the first Event of the window started its timer
    windows.pop()()
    assert [(on, reason, warning) for on, reason, _, warning in posted] == [
        ("BookieCluster/bk", "UnderReplicated", True), ("BookieCluster/bk", "RepairLaunched", False),
        ("BookieCluster/bk", "RepairSucceeded", False), ("BookieCluster/bk", "FullyReplicated", False)]
    assert posted[0][2] == ("10000 Ledger(s): ledger-0 (no copy on b2), ledger-1 (no copy on b2), ledger-2 (no copy "
                            "on b2), ledger-3 (no copy on b2), ledger-4 (no copy on b2) and 9995 more")
    tally.flush()
    assert len(posted) == 4  # counted once


def test_a_repair_found_through_the_marker_that_ended_before_the_ledger_was_marked_is_not_its_repair():
    """Repairs are found by the lost bookies the marker names (the ledger ids stay in ZooKeeper): an earlier loss
    of the same bookie, over before this ledger was marked, never shows as this ledger's repair."""
    marked = Marker(7, frozenset({"b2"}), int(dt.datetime(2026, 1, 3, tzinfo=dt.UTC).timestamp() * 1000), 0)
    old = job("repair-old", 0, "Complete")  # ended 2026-01-02
    actions = decide(existing(marker=marked, repairs=(old,)), NOW)
    assert status_of(actions)["repair"] is None
    new = job("repair-new", 0, lost_since="2026-01-03T00:00:00+00:00")
    actions = decide(existing(marker=marked, repairs=(old, new)), NOW)
    assert status_of(actions)["repair"]["job"] == "repair-new" and status_of(actions)["repair"]["attempts"] == 1


def test_a_repair_still_running_is_followed_after_the_marker_is_gone():
    """The marker goes when the ledger is repaired, before the Job ends: the Ledger keeps following that bookie's
    repair until it ends, then keeps showing it."""
    running = {"job": "repair-0", "bookieId": "b2", "state": "Running"}
    assert ledgers.repaired_bookies(None, running) == ["b2"]
    assert ledgers.repaired_bookies(None, {**running, "state": "Succeeded"}) == []
    marker = Marker(7, frozenset({"b3", "b1"}), 0, 0)
    assert ledgers.repaired_bookies(marker, running) == ["b1", "b3", "b2"]
    kept = existing(status={"repair": {**running, "state": "Succeeded"}})
    assert status_of(decide(kept, NOW))["repair"]["state"] == "Succeeded"


def test_under_replication_shows_in_status():
    marker = Marker(7, frozenset({"b2", "b1"}), int(NOW.timestamp() * 1000), 0)
    actions = decide(existing(marker=marker), NOW)
    assert status_of(actions)["underReplicated"] == {"missingBookies": ["b1", "b2"], "since": "2026-01-02T03:04:05Z"}


def test_data_loss_is_a_warning_and_a_condition():
    actions = decide(existing(loss=DataLoss(7, (3, 4), 0)), NOW)
    assert conditions(actions)["DataLoss"] == ("True", "EntriesLost")
    assert "[3, 4]" in status_of(actions)["conditions"][1]["message"]
    assert events(actions) == [("EntriesLost", True)]


def test_a_ledger_deleted_in_zookeeper_shows_deleted_and_is_never_recreated():
    created = decide(observed({"ledgerId": 7}, writable=bookies("b1", "b2"), password=b""), NOW)
    seen = next_pass(observed({"ledgerId": 7}), created, writable=bookies("b1", "b2"), password=b"")
    actions = decide(seen, NOW)  # the metadata is gone, and bookies to recreate it are there
    assert not any(isinstance(a, ReserveLedgerId | CreateLedgerMetadata) for a in actions)
    status = status_of(actions)
    assert (status["state"], status["underReplicated"]) == ("DELETED", None)
    assert conditions(actions)["Valid"] == ("False", "LedgerDeleted")
    assert events(actions) == [("LedgerDeleted", True)]
    assert events(decide(next_pass(seen, actions), NOW)) == []
    adopted = decide(next_pass(existing(), decide(existing(), NOW), metadata=None), NOW)
    assert (status_of(adopted)["state"], events(adopted)) == ("DELETED", [("LedgerDeleted", True)])


def test_condition_transition_times_come_from_the_decision_time():
    actions = decide(existing(), NOW)
    assert {c["lastTransitionTime"] for c in status_of(actions)["conditions"]} == {"2026-01-02T03:04:05Z"}


def test_ledger_status_says_which_write_sets_hold_two_replicas_in_one_zone():
    """After a zone outage, repairs onto the zones left may put two replicas of a write set in one zone: the status
    says so per segment, from the bookies' zones (round-robin by ordinal), known also while they are lost."""
    zoned = bookie_cluster(6, namespace="ns", zones=("zone-a", "zone-b", "zone-c"))
    zones = ledgers.bookie_zones(zoned)
    ids = [b["spec"]["bookieId"] for b in resources.bookies_for_cluster(zoned)]
    assert [zones[b] for b in ids] == ["zone-a", "zone-b", "zone-c"] * 2
    spread, crowded = new_metadata(ids[:3], 3, 2), new_metadata([ids[1], ids[2], ids[4]], 3, 2)
    assert [s["writeSetsSharingAZone"] for s in ledgers.decide_status(7, spread, None, None, zones)["segments"]] == [0]
    assert [s["writeSetsSharingAZone"] for s in ledgers.decide_status(7, crowded, None, None, zones)["segments"]] \
        == [3]
    assert "writeSetsSharingAZone" not in ledgers.decide_status(7, spread, None, None, {})["segments"][0]


def test_ledger_status_takes_the_zones_of_a_cluster_that_lists_none_from_its_bookies():
    """Its bookies' zones as their nodes gave them (each Bookie's spec.zone), a lost one's too; a Bookie not yet
    placed has none."""
    cluster = bookie_cluster(4, namespace="ns")
    placed = resources.bookies_for_cluster(cluster)
    for body, zone in zip(placed, ("zone-c", "zone-a", "zone-b", None), strict=True):
        body["spec"]["zone"] = zone
    zones = ledgers.bookie_zones(cluster, placed)
    ids = [b["spec"]["bookieId"] for b in placed]
    assert zones == dict(zip(ids[:3], ("zone-c", "zone-a", "zone-b"), strict=True))
    assert [s["writeSetsSharingAZone"] for s in ledgers.decide_status(7, new_metadata(ids[:3], 3, 2), None, None,
                                                                       zones)["segments"]] == [0]


def test_ledger_status_mirrors_metadata_markers_and_repairs():
    metadata = new_metadata(["b1", "b2"], 2, 2)
    fresh = ledgers.decide_status(7, metadata, None, None)
    assert (fresh["ledgerId"], fresh["state"], fresh["lastEntryId"]) == (7, LedgerState.OPEN.value, -1)
    assert fresh["segments"] == [{"firstEntryId": 0, "bookies": ["b1", "b2"]}]
    assert fresh["underReplicated"] is None and fresh["repair"] is None

    closed = metadata.model_copy(update={"state": LedgerState.CLOSED, "last_entry_id": 9, "length": 90})
    marker = Marker(7, frozenset({"b2"}), int(NOW.timestamp() * 1000), 0)
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
