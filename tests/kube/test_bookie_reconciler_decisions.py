"""The Bookie reconciler's decisions, pure: every kind of pod death, the lost-bookie rule applied to it, the repair and
what follows it, in milliseconds with no API server and no ZooKeeper (end to end in test_operator.py)."""

from __future__ import annotations

import collections
import datetime as dt
from dataclasses import replace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from bookfleet.kube import resources
from bookfleet.kube.models import Bookie, BookiePhase, DesiredState
from bookfleet.kube.reconcilers import bookies, repairs
from bookfleet.kube.reconcilers.actions import Decision, Delete, Ensure, Patch, PatchStatus, PostEvent
from bookfleet.kube.reconcilers.bookies import ClaimObserved, DeathKind, ForceDeletePod, ForgetCookie, LaunchRepair
from bookfleet.kube.runtime.api import CORE, CUSTOM
from bookfleet.kube.runtime.context import OperatorContext, ZooKeeperTarget, timestamp
from bookfleet.meta.registry import BookieInfo, BookieMode
from tests.fixtures.models import bookie_cluster

NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
DELAY = 30.0
CLAIMS = ("bk-0-journal", "bk-0-ledgers")
PLANNED = bookies.ANNOTATION_PLANNED_RESTART


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def bookie_body(lost_since: dt.datetime | None = None, had_pod: bool = True, planned: str | None = None,
                conditions: list[dict] | None = None) -> dict[str, Any]:
    manifest = resources.bookies_for_cluster(bookie_cluster())[0]
    manifest["metadata"]["uid"] = "b0"
    if planned:
        manifest["metadata"]["annotations"] = {PLANNED: planned}
    return {**manifest, "status": {"lostSince": timestamp(lost_since) if lost_since else None,
                                   "pod": "bk-0" if had_pod else None, "conditions": conditions or []}}


def pod(ready: bool = True, since: dt.datetime | None = None, uid: str = "u1", node: str | None = "node-a",
        phase: str = "Running", restarts: int = 0, deleted_at: dt.datetime | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "bk-0", "namespace": "default", "uid": uid}
    if deleted_at:
        meta["deletionTimestamp"] = timestamp(deleted_at)
    return {"metadata": meta, "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase,
                       "conditions": [{"type": "Ready", "status": str(ready),
                                       "lastTransitionTime": timestamp(since or ago(3600))}],
                       "containerStatuses": [{"name": "bookie", "restartCount": restarts}]}}


def registered() -> BookieInfo:
    return BookieInfo(bookie_id="bk-0", address="10.0.0.1:3181")


def claims(**state: Any) -> tuple[ClaimObserved, ...]:
    return tuple(ClaimObserved(name, exists=True, **state) for name in CLAIMS)


def observed(body: dict[str, Any] | None = None, pod: dict | None = None, node_ready: str | None = None,
             claims: tuple[ClaimObserved, ...] = claims(), info: BookieInfo | None = None, disabled: bool = False,
             delay: float = DELAY, attempts: tuple[dict, ...] = (), remaining: tuple[int, ...] | None = None,
             reached: bool = True) -> bookies.ObservedBookie:
    body = body or bookie_body()
    return bookies.ObservedBookie(
        body=body, bookie=Bookie.model_validate(body), cluster=bookie_cluster(), pod=pod, node_ready=node_ready,
        claims=claims, registration=info, ledgers=7, recovery_delay=delay, recovery_disabled=disabled,
        repair=repairs.RepairObserved(attempts, remaining), zookeeper_reached=reached)


def job(state: str, attempt: int = 0, finished: dt.datetime | None = None) -> dict[str, Any]:
    finished = finished or ago(60)
    status = {"Complete": {"conditions": [{"type": "Complete", "status": "True",
                                           "lastTransitionTime": timestamp(finished)}]},
              "Failed": {"conditions": [{"type": "Failed", "status": "True",
                                         "lastTransitionTime": timestamp(finished)}]},
              "Running": {"active": 1}}[state]
    return {"kind": "Job", "metadata": {"name": f"repair-{attempt}",
                                        "annotations": {repairs.ANNOTATION_ATTEMPT: str(attempt)}}, "status": status}


def status_of(decision: Decision) -> dict[str, Any]:
    """The status a pass writes: its first action."""
    patch = decision.actions[0]
    assert isinstance(patch, PatchStatus) and patch.plural == "bookies"
    return patch.changes


def after_status(decision: Decision) -> tuple[Any, ...]:
    """What a pass does besides writing the status."""
    return decision.actions[1:]


def condition(decision: Decision, type_: str) -> tuple[str, str]:
    found = next(c for c in status_of(decision)["conditions"] if c["type"] == type_)
    return found["status"], found["reason"]


def events(decision: Decision) -> list[str]:
    return [action.reason for action in decision.actions if isinstance(action, PostEvent)]


def event_messages(decision: Decision) -> dict[str, str]:
    return {action.reason: action.message for action in decision.actions if isinstance(action, PostEvent)}


def of_type(decision: Decision, kind: type) -> list[Any]:
    return [action for action in decision.actions if isinstance(action, kind)]


def ensured(decision: Decision) -> list[str]:
    return [f"{a.manifest['kind']}/{a.manifest['metadata']['name']}" for a in of_type(decision, Ensure)]


EVERYTHING = ["PersistentVolumeClaim/bk-0-journal", "PersistentVolumeClaim/bk-0-ledgers", "Pod/bk-0"]
ANNOTATE = Patch(CUSTOM, "bookies", "default", "bk-0", {"metadata": {"annotations": {PLANNED: "u1"}}})


def assert_lost(decision: Decision, kind: DeathKind, since: dt.datetime) -> None:
    assert status_of(decision)["phase"] == "Lost" and status_of(decision)["lostSince"] == timestamp(since)
    assert condition(decision, "Lost") == ("True", kind.value)
    assert events(decision)[:1] == ["BookieLost"]


# --- a zone from the node ----------------------------------------------------------------------------------------

ZONE_PATCH = Patch(CUSTOM, "bookies", "default", "bk-0", {"spec": {"zone": "zone-b"}})


def test_a_zone_less_bookie_starting_on_a_zoned_node_takes_its_zone_and_starts_again_with_it():
    """Bound but not serving yet: restarted at once, so it never registers without the zone (the next pass makes
    the pod from the Bookie, with --zone)."""
    decision = bookies.decide(replace(observed(pod=pod(ready=False)), node_zone="zone-b"), NOW)
    assert of_type(decision, Patch) == [ZONE_PATCH, ANNOTATE]
    assert of_type(decision, Delete) == [Delete(CORE, "pods", "default", "bk-0")]
    assert event_messages(decision)["ZoneFromNode"] == "bookie bk-0 is in zone zone-b, its node's"
    assert ensured(decision) == []


def test_a_serving_zone_less_bookie_takes_its_nodes_zone_and_is_left_to_the_rollout():
    """A bookie from before zones came from nodes keeps serving: the cluster's rollout restarts it, one at a time."""
    decision = bookies.decide(replace(observed(pod=pod(), info=registered()), node_zone="zone-b"), NOW)
    assert of_type(decision, Patch) == [ZONE_PATCH]
    assert of_type(decision, Delete) == []


@pytest.mark.parametrize("zone", [None, "zone-b"])
def test_a_bookie_with_a_zone_or_on_a_node_without_one_keeps_what_it_has(zone):
    body = bookie_body()
    body["spec"]["zone"] = zone and "zone-a"
    decision = bookies.decide(replace(observed(body, pod=pod(ready=False)), node_zone=zone), NOW)
    assert of_type(decision, Patch) == [] and of_type(decision, Delete) == [] and "ZoneFromNode" not in events(decision)


# --- what counts as a lost bookie ------------------------------------------------------------------------------

def test_a_new_bookie_gets_its_volumes_and_pod_and_is_not_lost():
    decision = bookies.decide(observed(bookie_body(had_pod=False), claims=(ClaimObserved(CLAIMS[0], False),
                                                                             ClaimObserved(CLAIMS[1], False))), NOW)
    assert status_of(decision)["phase"] == "Pending" and status_of(decision)["lostSince"] is None
    assert ensured(decision) == EVERYTHING and events(decision) == []


def test_a_running_bookie_is_left_alone():
    decision = bookies.decide(observed(pod=pod(), info=registered()), NOW)
    assert status_of(decision)["phase"] == "Running" and status_of(decision)["lostSince"] is None
    assert after_status(decision) == ()  # nothing to create, nothing to say


def test_pod_deleted_is_lost_and_recreated_on_its_volumes_within_the_delay():
    decision = bookies.decide(observed(pod=None), NOW)
    assert_lost(decision, DeathKind.POD_DELETED, NOW)
    assert ensured(decision) == ["Pod/bk-0"]
    assert of_type(decision, LaunchRepair) == []


def test_without_zookeeper_a_deleted_pod_is_lost_and_recreated_and_the_rest_waits_for_zookeeper():
    """The cluster's ZooKeeper down: the pod alone says the bookie is gone and gets it a new one on its volumes; the
    status keeps its registration and ledger count as last read, and the pass comes again at the retry interval."""
    decision = bookies.decide(observed(pod=None, reached=False), NOW)
    assert_lost(decision, DeathKind.POD_DELETED, NOW)
    assert ensured(decision) == ["Pod/bk-0"]
    assert of_type(decision, LaunchRepair) == [] and decision.requeue
    assert {"registered", "ledgers", "diskUsage"}.isdisjoint(status_of(decision))


def test_without_zookeeper_a_loss_past_its_delay_gets_its_failed_pod_made_again_and_no_repair():
    """Whether the bookie registered again, the delay and the switch are ZooKeeper's to say: no repair is launched
    and its Repaired condition is left as it was, but its failed pod is made again on its volumes."""
    decision = bookies.decide(observed(bookie_body(lost_since=ago(3600)), pod=pod(ready=False, phase="Failed"),
                                       reached=False), NOW)
    assert status_of(decision)["phase"] == "Lost" and status_of(decision)["lostSince"] == timestamp(ago(3600))
    assert of_type(decision, Delete) == [Delete(CORE, "pods", "default", "bk-0")] and ensured(decision) == ["Pod/bk-0"]
    assert of_type(decision, LaunchRepair) == [] and events(decision) == []
    assert all(c["type"] != "Repaired" for c in status_of(decision)["conditions"])


def test_without_zookeeper_a_serving_bookie_changes_nothing_and_a_decommissioning_one_waits():
    decision = bookies.decide(observed(pod=pod(), reached=False), NOW)
    assert after_status(decision) == () and status_of(decision) == {"pod": "bk-0", "lostSince": None,
                                                                    "conditions": []}
    draining = bookie_body()
    draining["spec"]["desiredState"] = DesiredState.DECOMMISSIONED.value
    assert bookies.decide(observed(draining, pod=pod(), reached=False), NOW).actions == ()


def test_a_pod_that_ended_says_how_and_never_calls_a_clean_exit_a_failure():
    """The real kubelet leaves a bookie evicted for its scratch volume's size Succeeded (it exited 0 on the SIGTERM)
    with no reason: lost all the same, and the event says it ended; one that ended being deleted is gone."""
    for ended, said in ((pod(ready=False, phase="Succeeded"), "pod bk-0 ended (Succeeded)"),
                        (pod(ready=False, phase="Failed") | {"status": {"phase": "Failed", "reason": "Evicted"}},
                         "pod bk-0 failed (Evicted)")):
        decision = bookies.decide(observed(pod=ended), NOW)
        assert_lost(decision, DeathKind.POD_FAILED, NOW)
        assert said in event_messages(decision)["BookieLost"]
    # Deleted, its bookie exited 0 on the SIGTERM: the real kubelet reports Succeeded before the object goes.
    decision = bookies.decide(observed(pod=pod(ready=False, phase="Succeeded", deleted_at=NOW)), NOW)
    assert_lost(decision, DeathKind.POD_DELETED, NOW)
    assert "pod bk-0 is gone (deleted; it ended Succeeded)" in event_messages(decision)["BookieLost"]


def test_pod_failed_is_lost_and_replaced_on_purpose_on_the_same_volumes():
    decision = bookies.decide(observed(pod=pod(ready=False, phase="Failed")), NOW)
    assert_lost(decision, DeathKind.POD_FAILED, NOW)
    assert of_type(decision, Patch) == [ANNOTATE]  # its deletion is not a second loss
    assert of_type(decision, Delete) == [Delete(CORE, "pods", "default", "bk-0")]
    assert ensured(decision) == ["Pod/bk-0"]


@pytest.mark.parametrize("node_ready", ["False", "Unknown", bookies.NODE_GONE])
def test_pod_not_ready_on_a_dead_node_is_lost_since_it_stopped_being_ready(node_ready):
    decision = bookies.decide(observed(pod=pod(ready=False, since=ago(10)), node_ready=node_ready), NOW)
    assert_lost(decision, DeathKind.NODE_LOST, ago(10))
    assert of_type(decision, Delete) == of_type(decision, ForceDeletePod) == [] and ensured(decision) == []


def test_pod_not_ready_on_a_ready_node_without_restarts_is_not_lost():
    decision = bookies.decide(observed(pod=pod(ready=False, since=ago(3600)), node_ready="True"), NOW)
    assert status_of(decision)["lostSince"] is None and status_of(decision)["phase"] == "Pending"


def test_terminating_pod_on_a_dead_node_is_lost_only_past_its_grace_period():
    within = bookies.decide(observed(pod=pod(deleted_at=NOW + dt.timedelta(seconds=20)), node_ready="Unknown"), NOW)
    assert status_of(within)["lostSince"] is None
    past = bookies.decide(observed(pod=pod(deleted_at=ago(5)), node_ready="Unknown"), NOW)
    assert_lost(past, DeathKind.NODE_LOST, ago(5))


def test_crash_looping_longer_than_the_delay_is_lost_and_marked_at_once():
    decision = bookies.decide(observed(pod=pod(ready=False, since=ago(DELAY + 5), restarts=4)), NOW)
    assert_lost(decision, DeathKind.CRASH_LOOP, ago(DELAY + 5))
    assert [(a.since, a.attempt) for a in of_type(decision, LaunchRepair)] == [(ago(DELAY + 5), 0)]


@pytest.mark.parametrize(("restarts", "not_ready_for", "planned"), [
    (4, DELAY - 5, None),  # not for longer than the delay yet
    (0, DELAY + 60, None),  # not ready, but not restarting: not a crash loop
    (4, DELAY + 60, "old-uid"),  # the operator restarted it for a rollout: RolloutStuck, not a loss
])
def test_not_a_crash_loop(restarts, not_ready_for, planned):
    body = bookie_body(planned=planned)
    decision = bookies.decide(observed(body, pod=pod(ready=False, since=ago(not_ready_for), restarts=restarts)), NOW)
    assert status_of(decision)["lostSince"] is None and events(decision) == []


def test_pod_pending_because_its_volume_node_is_gone_is_lost_and_not_recreated():
    gone = (ClaimObserved(CLAIMS[0], True), ClaimObserved(CLAIMS[1], True, lost_node="node-b"))
    decision = bookies.decide(observed(pod=pod(ready=False, node=None, phase="Pending"), claims=gone), NOW)
    assert_lost(decision, DeathKind.VOLUME_NODE_GONE, NOW)
    assert "node-b" in status_of(decision)["conditions"][0]["message"]
    assert ensured(decision) == []


def test_a_claim_being_deleted_counts_as_gone():
    decision = bookies.decide(observed(pod=pod(), info=registered(), claims=claims(terminating=True)), NOW)
    assert_lost(decision, DeathKind.VOLUMES_GONE, NOW)
    assert ensured(decision) == []  # never a pod against a dying claim


def test_a_new_bookie_waits_for_a_dying_claim_before_it_gets_a_pod():
    dying = (ClaimObserved(CLAIMS[0], True, terminating=True), ClaimObserved(CLAIMS[1], False))
    decision = bookies.decide(observed(bookie_body(had_pod=False), claims=dying), NOW)
    assert status_of(decision)["lostSince"] is None
    assert ensured(decision) == ["PersistentVolumeClaim/bk-0-ledgers"]


def test_a_planned_restart_is_not_a_loss_and_its_mark_goes_once_the_new_pod_is_ready():
    restarting = bookies.decide(observed(bookie_body(planned="u1"), pod=None), NOW)
    assert status_of(restarting)["lostSince"] is None and ensured(restarting) == ["Pod/bk-0"]
    # On a real kubelet the old pod shows Succeeded (the bookie exits 0 on the SIGTERM) before the object goes.
    ending = bookies.decide(observed(bookie_body(planned="u1"), pod=pod(ready=False, phase="Succeeded",
                                                                        deleted_at=NOW)), NOW)
    assert status_of(ending)["lostSince"] is None and events(ending) == []
    back = bookies.decide(observed(bookie_body(planned="u1"), pod=pod(uid="u2"), info=registered()), NOW)
    assert of_type(back, Patch) == [Patch(CUSTOM, "bookies", "default", "bk-0",
                                          {"metadata": {"annotations": {PLANNED: None}}})]


# --- the loss, the repair and what follows ---------------------------------------------------------------------

def lost(**kwargs: Any) -> bookies.ObservedBookie:
    """A bookie lost `since` seconds ago (10 by default) with the given observations."""
    since = ago(kwargs.pop("since", 10))
    return observed(bookie_body(lost_since=since, conditions=kwargs.pop("conditions", None)), **kwargs)


def test_within_the_delay_it_waits_and_is_due_again_when_the_delay_ends():
    decision = bookies.decide(lost(pod=pod(ready=False, since=ago(10))), NOW)
    assert status_of(decision)["phase"] == "Lost" and of_type(decision, LaunchRepair) == [] and events(decision) == []
    assert decision.recheck_at == ago(10) + dt.timedelta(seconds=DELAY)  # not whenever the next interval comes


@pytest.mark.parametrize("case", ["running", "repairing", "disabled"])
def test_only_the_clock_running_out_on_a_delay_makes_a_pass_due(case):
    observation = {"running": lambda: observed(pod=pod(), info=registered()),
                   "repairing": lambda: lost(pod=None, since=DELAY + 1),
                   "disabled": lambda: lost(pod=None, since=10, disabled=True)}[case]()
    assert bookies.decide(observation, NOW).recheck_at is None


def test_a_restarted_pod_that_is_not_ready_is_due_again_just_past_the_delay():
    decision = bookies.decide(observed(pod=pod(ready=False, since=ago(5), restarts=2)), NOW)
    assert status_of(decision)["lostSince"] is None
    assert decision.recheck_at == ago(5) + dt.timedelta(seconds=DELAY + 1)
    later = decision.recheck_at
    assert status_of(bookies.decide(observed(pod=pod(ready=False, since=ago(5), restarts=2)), later))["lostSince"]


def test_back_with_its_data_clears_the_loss():
    decision = bookies.decide(lost(pod=pod(uid="u2"), info=registered()), NOW)
    assert status_of(decision)["lostSince"] is None and status_of(decision)["phase"] == "Running"
    assert condition(decision, "Lost") == ("False", "BookieReturned") and events(decision) == ["BookieReturned"]


def test_disabled_auto_recovery_launches_nothing_and_says_so_once():
    decision = bookies.decide(lost(pod=None, since=3600, disabled=True), NOW)
    assert of_type(decision, LaunchRepair) == []
    assert condition(decision, "Repaired") == ("False", bookies.AUTO_RECOVERY_DISABLED)
    assert events(decision) == [bookies.AUTO_RECOVERY_DISABLED]
    again = bookies.decide(lost(pod=None, since=3600, disabled=True, conditions=status_of(decision)["conditions"]), NOW)
    assert events(again) == []


def test_past_the_delay_the_repair_is_launched_named_after_the_loss():
    decision = bookies.decide(lost(pod=None, since=DELAY + 1), NOW)
    assert [(a.since, a.attempt) for a in of_type(decision, LaunchRepair)] == [(ago(DELAY + 1), 0)]
    assert condition(decision, "Repaired") == ("False", "Repairing")


def test_a_failed_repair_says_so_once_and_is_retried_after_its_backoff():
    failed = lost(pod=None, since=3600, attempts=(job("Failed", finished=ago(1)),))
    decision = bookies.decide(failed, NOW)
    assert condition(decision, "Repaired") == ("False", "RepairFailed") and events(decision) == ["RepairFailed"]
    assert of_type(decision, LaunchRepair) == []
    retry = bookies.decide(lost(pod=None, since=3600, attempts=(job("Failed", finished=ago(60)),)), NOW)
    assert [a.attempt for a in of_type(retry, LaunchRepair)] == [1]


def test_a_repair_that_failed_every_attempt_gives_up_under_a_reason_of_its_own():
    """What the repairs-given-up gauge counts and its alert fires on: not the backoff's RepairFailed, which passes."""
    attempts = tuple(job("Failed", attempt=n) for n in range(repairs.MAX_ATTEMPTS))
    decision = bookies.decide(lost(pod=None, since=3600, attempts=attempts), NOW)
    assert condition(decision, "Repaired") == ("False", "RepairGaveUp") and events(decision) == ["RepairGaveUp"]
    assert of_type(decision, LaunchRepair) == []


def test_repaired_without_data_gets_fresh_volumes_pod_and_cookie():
    decision = bookies.decide(lost(pod=None, since=3600, claims=(ClaimObserved(CLAIMS[0], False),
                                                                   ClaimObserved(CLAIMS[1], False)),
                                     attempts=(job("Complete"),), remaining=()), NOW)
    forget = ForgetCookie(ZooKeeperTarget.of(bookie_cluster()), status_of(decision)["bookieId"])
    assert of_type(decision, ForgetCookie) == [forget]
    assert ensured(decision) == EVERYTHING
    assert status_of(decision)["lostSince"] is None
    assert condition(decision, "Repaired") == ("True", "RepairSucceeded")
    assert condition(decision, "Lost") == ("False", "Replaced")
    assert events(decision) == ["RepairSucceeded", "BookieReplaced"]


def test_repaired_with_a_claim_still_terminating_waits_for_it():
    dying = (ClaimObserved(CLAIMS[0], True, terminating=True), ClaimObserved(CLAIMS[1], False))
    decision = bookies.decide(lost(pod=None, since=3600, claims=dying, attempts=(job("Complete"),), remaining=()),
                                NOW)
    assert of_type(decision, ForgetCookie) == [] and ensured(decision) == [] and of_type(decision, Delete) == []
    assert status_of(decision)["phase"] == "Lost"


def test_a_succeeded_repair_that_left_ledgers_is_not_repaired():
    decision = bookies.decide(lost(pod=None, since=3600, claims=claims(terminating=True),
                                     attempts=(job("Complete", finished=ago(60)),), remaining=(5,)), NOW)
    assert [a.attempt for a in of_type(decision, LaunchRepair)] == [1] and of_type(decision, ForgetCookie) == []


@pytest.mark.parametrize("node_ready", ["Unknown", "False"])
def test_a_bookie_stuck_on_a_node_that_still_exists_keeps_its_pod_and_volumes_after_the_repair(node_ready):
    """A NotReady or unreachable node may return (a zone outage, a partition) with the bookie's data: its pod and
    volumes are kept, the bookie Lost, until it comes back or its Node is deleted."""
    stuck = {"pod": pod(ready=False, since=ago(3600)), "node_ready": node_ready, "since": 3600}
    repaired = bookies.decide(lost(**stuck, attempts=(job("Complete"),), remaining=()), NOW)
    assert condition(repaired, "Repaired") == ("True", "RepairSucceeded")
    assert status_of(repaired)["phase"] == "Lost" and condition(repaired, "Lost") == ("True", DeathKind.NODE_LOST.value)
    assert of_type(repaired, ForceDeletePod) == of_type(repaired, Delete) == of_type(repaired, ForgetCookie) == []
    assert events(repaired) == ["RepairSucceeded", "VolumesKept"]


def test_a_pod_stuck_on_a_deleted_node_is_force_deleted_only_after_the_repair():
    stuck = {"pod": pod(ready=False, since=ago(3600)), "node_ready": bookies.NODE_GONE, "since": 3600}
    repairing = bookies.decide(lost(**stuck, attempts=(job("Running"),)), NOW)
    assert of_type(repairing, ForceDeletePod) == of_type(repairing, Delete) == []
    repaired = bookies.decide(lost(**stuck, attempts=(job("Complete"),), remaining=()), NOW)
    assert of_type(repaired, Patch) == [ANNOTATE]
    assert of_type(repaired, ForceDeletePod) == [ForceDeletePod("default", "bk-0")]
    assert of_type(repaired, Delete) == [Delete(CORE, "persistentvolumeclaims", "default", c) for c in CLAIMS]
    assert events(repaired) == ["RepairSucceeded", "PodForceDeleted"]
    assert status_of(repaired)["phase"] == "Lost" and ensured(repaired) == []  # fresh ones once the old ones are gone


def test_crash_looping_with_its_data_stays_lost_after_the_repair_and_keeps_its_volumes():
    decision = bookies.decide(lost(pod=pod(ready=False, restarts=9), since=3600, attempts=(job("Complete"),),
                                     remaining=()), NOW)
    assert condition(decision, "Repaired") == ("True", "RepairSucceeded")
    assert status_of(decision)["phase"] == "Lost"
    assert of_type(decision, Delete) == of_type(decision, LaunchRepair) == of_type(decision, ForgetCookie) == []


def test_a_repair_whose_jobs_expired_is_not_launched_again():
    """Repair Jobs go ttlSecondsAfterFinished after they end; a bookie that stays down with its data (Lost) keeps its
    Repaired condition, which says the loss was repaired: no new attempt once the Jobs are gone. An earlier loss's
    success says nothing about this one."""
    repaired = [{"type": "Repaired", "status": "True", "reason": "RepairSucceeded",
                 "message": "the ledgers of bookie bk-0 are fully replicated again",
                 "lastTransitionTime": timestamp(ago(1800))}]
    decision = bookies.decide(lost(pod=pod(ready=False, restarts=9), since=3600, conditions=repaired), NOW)
    assert of_type(decision, LaunchRepair) == [] and events(decision) == []
    assert condition(decision, "Repaired") == ("True", "RepairSucceeded") and status_of(decision)["phase"] == "Lost"
    earlier = bookies.decide(lost(pod=pod(ready=False, restarts=9), since=600, conditions=repaired), NOW)
    assert [a.attempt for a in of_type(earlier, LaunchRepair)] == [0]


def disrupted(reason: str, **pod_fields: Any) -> dict[str, Any]:
    """A bookie pod with a DisruptionTarget condition, as the eviction API or the kubelet's shutdown manager set."""
    found = pod(**pod_fields)
    found["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": reason})
    return found


DISRUPTION = bookies.ANNOTATION_DISRUPTION


def test_a_drained_bookie_gets_the_planned_restart_delay_an_unplanned_loss_keeps_the_usual_one():
    """`kubectl drain` evicts the pod through the eviction API: seen while it terminates, the reason is kept on the
    Bookie; once the pod is gone the loss is Evicted and the repair waits for plannedRestartDelaySeconds (600 s by
    default), not lostBookieRecoveryDelay. The same loss without the eviction starts its repair after the usual
    delay."""
    terminating = disrupted("EvictionByEvictionAPI", ready=False, deleted_at=ago(5))
    seen = bookies.decide(observed(pod=terminating), NOW)
    assert of_type(seen, Patch) == [Patch(CUSTOM, "bookies", "default", "bk-0", {"metadata": {"annotations": {
        DISRUPTION: "u1 EvictionByEvictionAPI"}}})]
    assert status_of(seen)["phase"] != "Lost"
    body = bookie_body()
    body["metadata"]["annotations"] = {DISRUPTION: "u1 EvictionByEvictionAPI"}
    gone = bookies.decide(observed(body, pod=None), NOW)
    assert_lost(gone, DeathKind.EVICTED, NOW)
    assert of_type(gone, LaunchRepair) == [] and gone.recheck_at == NOW + dt.timedelta(seconds=600)
    lost_body = {**body, "status": {**status_of(gone)}}
    later = bookies.decide(observed(lost_body, pod=None), NOW + dt.timedelta(seconds=120))
    assert of_type(later, LaunchRepair) == [], "well past lostBookieRecoveryDelay, within the planned delay"
    assert [a.attempt for a in of_type(bookies.decide(observed(lost_body, pod=None),
                                                        NOW + dt.timedelta(seconds=601)), LaunchRepair)] == [0]
    unplanned = bookies.decide(lost(pod=None, since=120), NOW)
    assert [a.attempt for a in of_type(unplanned, LaunchRepair)] == [0]


def test_a_bookie_whose_node_shut_down_gracefully_is_a_planned_loss():
    stopped = disrupted("TerminationByKubelet", ready=False, phase="Failed")
    decision = bookies.decide(observed(pod=stopped, node_ready="False"), NOW)
    assert_lost(decision, DeathKind.SHUT_DOWN, NOW)
    assert of_type(decision, LaunchRepair) == [] and decision.recheck_at == NOW + dt.timedelta(seconds=600)
    preempted = disrupted("PreemptionByScheduler", ready=False, phase="Failed")
    assert_lost(bookies.decide(observed(pod=preempted), NOW), DeathKind.POD_FAILED, NOW)


def test_the_disruption_note_goes_once_another_pod_is_ready():
    body = bookie_body()
    body["metadata"]["annotations"] = {DISRUPTION: "u1 EvictionByEvictionAPI"}
    decision = bookies.decide(observed(body, pod=pod(uid="u2"), info=registered()), NOW)
    assert of_type(decision, Patch) == [Patch(CUSTOM, "bookies", "default", "bk-0", {"metadata": {"annotations": {
        DISRUPTION: None}}})]


def test_a_decommissioning_bookie_is_left_to_the_cluster_reconciler():
    body = bookie_body()
    body["spec"]["desiredState"] = "ReadOnly"
    decision = bookies.decide(observed(body, pod=None), NOW)
    assert after_status(decision) == () and status_of(decision)["phase"] == "Decommissioning"


# --- the repair's own steps ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("disabled", "attempts", "remaining", "outcome", "launch"), [
    (True, (), None, repairs.Outcome.DISABLED, None),
    (False, (), None, repairs.Outcome.RUNNING, 0),
    (False, (job("Running"),), None, repairs.Outcome.RUNNING, None),
    (False, (job("Complete"),), (), repairs.Outcome.REPAIRED, None),
    (False, (job("Failed", finished=ago(1)),), None, repairs.Outcome.BACKING_OFF, None),
    (False, (job("Failed", finished=ago(60)),), None, repairs.Outcome.RUNNING, 1),
    (False, (job("Failed", repairs.MAX_ATTEMPTS - 1),), None, repairs.Outcome.GAVE_UP, None),
])
def test_repair_steps(disabled, attempts, remaining, outcome, launch):
    step = repairs.decide_repair(disabled, repairs.RepairObserved(attempts, remaining), NOW, limit=3)
    assert (step.outcome, step.launch) == (outcome, launch)


def test_a_lost_zone_repairs_in_waves_of_the_clusters_cap():
    """Ten bookies of a zone lost together started ten drivers and their executors at once: each launch (a first
    attempt or a retry) now waits while the cluster has maxConcurrent repairs active, and a running one is left be."""
    active = 0
    launched = []
    for bookie in range(10):  # the passes of the zone's ten lost bookies, one after the other
        step = repairs.decide_repair(False, repairs.RepairObserved(others_active=active), NOW, limit=3)
        if step.launch is not None:
            launched.append(bookie)
            active += 1
        else:
            assert step.outcome == repairs.Outcome.QUEUED
    assert launched == [0, 1, 2]
    retry = repairs.RepairObserved((job("Failed", finished=ago(60)),), others_active=3)
    assert repairs.decide_repair(False, retry, NOW, limit=3).outcome == repairs.Outcome.QUEUED
    running = repairs.RepairObserved((job("Running"),), others_active=5)  # the cap lowered meanwhile
    assert repairs.decide_repair(False, running, NOW, limit=3) == repairs.RepairStep(repairs.Outcome.RUNNING)


def test_a_bookie_whose_repair_waits_its_turn_says_so_and_is_passed_again():
    cluster = bookie_cluster()
    queued = replace(lost(pod=None, since=DELAY + 1),
                     repair=repairs.RepairObserved(others_active=cluster.spec.auto_recovery.repair.max_concurrent))
    decision = bookies.decide(queued, NOW)
    assert of_type(decision, LaunchRepair) == [] and decision.requeue
    repaired = next(c for c in status_of(decision)["conditions"] if c["type"] == "Repaired")
    assert (repaired["status"], repaired["reason"]) == ("False", "RepairQueued")


# --- what observe reads about nodes and volumes ----------------------------------------------------------------

class StoredApi:
    """Answers `get` from a dict of (plural, name) -> object, like the API server holding just these."""

    def __init__(self, *objects: tuple[str, dict]) -> None:
        self.objects = {(plural, obj["metadata"]["name"]): obj for plural, obj in objects}

    def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> dict | None:
        return self.objects.get((plural, name))


def node(name: str, ready: str) -> tuple[str, dict]:
    return "nodes", {"metadata": {"name": name}, "status": {"conditions": [{"type": "Ready", "status": ready}]}}


def local_volume(name: str, on: str) -> tuple[str, dict]:
    term = {"matchExpressions": [{"key": bookies.HOSTNAME_LABEL, "operator": "In", "values": [on]}]}
    return "persistentvolumes", {"metadata": {"name": name},
                                 "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [term]}}}}


def claim(name: str, volume: str, deleting: bool = False) -> tuple[str, dict]:
    meta = {"name": name, **({"deletionTimestamp": timestamp(NOW)} if deleting else {})}
    return "persistentvolumeclaims", {"metadata": meta, "spec": {"volumeName": volume}}


def test_a_node_is_ready_not_ready_or_gone():
    api = StoredApi(node("node-a", "True"), node("node-b", "Unknown"))
    assert [bookies.node_ready(api, n) for n in ("node-a", "node-b", "node-c")] == ["True", "Unknown",
                                                                                       bookies.NODE_GONE]


def test_a_claim_whose_local_volume_is_pinned_to_a_vanished_node_is_not_usable():
    api = StoredApi(node("node-a", "Unknown"), claim("on-a", "pv-a"), local_volume("pv-a", "node-a"),
                    claim("on-gone", "pv-gone"), local_volume("pv-gone", "node-gone"),
                    claim("deleting", "pv-a", deleting=True))
    on_a, on_gone = (bookies.observe_claim(api, "default", c, follow_volume=True) for c in ("on-a", "on-gone"))
    assert on_a.usable and on_a.lost_node is None  # a node that is down still holds the data
    assert not on_gone.usable and on_gone.lost_node == "node-gone"
    assert bookies.observe_claim(api, "default", "on-gone", follow_volume=False).usable  # the pod is Ready
    deleting = bookies.observe_claim(api, "default", "deleting", follow_volume=True)
    assert deleting.terminating and not deleting.usable
    assert bookies.observe_claim(api, "default", "missing", follow_volume=True) == ClaimObserved("missing", False)


class CountingApi(StoredApi):
    """A StoredApi that counts its GETs by kind and takes status patches and Events."""

    def __init__(self, *objects: tuple[str, dict]) -> None:
        super().__init__(*objects)
        self.gets: collections.Counter[str] = collections.Counter()

    def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> dict | None:
        self.gets[plural] += 1
        return super().get(api_version, plural, namespace, name)

    def patch_status(self, plural: str, namespace: str, name: str, status: dict, resource_version=None) -> None:
        self.objects[(plural, name)]["status"] = {**self.objects[(plural, name)].get("status", {}), **status}

    def post_event(self, involved: dict, reason: str, message: str, warning: bool = False) -> None:
        pass


def cached_sources(zk_connect: str, bookie: dict) -> bookies.BookieSources:
    """The operator's informer caches, holding `bookie`, its cluster, pod and claims."""
    cached = {("bookies", "bk-0"): bookie, ("bookieclusters", "bk"): bookie_cluster(zookeeper=zk_connect).to_wire(),
              ("pods", "bk-0"): pod(),
              **{("persistentvolumeclaims", name): {"metadata": {"name": name}, "spec": {}} for name in CLAIMS}}
    return bookies.BookieSources(*(lambda namespace, name, plural=plural: cached.get((plural, name)) for plural in
                                   ("bookies", "bookieclusters", "pods", "persistentvolumeclaims", "nodes")))


def test_a_serving_bookies_pass_reads_everything_from_the_watch_caches(zk_connect):
    """At 1,000 bookies each pass's GETs add up: the Bookie, its cluster, pod and claims come from the operator's
    watch-fed caches."""
    api = CountingApi(("bookies", bookie_body()))
    ctx = OperatorContext(api)  # type: ignore[arg-type]
    try:
        for _ in range(2):
            bookies.reconcile(ctx, bookie_body(), cached_sources(zk_connect, bookie_body()))
    finally:
        ctx.close()
    assert api.objects[("bookies", "bk-0")]["status"]["phase"] == "Pending"  # the pass ran: its pod is not registered
    assert api.gets == {}


class VersionedApi(CountingApi):
    """Status patches carry the resourceVersion precondition, as the API server checks it."""

    def patch_status(self, plural: str, namespace: str, name: str, status: dict, resource_version=None) -> dict:
        stored = self.objects[(plural, name)]
        if resource_version and resource_version != stored["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        super().patch_status(plural, namespace, name, status)
        stored["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"]) + 1)
        return stored


def test_a_pass_on_a_cached_copy_older_than_the_last_write_decides_again_on_a_fresh_read(zk_connect):
    """The cache may not hold the last pass's own write yet (a loss time recorded, a repair launched): deciding on
    the older copy would record the loss again. Its status patch is conditional on the version it read, so the stale
    pass meets 409 Conflict and runs again on a GET."""
    stored, stale = bookie_body(), bookie_body()
    stored["metadata"]["resourceVersion"], stale["metadata"]["resourceVersion"] = "2", "1"
    stored["status"]["phase"] = "Running"  # what a later write left; the stale copy has no phase
    api = VersionedApi(("bookies", stored))
    ctx = OperatorContext(api)  # type: ignore[arg-type]
    try:
        bookies.reconcile(ctx, stale, cached_sources(zk_connect, stale))
    finally:
        ctx.close()
    assert api.gets == {"bookies": 1}
    assert stored["status"]["phase"] == "Pending" and stored["metadata"]["resourceVersion"] == "3"


def test_a_settled_bookie_waits_for_a_change_and_one_in_motion_is_passed_again_at_the_retry_interval():
    settled = bookies.decide(observed(pod=pod(), info=registered()), NOW)
    assert not settled.requeue and settled.recheck_at is None
    assert bookies.decide(observed(pod=pod(), info=None), NOW).requeue  # starting: not registered yet
    assert bookies.decide(observed(pod=pod(ready=False, since=ago(5)), info=registered()), NOW).requeue
    assert bookies.decide(observed(bookie_body(lost_since=ago(5)), pod=None), NOW).requeue


# --- the status a pass writes ----------------------------------------------------------------------------------

LOST_AT = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def bookie_model(desired: DesiredState = DesiredState.WRITABLE, lost_since: dt.datetime | None = None) -> Bookie:
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
    status = bookies.decide_status(bookie_model(desired, lost_since), pod, info, 4, lost_since)
    assert status["phase"] == phase.value
    assert status["registered"] == (info is not None) and status["ledgers"] == 4
    assert status["pod"] == ("bk-0" if pod else None)


def test_bookie_disk_usage_comes_from_its_registration():
    quota = resources.quantity_bytes(bookie_model().spec.storage.ledgers.size)
    status = bookies.decide_status(bookie_model(), ready_pod(), registration(free=quota // 4), 0, None)
    assert status["diskUsage"] == 0.75
    assert bookies.decide_status(bookie_model(), None, None, 0, None)["diskUsage"] is None
