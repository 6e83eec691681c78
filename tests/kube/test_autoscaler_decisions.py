"""The disk autoscaler's decisions, pure (clusters.decide with spec.autoscaling): one bookie more past the add
threshold, one fewer (through the drain) under the remove threshold, never two at once, never within the cooldown,
never outside min..max; in milliseconds with no API server and no ZooKeeper (against both:
test_autoscaler.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from bookfleet.kube import resources
from bookfleet.kube.models import BookieCluster
from bookfleet.kube.reconcilers import autoscaler, clusters
from bookfleet.kube.reconcilers.actions import Patch, PostEvent
from bookfleet.kube.runtime.context import timestamp
from tests.fixtures.models import bookie_cluster
from tests.kube.test_bookiecluster_reconciler_decisions import NOW, draining, of_type, up

POLICY = {"minReplicas": 3, "maxReplicas": 5, "scaleUpDiskUsage": 0.8, "scaleDownDiskUsage": 0.4,
          "cooldownSeconds": 600}


def scaling(replicas: int, **policy: Any) -> BookieCluster:
    return bookie_cluster(replicas, autoscaling={**POLICY, **policy})


def used(member: clusters.Member, fraction: float) -> tuple[str, int]:
    """The registration's free bytes of a bookie whose ledger volume is used `fraction`."""
    quota = resources.quantity_bytes(member.model.spec.storage.ledgers.size)
    return member.body["spec"]["bookieId"], round(quota * (1 - fraction))


def decide(cluster: BookieCluster, usage: dict[int, float], *members: clusters.Member,
           scaled_ago: float | None = None, moment: dt.datetime = NOW) -> list:
    """One pass over `members` (default: bookies 0..replicas-1 up, in pods of `cluster`'s spec) whose registrations
    report `usage` by ordinal."""
    members = members or tuple(up(i, cluster) for i in range(cluster.spec.replicas))
    free = dict(used(members[i], fraction) for i, fraction in usage.items())
    body: dict[str, Any] = {**cluster.to_wire(), "status": {}}
    body["metadata"].update(resourceVersion="41")
    if scaled_ago is not None:
        body["metadata"]["annotations"] = {
            autoscaler.ANNOTATION_SCALED_AT: timestamp(moment - dt.timedelta(seconds=scaled_ago))}
    observed = clusters.ObservedCluster(body, cluster, "", members, {}, fleet=clusters.FleetFacts(free_bytes=free))
    return list(clusters.decide(observed, moment).actions)


def scaled_to(actions: list) -> int | None:
    """The replicas the pass sets, checking the one patch that carries them with the change's time."""
    patches = [a for a in of_type(actions, Patch) if a.plural == "bookieclusters"]
    if not patches:
        return None
    (patch,) = patches
    assert patch.if_version == "41"
    assert patch.patch["metadata"]["annotations"] == {autoscaler.ANNOTATION_SCALED_AT: timestamp(NOW)}
    return patch.patch["spec"]["replicas"]


def events(actions: list) -> dict[str, str]:
    return {a.reason: a.message for a in of_type(actions, PostEvent)}


def test_a_bookie_past_the_add_threshold_adds_one_bookie():
    actions = decide(scaling(3), {0: 0.5, 1: 0.85, 2: 0.5})
    assert scaled_to(actions) == 4
    assert events(actions)[autoscaler.SCALED_UP] == ("replicas 3 -> 4: bk-1 has used 85% of its ledger volume "
                                                     "(scaleUpDiskUsage 80%): one bookie more")


def test_no_bookie_is_added_past_max_replicas():
    assert scaled_to(decide(scaling(5), {i: 0.9 for i in range(5)})) is None


@pytest.mark.parametrize(("scaled_ago", "scales"), [(60, False), (599, False), (600, True), (None, True)])
def test_no_change_within_the_cooldown_of_the_last(scaled_ago, scales):
    actions = decide(scaling(3), {0: 0.9, 1: 0.5, 2: 0.5}, scaled_ago=scaled_ago)
    assert scaled_to(actions) == (4 if scales else None)


def test_every_bookie_under_the_remove_threshold_removes_one_through_the_drain():
    """The autoscaler lowers replicas and does nothing else; the next pass drains the highest ordinal as any
    scale-down (read-only first, its ledgers repaired elsewhere before its pod and Bookie go)."""
    cluster = scaling(4)
    actions = decide(cluster, {0: 0.2, 1: 0.3, 2: 0.25, 3: 0.1})
    assert scaled_to(actions) == 3
    assert "the others would use 28%" in events(actions)[autoscaler.SCALED_DOWN]
    assert not [a for a in of_type(actions, Patch) if a.plural == "bookies"]
    lowered = scaling(3)
    next_pass = decide(lowered, {0: 0.2, 1: 0.3, 2: 0.25, 3: 0.1}, *(up(i, lowered) for i in range(4)))
    (drain,) = [a for a in of_type(next_pass, Patch) if a.plural == "bookies"]
    assert (drain.name, drain.patch["spec"]) == ("bk-3", {"desiredState": "ReadOnly"})
    assert scaled_to(next_pass) is None, "the drain under way holds every other change"


def test_no_bookie_is_removed_below_min_replicas():
    assert scaled_to(decide(scaling(3), {0: 0.1, 1: 0.1, 2: 0.1})) is None


def test_no_bookie_is_removed_when_the_others_would_pass_the_add_threshold_with_its_data():
    """Two bookies at 35% would be one at 70%: past a 60% add threshold, the removal would call for an addition."""
    assert scaled_to(decide(scaling(2, minReplicas=1, scaleUpDiskUsage=0.6), {0: 0.35, 1: 0.35})) is None
    assert scaled_to(decide(scaling(2, minReplicas=1, scaleUpDiskUsage=0.8), {0: 0.35, 1: 0.35})) == 1


def test_no_change_while_the_last_one_is_under_way():
    """Never two at once: not while a bookie is drained, nor while one is missing, starting or not registered."""
    cluster = scaling(3)
    full = {0: 0.9, 1: 0.9, 2: 0.9}
    being_drained = (up(0, cluster), up(1, cluster), up(2, cluster), draining(3, remaining=4))
    assert scaled_to(decide(cluster, full, *being_drained)) is None
    assert scaled_to(decide(cluster, {0: 0.9, 1: 0.9}, up(0, cluster), up(1, cluster))) is None
    starting = clusters.Member(up(2, cluster).body, up(2, cluster).pod, registered=False, forced_read_only=False)
    assert scaled_to(decide(cluster, full, up(0, cluster), up(1, cluster), starting)) is None
    assert scaled_to(decide(cluster, {0: 0.9, 1: 0.9})) is None, "bk-2's usage is not known: no registration"


@pytest.mark.parametrize(("replicas", "bounded"), [(1, 3), (7, 5)])
def test_replicas_outside_min_and_max_are_brought_back_at_once(replicas, bounded):
    cluster = scaling(replicas)
    assert scaled_to(decide(cluster, dict.fromkeys(range(replicas), 0.5), scaled_ago=1)) == bounded


def test_without_autoscaling_replicas_stay_what_the_spec_says():
    assert scaled_to(decide(bookie_cluster(3), {0: 0.99, 1: 0.99, 2: 0.99})) is None
