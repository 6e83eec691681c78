"""Operator upgrades as decisions (no API server, milliseconds): the images an empty spec field means, which pods an
upgraded operator restarts (only those whose bookie would run something else), and the rollout turn that lets one
cluster at a time restart its bookies."""

from __future__ import annotations

import pytest

from bookfleet import __version__
from bookfleet.kube import crdgen, resources
from bookfleet.kube.models import Bookie, BookieCluster
from bookfleet.kube.reconcilers import clusters
from bookfleet.kube.reconcilers.actions import Patch
from bookfleet.kube.resources import workload
from tests.fixtures.models import bookie_cluster
from tests.kube.test_bookiecluster_reconciler_decisions import (
    NOW,
    bookie_body,
    condition,
    decide,
    pod,
    status_of,
    touching,
    up,
)

NEXT = resources.OwnImages(version="0.2.0")
"""The operator of the next release, with the chart's default repositories."""


@pytest.fixture
def next_operator(monkeypatch: pytest.MonkeyPatch) -> resources.OwnImages:
    monkeypatch.setattr(resources.images, "OWN_IMAGES", NEXT)
    return NEXT


def test_an_empty_image_is_the_operators_own_versions_and_an_explicit_one_is_kept(monkeypatch) -> None:
    """The CRD defaults stored bookfleet/bookie:0.1.0 and bookfleet/repair:0.1.0 in every object, so a newer operator
    started bookies and repairs from images it did not ship with."""
    spec = crdgen.crd(BookieCluster)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    repair = spec["properties"]["autoRecovery"]["properties"]["repair"]
    assert spec["properties"]["image"].get("default", "") == ""
    assert repair["properties"]["image"].get("default", "") == repair.get("default", {}).get("image", "") == ""
    cluster = bookie_cluster(1)
    bookie = Bookie.model_validate(bookie_body(0))
    assert resources.bookie_pod(cluster, bookie)["spec"]["containers"][0]["image"] == f"bookfleet/bookie:{__version__}"
    own = resources.OwnImages("registry.example/bk", "registry.example/rp", "0.2.0")
    monkeypatch.setattr(resources.images, "OWN_IMAGES", own)
    assert resources.bookie_pod(cluster, bookie)["spec"]["containers"][0]["image"] == "registry.example/bk:0.2.0"
    job = resources.repair_job(cluster, bookie, NOW)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/rp:0.2.0"
    assert "registry.example/rp:0.2.0" in str(resources.spark_application(cluster, bookie, NOW)["spec"]["image"])
    pinned = bookie_cluster(1, image="mirror/bookie:0.1.0", autoRecovery={"repair": {"image": "mirror/repair:0.1.0"}})
    assert resources.bookie_pod(pinned, bookie)["spec"]["containers"][0]["image"] == "mirror/bookie:0.1.0"
    assert resources.repair_job(pinned, bookie, NOW)["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "mirror/repair:0.1.0")


def test_the_operators_image_repositories_come_from_its_flags(monkeypatch) -> None:
    monkeypatch.setenv(resources.BOOKIE_REPOSITORY_ENV, "registry.example/bookie")
    monkeypatch.delenv(resources.REPAIR_REPOSITORY_ENV, raising=False)
    own = resources.OwnImages.from_environment()
    assert (own.bookie, own.repair) == (f"registry.example/bookie:{__version__}", f"bookfleet/repair:{__version__}")


def test_an_operator_upgrade_that_changes_nothing_a_bookie_runs_restarts_no_bookie(monkeypatch, next_operator) -> None:
    """The rollout digest covered the whole pod as built: a new operator that only labelled or probed its pods
    otherwise restarted every bookie of every cluster. A cluster with its own image runs the same after an upgrade."""
    pinned = bookie_cluster(3, image="bookfleet/bookie:0.1.0")
    built_by_older = [up(ordinal, pinned) for ordinal in range(3)]
    monkeypatch.setattr(workload, "bookie_probes", lambda: {"readinessProbe": {"httpGet": {"path": "/ready"}}})
    monkeypatch.setattr(workload, "container_security_context", lambda: {"privileged": False})
    actions = decide(pinned, *built_by_older)
    assert touching(actions, "pods") == []
    assert status_of(actions)["updatedBookies"] == 3


def test_an_operator_upgrade_that_brings_a_new_bookie_image_rolls_a_cluster_without_one(next_operator) -> None:
    own = bookie_cluster(3)
    with pytest.MonkeyPatch.context() as older:
        older.setattr(resources.images, "OWN_IMAGES", resources.OwnImages(version="0.1.0"))
        built_by_older = [up(ordinal, own) for ordinal in range(3)]
    actions = decide(own, *built_by_older)
    assert touching(actions, "pods") == [("delete", "bk-0")]


LEGACY_HASHES = {"bk-0": "9a9a27694556c5c9", "bk-1": "c6a3208dc98f8254"}
"""The digests the operator of release 0.1.0 annotated the pods of `bookie_cluster(2, image=...0.1.0)` with (of the
whole pod as built), as that operator computes them."""


def test_pods_annotated_by_the_operator_before_are_annotated_anew_not_restarted() -> None:
    """The upgrade to the digest of what the bookie runs must not itself restart every bookie."""
    cluster = bookie_cluster(2, image="bookfleet/bookie:0.1.0")
    members = []
    for ordinal, name in enumerate(LEGACY_HASHES):
        member = up(ordinal, cluster)
        member.pod["metadata"]["annotations"][resources.ANNOTATION_CONFIG_HASH] = LEGACY_HASHES[name]
        members.append(member)
    actions = decide(cluster, *members)
    assert touching(actions, "pods") == [("patch", "bk-0"), ("patch", "bk-1")]
    for action, member in zip([a for a in actions if isinstance(a, Patch) and a.plural == "pods"], members,
                              strict=True):
        fresh = pod(cluster, member.body)["metadata"]["annotations"][resources.ANNOTATION_CONFIG_HASH]
        assert action.patch == {"metadata": {"annotations": {resources.ANNOTATION_CONFIG_HASH: fresh}}}
    assert status_of(actions)["updatedBookies"] == 2
    members[1].pod["metadata"]["annotations"][resources.ANNOTATION_CONFIG_HASH] = "0000000000000000"
    assert touching(decide(cluster, *members), "pods") == [("patch", "bk-0"), ("delete", "bk-1")]


OTHER = ("default", "other")


def test_clusters_roll_one_at_a_time() -> None:
    """An operator upgrade made every cluster's bookies outdated at once: each cluster restarted one of its bookies
    at the same moment, and a bad image reached every cluster before any had shown it works."""
    new = bookie_cluster(3, resources={"requests": {"cpu": "1"}})
    old = [up(ordinal) for ordinal in range(3)]
    waiting = decide(new, *old, turn_holder=OTHER)
    assert touching(waiting, "pods") == []
    upgrading = condition(status_of(waiting), clusters.UPGRADING)
    assert (upgrading["status"], upgrading["reason"]) == ("False", "WaitingForTurn")
    assert "after BookieCluster default/other's rollout" in upgrading["message"]

    (in_turn,) = [a for a in clusters.decide(observed(new, *old), NOW).actions if isinstance(a, clusters.InTurn)]
    assert in_turn.key == ("default", "bk") and [type(a) for a in in_turn.actions][:2] == [Patch, clusters.Delete]
    turn = clusters.RolloutTurn()
    assert turn.take(OTHER)
    clusters.InTurn(turn, in_turn.key, in_turn.actions).apply(None, {})  # taken meanwhile: nothing done (no API)
    turn.release(OTHER)
    assert turn.take(in_turn.key) and turn.holder() == in_turn.key


def test_the_turn_is_held_through_a_stuck_restart_and_given_up_when_done_or_paused() -> None:
    new = bookie_cluster(3, resources={"requests": {"cpu": "1"}})
    mine = ("default", "bk")
    started = {clusters.ANNOTATION_ROLLOUT_STARTED: "2026-01-01T00:00:00Z", "bookfleet.io/planned-restart": "p-bk-0"}
    stuck_body = bookie_body(0, **started)
    stuck = clusters.Member(stuck_body, pod(new, stuck_body, ready=False, uid="q"), False, False)
    actions = decide(new, stuck, up(1), up(2), turn_holder=mine)
    assert condition(status_of(actions), clusters.ROLLOUT_STUCK)["status"] == "True"
    assert not [a for a in actions if isinstance(a, clusters.GiveUpTurn)], "a stuck rollout halts the next cluster's"

    done = decide(new, *(up(ordinal, new) for ordinal in range(3)), turn_holder=mine)
    assert [a.key for a in done if isinstance(a, clusters.GiveUpTurn)] == [mine]

    paused = bookie_cluster(3, resources={"requests": {"cpu": "1"}}, rollout={"paused": True})
    actions = decide(paused, *(up(ordinal) for ordinal in range(3)), turn_holder=mine)
    assert touching(actions, "pods") == [] and [a.key for a in actions if isinstance(a, clusters.GiveUpTurn)] == [mine]
    upgrading = condition(status_of(actions), clusters.UPGRADING)
    assert (upgrading["reason"], upgrading["message"]) == ("Paused", "3 bookie(s) to restart: paused "
                                                                     "(spec.rollout.paused)")


def observed(of: BookieCluster, *bookies: clusters.Member) -> clusters.ObservedCluster:
    return clusters.ObservedCluster({**of.to_wire(), "status": {}}, of, "", bookies, {})
