"""BookieCluster decisions as pure functions (clusters.decide): every phase transition from observed state, with no
API server and no ZooKeeper, in milliseconds."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

from bookfleet.kube import resources
from bookfleet.kube.models import Bookie, BookieCluster
from bookfleet.kube.reconcilers import clusters, repairs
from bookfleet.kube.reconcilers.actions import Apply, ApplyShared, Delete, Ensure, Patch, PatchStatus, PostEvent
from bookfleet.kube.reconcilers.bookies import ANNOTATION_PLANNED_RESTART, ForgetCookie, LaunchRepair
from bookfleet.kube.runtime import metrics
from tests.fixtures.models import bookie_cluster

NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
NS = "default"


def bookie_body(ordinal: int, **annotations: str) -> dict:
    manifest = resources.bookies_for_cluster(bookie_cluster(ordinal + 1))[ordinal]
    manifest["metadata"].update(uid=f"b{ordinal}", annotations=annotations)
    return manifest


def pod(of: BookieCluster, body: dict, ready: bool = True, uid: str = "p") -> dict:
    built = resources.bookie_pod(of, Bookie.model_validate(body))
    built["metadata"]["uid"] = f"{uid}-{body['metadata']['name']}"
    built["status"] = {"conditions": [{"type": "Ready", "status": str(ready)}]}
    return built


def up(ordinal: int, of: BookieCluster | None = None, **annotations: str) -> clusters.Member:
    """A bookie ready and registered in a pod of `of`'s spec (the default cluster's when not given)."""
    body = bookie_body(ordinal, **annotations)
    return clusters.Member(body, pod(of or bookie_cluster(), body), registered=True, forced_read_only=False)


def draining(ordinal: int, pod_running: bool = True, cookie: bool = True, remaining: int = 0,
             since: str = "2026-01-02T03:00:00Z") -> clusters.Member:
    body = bookie_body(ordinal, **{clusters.ANNOTATION_DECOMMISSION_SINCE: since})
    body["spec"]["desiredState"] = "ReadOnly"
    return clusters.Member(body, pod(bookie_cluster(), body) if pod_running else None, registered=pod_running,
                                  forced_read_only=True, cookie=cookie, remaining_ledgers=remaining)


def claims_of(*names: str, **metadata: Any) -> dict[str, dict]:
    return {claim: {"metadata": {"name": claim, **metadata}, "spec": {"resources": {"requests": {"storage": "2Gi"}}}}
            for name in names for claim in resources.claim_names(name)}


def decide(of: BookieCluster, *bookies: clusters.Member, status: dict | None = None,
           claims: dict | None = None, moment: dt.datetime = NOW,
           turn_holder: clusters.ClusterKey | None = None) -> list:
    body = {**of.to_wire(), "status": status or {}}
    observed = clusters.ObservedCluster(body, of, "", bookies, claims or {}, turn_holder=turn_holder)
    return in_turn(clusters.decide(observed, moment).actions)


def in_turn(actions: tuple) -> list:
    """The actions with a restart's in line: what the pass does when it gets the rollout turn."""
    return [inner for action in actions
            for inner in (action.actions if isinstance(action, clusters.InTurn) else (action,))]


def of_type(actions: list, kind: type, **fields: Any) -> list:
    return [a for a in actions if isinstance(a, kind) and all(getattr(a, k) == v for k, v in fields.items())]


def touching(actions: list, plural: str) -> list[tuple[str, str]]:
    """(action, object name) of the Patch/Delete/Ensure actions on one kind of object, in order."""
    found = []
    for action in actions:
        if isinstance(action, Ensure) and resources_plural(action.manifest) == plural:
            found.append(("ensure", action.manifest["metadata"]["name"]))
        elif isinstance(action, Patch | Delete) and action.plural == plural:
            found.append((type(action).__name__.lower(), action.name))
    return found


def resources_plural(manifest: dict) -> str:
    return {"Bookie": "bookies", "PersistentVolumeClaim": "persistentvolumeclaims"}.get(manifest["kind"], "")


def status_of(actions: list) -> dict:
    (patch,) = of_type(actions, PatchStatus)
    return patch.changes


def condition(status: dict, type_: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == type_)


def events(actions: list) -> list[str]:
    return [a.reason for a in of_type(actions, PostEvent)]


def test_an_invalid_spec_is_reported_once():
    body = {"metadata": {"name": "bad", "namespace": NS}, "spec": {"replicas": 2, "zookeeper": "zk",
                                                                    "zones": ["a", "b", "c"]}}
    invalid, problem = clusters.validate(body)
    actions = list(clusters.decide(clusters.ObservedCluster(body, invalid, problem), NOW).actions)
    assert events(actions) == ["InvalidSpec"] and of_type(actions, PostEvent)[0].warning
    valid = condition(status_of(actions), "Valid")
    assert valid["status"] == "False" and "zones: c would have no bookie" in valid["message"]
    again = clusters.ObservedCluster({**body, "status": status_of(actions)}, None, problem)
    assert list(clusters.decide(again, NOW).actions) == []


def test_scale_up_creates_missing_bookies():
    actions = decide(bookie_cluster(3, generation=4), up(0))
    assert touching(actions, "bookies") == [("ensure", "bk-1"), ("ensure", "bk-2")]
    status = status_of(actions)
    assert (status["phase"], status["readyBookies"], status["desiredBookies"], status["updatedBookies"]) == (
        "Reconciling", 1, 3, 1)
    assert status["observedGeneration"] == 4  # the spec this status (and the ZooKeeper settings) answers to
    assert condition(status, "Ready")["reason"] == "NotAllReady"


def test_scale_up_replaces_volumes_released_by_a_drained_bookie_and_waits_for_dying_ones():
    released = claims_of("bk-2", annotations={clusters.ANNOTATION_RELEASED: "old-uid"})
    actions = decide(bookie_cluster(3), up(0), up(1), claims=released)
    assert touching(actions, "persistentvolumeclaims") == [("delete", "bk-2-journal"), ("delete", "bk-2-ledgers")]
    assert touching(actions, "bookies") == [] and "StaleVolumesDeleted" in events(actions)

    dying = claims_of("bk-2", deletionTimestamp="2026-01-02T03:04:00Z",
                      annotations={clusters.ANNOTATION_RELEASED: "old-uid"})
    actions = decide(bookie_cluster(3), up(0), up(1), claims=dying)
    assert touching(actions, "bookies") == [] and touching(actions, "persistentvolumeclaims") == []
    assert events(actions) == []  # deleted once, said once

    retained = claims_of("bk-2")  # left by a deleted cluster (whenDeleted: Retain): the bookie returns to its data
    actions = decide(bookie_cluster(3), up(0), up(1), claims=retained)
    assert touching(actions, "bookies") == [("ensure", "bk-2")]
    assert touching(actions, "persistentvolumeclaims") == []


def test_scale_down_drains_the_highest_ordinal_step_by_step():
    # 1. read-only, with the time the drain started
    actions = decide(bookie_cluster(2), up(0), up(1), up(2))
    assert touching(actions, "bookies") == [("patch", "bk-2")]
    patch = of_type(actions, Patch, name="bk-2")[0].patch
    assert patch["spec"] == {"desiredState": "ReadOnly"}
    assert patch["metadata"]["annotations"] == {clusters.ANNOTATION_DECOMMISSION_SINCE: "2026-01-02T03:04:05Z"}
    assert "Decommissioning" in events(actions) and status_of(actions)["phase"] == "Reconciling"

    # 2. forced read-only in ZooKeeper; its ledgers are repaired elsewhere; nothing is deleted yet
    actions = decide(bookie_cluster(2), up(0), up(1), draining(2, remaining=4))
    assert [(a.bookie.metadata.name, a.since) for a in of_type(actions, LaunchRepair)] == [
        ("bk-2", dt.datetime(2026, 1, 2, 3, 0, tzinfo=dt.UTC))]
    assert not of_type(actions, Delete) and not of_type(actions, ForgetCookie)

    # 3. drained: cookie forgotten, pod deleted, volumes kept (whenScaled Retain) and released from the Bookie
    actions = decide(bookie_cluster(2), up(0), up(1), draining(2), claims=claims_of("bk-2"))
    assert of_type(actions, ForgetCookie, bookie_id=bookie_body(2)["spec"]["bookieId"])
    assert touching(actions, "pods") == [("delete", "bk-2")]
    assert touching(actions, "persistentvolumeclaims") == [("patch", "bk-2-journal"), ("patch", "bk-2-ledgers")]
    release = of_type(actions, Patch, name="bk-2-journal")[0].patch["metadata"]
    assert release == {"ownerReferences": None, "annotations": {clusters.ANNOTATION_RELEASED: "b2"}}
    assert touching(actions, "bookies") == []  # not while its process may still turn it writable

    # 4. pod gone: switch cleared, Bookie deleted
    actions = decide(bookie_cluster(2), up(0), up(1), draining(2, pod_running=False, cookie=False),
                     claims=claims_of("bk-2", annotations={clusters.ANNOTATION_RELEASED: "b2"}))
    assert of_type(actions, clusters.SetForcedReadOnly, reason=None)
    assert touching(actions, "bookies") == [("delete", "bk-2")]
    assert touching(actions, "persistentvolumeclaims") == []
    assert "Decommissioned" in events(actions)

    # whenScaled Delete: its volumes go once it is drained
    deleting = bookie_cluster(2, persistentVolumeClaimRetentionPolicy={"whenScaled": "Delete"})
    actions = decide(deleting, up(0, deleting), up(1, deleting), draining(2), claims=claims_of("bk-2"))
    assert touching(actions, "persistentvolumeclaims") == [("delete", "bk-2-journal"), ("delete", "bk-2-ledgers")]


def repair_attempt(state: str, attempt: int, finished: dt.datetime) -> dict:
    """A repair Job of a drain as the observe step sees it."""
    condition = {"type": state, "status": "True", "lastTransitionTime": finished.isoformat()}
    return {"kind": "Job", "metadata": {"name": f"bk-2-repair-{attempt}", "annotations": {
        repairs.ANNOTATION_ATTEMPT: str(attempt)}}, "status": {"conditions": [condition]} if state else {"active": 1}}


def test_a_drains_repair_is_decided_from_its_observed_attempts_and_launched_by_the_act_step():
    """The drain's repair follows the lost bookie's rule: one attempt at a time, a failed one again after its
    backoff, none while auto-recovery is disabled; decide names the attempt, LaunchRepair (act) creates it."""
    def launched(repair: repairs.RepairObserved, disabled: bool = False) -> list[int]:
        bookie = replace(draining(2, remaining=4), repair=repair)
        body = {**bookie_cluster(2).to_wire(), "status": {}}
        observed = clusters.ObservedCluster(body, bookie_cluster(2), "", (up(0), up(1), bookie), {}, disabled)
        actions = clusters.decide(observed, NOW).actions
        return [action.attempt for action in of_type(actions, LaunchRepair)]

    assert launched(repairs.RepairObserved()) == [0]
    assert launched(repairs.RepairObserved((repair_attempt("", 0, NOW),))) == []  # running: nothing twice
    failed = repair_attempt("Failed", 0, NOW - dt.timedelta(seconds=2))
    assert launched(repairs.RepairObserved((failed,))) == []  # backing off
    failed = repair_attempt("Failed", 0, NOW - dt.timedelta(seconds=60))
    assert launched(repairs.RepairObserved((failed,))) == [1]
    assert launched(repairs.RepairObserved(), disabled=True) == []


def test_scaled_up_again_mid_drain():
    # its cookie still there: writable again, with its data
    actions = decide(bookie_cluster(3), up(0), up(1), draining(2, remaining=4))
    patch = of_type(actions, Patch, name="bk-2")[0].patch
    assert patch["spec"] == {"desiredState": "Writable"} and "DecommissionCancelled" in events(actions)
    assert not of_type(actions, LaunchRepair)
    # its cookie gone: the drain finishes first, then the ordinal starts afresh
    actions = decide(bookie_cluster(3), up(0), up(1), draining(2, pod_running=False, cookie=False))
    assert touching(actions, "bookies") == [("delete", "bk-2")]


def test_a_spec_change_rolls_one_bookie_at_a_time():
    new = bookie_cluster(3, resources={"requests": {"cpu": "1"}, "limits": {"cpu": "2"}})
    actions = decide(new, up(0), up(1), up(2))
    assert touching(actions, "pods") == [("delete", "bk-0")]
    annotations = of_type(actions, Patch, name="bk-0")[0].patch["metadata"]["annotations"]
    assert annotations == {ANNOTATION_PLANNED_RESTART: "p-bk-0",
                           clusters.ANNOTATION_ROLLOUT_STARTED: "2026-01-02T03:04:05Z"}
    # the Patch (a planned restart, never a loss) comes before the Delete
    assert actions.index(of_type(actions, Patch, name="bk-0")[0]) < actions.index(of_type(actions, Delete)[0])
    status = status_of(actions)
    assert status["updatedBookies"] == 0 and condition(status, "Upgrading")["message"] == "restarting bk-0"

    # bk-0 back in a pod of the new spec, not ready yet: nobody else goes
    started = {clusters.ANNOTATION_ROLLOUT_STARTED: "2026-01-02T03:04:05Z",
               ANNOTATION_PLANNED_RESTART: "p-bk-0"}
    body = bookie_body(0, **started)
    restarting = clusters.Member(body, pod(new, body, ready=False, uid="q"), False, False)
    actions = decide(new, restarting, up(1), up(2), moment=NOW + dt.timedelta(seconds=30))
    assert touching(actions, "pods") == []
    status = status_of(actions)
    assert condition(status, "RolloutStuck")["status"] == "False" and status["phase"] == "Reconciling"

    # ready and registered: the rollout marks it done and moves on to bk-1
    ready = clusters.Member(body, pod(new, body, uid="q"), True, False)
    actions = decide(new, ready, up(1), up(2))
    assert touching(actions, "pods") == [("delete", "bk-1")]
    done = of_type(actions, Patch, name="bk-0")[0].patch
    assert done == {"metadata": {"annotations": {clusters.ANNOTATION_ROLLOUT_STARTED: None}}}
    assert "BookieUpdated" in events(actions) and status_of(actions)["updatedBookies"] == 1

    # all current: nothing to do, the cluster is Ready
    actions = decide(new, up(0, new), up(1, new), up(2, new))
    assert touching(actions, "pods") == [] and touching(actions, "bookies") == []
    status = status_of(actions)
    assert (status["phase"], status["updatedBookies"]) == ("Ready", 3)
    assert condition(status, "Upgrading")["status"] == "False"


def test_bookie_settings_passed_through_config_reach_the_command_and_roll_like_any_change():
    tuned = bookie_cluster(3, bookie={"config": {"journal-max-wait": "0.002", "max-connections": "512"}})
    command = resources.bookie_command(tuned, Bookie.model_validate(bookie_body(0)))
    assert command[-4:] == ["--journal-max-wait", "0.002", "--max-connections", "512"]
    assert touching(decide(tuned, up(0), up(1), up(2)), "pods") == [("delete", "bk-0")]
    assert touching(decide(tuned, up(0, tuned), up(1, tuned), up(2, tuned)), "pods") == []  # rolled: nothing more


def test_an_outdated_bookie_waits_while_another_one_is_down():
    new = bookie_cluster(3, image="bookfleet/bookie:9")
    body = bookie_body(1)
    down = clusters.Member(body, pod(bookie_cluster(), body, ready=False), registered=False, forced_read_only=False)
    actions = decide(new, up(0), down, up(2))
    assert touching(actions, "pods") == [("delete", "bk-1")]  # the one down anyway may go
    actions = decide(new, up(0), clusters.Member(body, None, False, False), up(2))
    assert touching(actions, "pods") == []
    assert condition(status_of(actions), "Upgrading")["message"] == "waiting for bk-1 to be ready"


def test_a_bookie_not_ready_within_the_timeout_halts_the_rollout():
    new = bookie_cluster(3, image="bookfleet/bookie:broken", rolloutTimeoutSeconds=60)
    body = bookie_body(0, **{clusters.ANNOTATION_ROLLOUT_STARTED: "2026-01-02T03:04:05Z",
                             ANNOTATION_PLANNED_RESTART: "p-bk-0"})
    broken = clusters.Member(body, pod(new, body, ready=False, uid="q"), False, False)
    later = NOW + dt.timedelta(seconds=61)
    actions = decide(new, broken, up(1), up(2), moment=later)
    assert touching(actions, "pods") == [] and events(actions) == ["RolloutStuck"]
    assert of_type(actions, PostEvent)[0].warning
    stuck = condition(status_of(actions), "RolloutStuck")
    assert stuck["status"] == "True" and "bk-0" in stuck["message"]
    # said once: the next pass only keeps the condition
    again = decide(new, broken, up(1), up(2), status=status_of(actions), moment=later)
    assert events(again) == [] and condition(status_of(again), "RolloutStuck")["status"] == "True"

    # the spec fixed: the stuck bookie restarts at once (it is down anyway), the others still wait
    fixed = bookie_cluster(3, image="bookfleet/bookie:fixed", rolloutTimeoutSeconds=60)
    actions = decide(fixed, broken, up(1), up(2), status=status_of(actions), moment=later)
    assert touching(actions, "pods") == [("delete", "bk-0")]
    assert condition(status_of(actions), "RolloutStuck")["status"] == "False"


def test_a_pod_still_terminating_after_its_restart_is_waited_for():
    new = bookie_cluster(3, image="bookfleet/bookie:9")
    body = bookie_body(0, **{clusters.ANNOTATION_ROLLOUT_STARTED: "2026-01-02T03:04:05Z",
                             ANNOTATION_PLANNED_RESTART: "p-bk-0"})
    old = pod(bookie_cluster(), body)
    old["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:06Z"
    actions = decide(new, clusters.Member(body, old, True, False), up(1), up(2))
    assert touching(actions, "pods") == [] and touching(actions, "bookies") == []


def sized(asked: str, capacity: str, **annotations: str) -> dict[str, dict]:
    """The claims of bk-0..bk-2: the size each asks for, the capacity its volume has, its annotations."""
    return {name: {"metadata": {"name": name, "annotations": annotations},
                   "spec": {"resources": {"requests": {"storage": asked}}},
                   "status": {"capacity": {"storage": capacity}}}
            for bookie in ("bk-0", "bk-1", "bk-2") for name in resources.claim_names(bookie)}


def test_storage_grows_claims_first_and_rolls_the_new_quota_once_the_volume_has_grown():
    """The pod's --disk-quota follows the volume, not the spec: a quota above the filesystem's size let the bookie
    fill its disk to ENOSPC instead of turning read-only."""
    bigger = bookie_cluster(3, storage={"journal": {"size": "2Gi"}, "ledgers": {"size": "20Gi"}})
    before = bookie_cluster(3, storage={"journal": {"size": "2Gi"}, "ledgers": {"size": "10Gi"}})
    bookies = [clusters.Member(body := bookie_body(n), pod(before, body), True, False) for n in range(3)]
    for body in (b.body for b in bookies):
        body["spec"]["storage"] = before.spec.storage.to_wire()
    asked = decide(bigger, *bookies, claims=sized("10Gi", "10Gi"))
    assert of_type(asked, clusters.ExpandClaim) == [clusters.ExpandClaim(NS, f"bk-{n}-ledgers", "20Gi")
                                                     for n in range(3)]
    assert touching(asked, "bookies") == [] and touching(asked, "pods") == []  # not before the volume grew

    growing = decide(bigger, *bookies, claims=sized("20Gi", "10Gi"))
    assert of_type(growing, clusters.ExpandClaim) == [] and touching(growing, "pods") == []

    grown = decide(bigger, *bookies, claims=sized("20Gi", "20Gi"))
    storage = of_type(grown, Patch, plural="bookies", name="bk-0")[0].patch
    assert storage == {"spec": {"storage": bigger.spec.storage.to_wire()}}
    assert touching(grown, "pods") == [("delete", "bk-0")]  # --disk-quota changed, one bookie at a time


def test_a_refused_expansion_leaves_the_bookies_and_their_quota_as_they_are():
    bigger = bookie_cluster(3, storage={"journal": {"size": "2Gi"}, "ledgers": {"size": "20Gi"}})
    before = bookie_cluster(3, storage={"journal": {"size": "2Gi"}, "ledgers": {"size": "10Gi"}})
    bookies = [clusters.Member(body := bookie_body(n), pod(before, body), True, False) for n in range(3)]
    for body in (b.body for b in bookies):
        body["spec"]["storage"] = before.spec.storage.to_wire()
    refused = sized("10Gi", "10Gi", **{clusters.ANNOTATION_EXPANSION_REFUSED: "20Gi"})
    actions = decide(bigger, *bookies, claims=refused)
    assert of_type(actions, clusters.ExpandClaim) == []
    assert touching(actions, "bookies") == [] and touching(actions, "pods") == []
    assert condition(status_of(actions), "VolumesExpanded")["status"] == "False"


def test_claim_owners_follow_whenDeleted():
    deleting = bookie_cluster(3, persistentVolumeClaimRetentionPolicy={"whenDeleted": "Delete"})
    claims = {name: {"metadata": {"name": name}, "spec": {"resources": {"requests": {"storage": "2Gi"}}}}
              for name in resources.claim_names("bk-0")}
    actions = decide(deleting, up(0, deleting), up(1, deleting), up(2, deleting), claims=claims)
    owners = [a.patch["metadata"]["ownerReferences"] for a in of_type(actions, Patch, plural="persistentvolumeclaims")]
    assert [[(o["kind"], o["name"], o["uid"]) for o in refs] for refs in owners] == [[("Bookie", "bk-0", "b0")]] * 2
    # Retain (the default): owned claims are let go, so deleting the cluster keeps them
    owned = {name: {**claim, "metadata": {**claim["metadata"], "ownerReferences": owners[0]}}
             for name, claim in claims.items()}
    actions = decide(bookie_cluster(3), up(0), up(1), up(2), claims=owned)
    assert [a.patch for a in of_type(actions, Patch, plural="persistentvolumeclaims")] == [
        {"metadata": {"ownerReferences": None}}] * 2


def applied(actions: list) -> dict[tuple[str, str], dict]:
    return {(a.manifest["kind"], a.manifest["metadata"]["name"]): a.manifest
            for a in [*of_type(actions, Apply), *of_type(actions, ApplyShared)]}


def test_every_pass_applies_the_objects_the_cluster_owns_as_the_current_spec_builds_them():
    """Server-side apply of each owned object on every pass: a spec change or a new operator version reaches the
    Service, budget, policies and repair account (created once and never updated before), and drift is undone."""
    actions = decide(bookie_cluster(), up(0), up(1), up(2))
    owned = applied(actions)
    assert set(owned) == {("Service", "bk-bookies"), ("PodDisruptionBudget", "bk-bookies"),
                          ("NetworkPolicy", "bk-bookie"), ("NetworkPolicy", "bk-repair"),
                          ("ServiceAccount", "bookfleet-repair"), ("Role", "bookfleet-repair"),
                          ("RoleBinding", "bookfleet-repair"),
                          ("ConfigMap", resources.executor_template_name(bookie_cluster()))}
    assert not of_type(actions, Ensure)
    changed = bookie_cluster(maxUnavailable=2, bookie={"httpPort": 8080})
    owned = applied(decide(changed, up(0, changed), up(1, changed), up(2, changed)))
    assert {p["port"] for p in owned[("Service", "bk-bookies")]["spec"]["ports"]} == {3181, 8080}
    assert owned[("PodDisruptionBudget", "bk-bookies")]["spec"]["minAvailable"] == 1
    assert owned[("Role", "bookfleet-repair")]["rules"] == resources.REPAIR_RULES


def test_the_repair_account_is_shared_each_cluster_one_of_its_owners_and_none_its_controller():
    """Clusters of a namespace name the same repair account: each claims it as an owner, so the account goes with
    the last of them (tests/kube/test_operator_actions.py on a real API server) and none of them owns it alone."""
    cluster = bookie_cluster()
    shared = of_type(decide(cluster, up(0), up(1), up(2)), ApplyShared)
    assert [(a.manifest["kind"], a.manifest["metadata"]["name"]) for a in shared] == [
        ("ServiceAccount", "bookfleet-repair"), ("Role", "bookfleet-repair"), ("RoleBinding", "bookfleet-repair")]
    for action in shared:
        assert "ownerReferences" not in action.manifest["metadata"]
        (owner,) = action.claim["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("BookieCluster", cluster.metadata.uid, False)


def test_network_policies_switched_off_are_not_applied_and_the_operators_own_are_deleted():
    off = bookie_cluster(networkPolicy={"enabled": False})
    actions = decide(off, up(0, off), up(1, off), up(2, off))
    assert not [key for key in applied(actions) if key[0] == "NetworkPolicy"]
    assert [(a.plural, a.name) for a in of_type(actions, Delete)] == [("networkpolicies", "bk-bookie"),
                                                                        ("networkpolicies", "bk-repair")]


def health(actions: list) -> metrics.FleetHealth:
    (recorded,) = of_type(actions, clusters.RecordFleetHealth)
    return recorded.health


def test_the_fleets_health_comes_from_zookeepers_facts_with_every_zone_of_the_spec_shown():
    """Markers and DATA_LOSS records of every ledger (a Ledger resource or not), the oldest marker's time, the
    writable registrations by zone: a zone of the spec with no writable bookie left shows 0, so an alert sees it."""
    zoned = bookie_cluster(3, zones=["a", "b", "c"])
    facts = clusters.FleetFacts(under_replicated=5, data_loss=1, oldest_marker_ms=1_000, writable_zones=("a", "a", ""))
    body = {**zoned.to_wire(), "status": {}}
    observed = clusters.ObservedCluster(body, zoned, "", (up(0, zoned), up(1, zoned), up(2, zoned)), {}, fleet=facts)
    assert health(list(clusters.decide(observed, NOW).actions)) == metrics.FleetHealth(
        5, 1, 1_000, {"a": 2, "b": 0, "c": 0, "": 1}, rollout_stuck=False, repairs_given_up=0)


def test_without_zones_in_the_spec_every_zone_its_bookies_took_from_their_nodes_is_shown():
    """Zones taken from the nodes are the Bookies': one whose bookies all went read-only still shows, at 0."""
    flat = bookie_cluster(3)
    members = [up(i, flat) for i in range(3)]
    for member, zone in zip(members, ("a", "b", None), strict=True):
        member.body["spec"]["zone"] = zone
    facts = clusters.FleetFacts(writable_zones=("a", ""))
    observed = clusters.ObservedCluster({**flat.to_wire(), "status": {}}, flat, "", tuple(members), {}, fleet=facts)
    assert health(list(clusters.decide(observed, NOW).actions)).writable_by_zone == {"a": 1, "b": 0, "": 1}


def test_a_stuck_rollout_and_repairs_given_up_show_in_the_fleets_health():
    """A lost bookie's repair that gave up (its Repaired condition) and a drain's (decided from its attempts, as its
    next step is) both count: either leaves ledgers under-replicated until a person looks."""
    new = bookie_cluster(3, image="bookfleet/bookie:broken", rolloutTimeoutSeconds=60)
    body = bookie_body(0, **{clusters.ANNOTATION_ROLLOUT_STARTED: "2026-01-02T03:04:05Z",
                             ANNOTATION_PLANNED_RESTART: "p-bk-0"})
    broken = clusters.Member(body, pod(new, body, ready=False, uid="q"), False, False)
    assert health(decide(new, broken, up(1), up(2), moment=NOW + dt.timedelta(seconds=61))).rollout_stuck

    gave_up = up(1)
    gave_up.body["status"] = {"conditions": [{"type": "Repaired", "status": "False", "reason": "RepairGaveUp"}]}
    failed = tuple(repair_attempt("Failed", n, NOW - dt.timedelta(hours=1)) for n in range(repairs.MAX_ATTEMPTS))
    drain = replace(draining(2, remaining=4), repair=repairs.RepairObserved(failed))
    two = bookie_cluster(2)
    observed = clusters.ObservedCluster({**two.to_wire(), "status": {}}, two, "", (up(0), gave_up, drain), {})
    assert health(list(clusters.decide(observed, NOW).actions)).repairs_given_up == 2
    assert health(decide(two, up(0), up(1))).repairs_given_up == 0
