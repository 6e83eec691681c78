"""The real operator (`bookfleet operator`, kopf) against the emulator, real ZooKeeper and real bookie processes."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import time
from typing import Any

import pytest

from bookfleet.meta import bookiestate, zkpaths
from bookfleet.meta.metadata import MetadataStore, new_metadata
from bookfleet.meta.registry import BookieInfo, BookieRegistry
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.security.certs import CertificateAuthority, write_tls_dir
from bookfleet.security.roles import Role
from bookfleet.security.tls import TLS_DIR_ENV
from tests.emulator import EmulatorThread
from tests.fixtures.kube import NS, adopt_ledger, condition, read_ledger, status, wait_for, write_ledger
from tests.fixtures.models import bookie_cluster_manifest


def event_reasons(kube: EmulatorThread, kind: str, name: str) -> set[str]:
    """Reasons of the Events posted on one object."""
    return {e["reason"] for e in kube.list("events", NS)
            if (e["involvedObject"]["kind"], e["involvedObject"]["name"]) == (kind, name)}


def test_closed_loop_lost_bookie_is_repaired_once(kube, podrunner, operator_process, zk_connect, zk):
    kube.create("bookieclusters", bookie_cluster_manifest(zk_connect, delay=30))
    wait_for("3 bookies running", lambda: all(status(kube, "bookies", f"bk-{i}").get("phase") == "Running"
                                              for i in range(3)))
    assert {b["metadata"]["name"] for b in kube.list("bookies", NS)} == {"bk-0", "bk-1", "bk-2"}
    assert {c["metadata"]["name"] for c in kube.list("persistentvolumeclaims", NS)} == {
        f"bk-{i}-{v}" for i in range(3) for v in ("journal", "ledgers")}
    wait_for("cluster ready", lambda: status(kube, "bookieclusters", "bk").get("readyBookies") == 3)

    ledger = adopt_ledger(kube, zk_connect)
    ledger_id = ledger["ledgerId"]
    assert (ledger["state"], ledger["lastEntryId"]) == ("CLOSED", 19)
    victim_id = ledger["segments"][0]["bookies"][0]
    victim = victim_id.split(".")[0]

    # 1. The pod comes back on its volumes within the delay: no repair.
    old_uid = kube.get("pods", NS, victim)["metadata"]["uid"]
    kube.delete("pods", NS, victim)
    wait_for("loss recorded", lambda: status(kube, "bookies", victim).get("lostSince"))
    wait_for("bookie back", lambda: not status(kube, "bookies", victim).get("lostSince"), timeout=60)
    assert kube.get("pods", NS, victim)["metadata"]["uid"] != old_uid
    assert condition(status(kube, "bookies", victim), "Lost")["reason"] == "BookieReturned"
    assert kube.list("jobs", NS) == []
    assert UnderReplication(zk).ledger_ids() == []

    # 2. Pod and data lost for longer than the delay: marked, repaired by one Job, even across an operator restart.
    kube.patch("bookieclusters", NS, "bk", {"spec": {"autoRecovery": {"lostBookieRecoveryDelaySeconds": 1}}})
    wait_for("bookie registered again", lambda: status(kube, "bookies", victim).get("phase") == "Running")
    kube.delete("pods", NS, victim)
    for volume in ("journal", "ledgers"):
        kube.delete("persistentvolumeclaims", NS, f"{victim}-{volume}")
    job = wait_for("repair job", lambda: kube.list("jobs", NS))[0]
    assert UnderReplication(zk).marker(ledger_id).missing_bookies == {victim_id}
    wait_for("the losses and the launch in the operator's metrics", lambda: operator_process.metric(
        "bookfleet_operator_bookies_lost_total") >= 2 and operator_process.metric(
        "bookfleet_operator_repairs_total", outcome="launched") == 1)
    # The Ledger follows the repair before the operator goes (else its RepairLaunched Event races with the kill).
    wait_for("the Ledger following the repair", lambda: (status(kube, "ledgers", "adopted").get("repair") or {})
             .get("job") == job["metadata"]["name"])
    # Counted on its cluster, posted at the end of their window: a killed operator loses the window's count.
    wait_for("the Ledger's loss Events, counted on its cluster", lambda: {"UnderReplicated", "RepairLaunched"}
             <= event_reasons(kube, "BookieCluster", "bk"))
    operator_process.kill()
    operator_process.start()
    wait_for("repair finished", lambda: (kube.get("jobs", NS, job["metadata"]["name"]).get("status") or {})
             .get("completionTime"), timeout=120)
    healed = wait_for("ledger healthy", lambda: (s := status(kube, "ledgers", "adopted")).get("repair", {})
                      .get("state") == "Succeeded" and not s.get("underReplicated") and s, timeout=60)
    assert all(victim_id not in segment["bookies"] for segment in healed["segments"])
    assert condition(healed, "DataLoss")["status"] == "False"
    assert [j["metadata"]["name"] for j in kube.list("jobs", NS)] == [job["metadata"]["name"]]
    assert podrunner.finished_jobs == [job["metadata"]["name"]]
    assert asyncio.run(read_ledger(zk_connect, ledger_id)) == [f"entry-{i}".encode() for i in range(20)]

    # The bookie rejoins empty, with a fresh cookie, once nothing needs its old data.
    wait_for("bookie rejoined", lambda: status(kube, "bookies", victim).get("phase") == "Running", timeout=60)
    assert condition(status(kube, "bookies", victim), "Repaired")["status"] == "True"
    assert zk.exists(zkpaths.cookie(victim_id))
    reasons = {e["reason"] for e in kube.list("events", NS)}
    assert {"BookieLost", "BookieReturned", "RepairLaunched", "RepairSucceeded"} <= reasons
    wait_for("the Ledger's repair Events, counted on its cluster", lambda: {"RepairSucceeded", "FullyReplicated"}
             <= event_reasons(kube, "BookieCluster", "bk"))
    # The restarted operator's metrics: the repair's success, and no launch of its own.
    assert operator_process.metric("bookfleet_operator_repairs_total", outcome="succeeded") >= 1
    assert operator_process.metric("bookfleet_operator_repairs_total", outcome="launched") == 0


def test_invalid_spec_upgrade_one_at_a_time_and_safe_scale_down(kube, podrunner, operator_process, zk_connect, zk):
    kube.create("bookieclusters", {**bookie_cluster_manifest(zk_connect, replicas=2, zones=["a", "b", "c"]),
                                   "metadata": {"name": "bad", "namespace": NS}})
    invalid = wait_for("Valid condition", lambda: condition(status(kube, "bookieclusters", "bad"), "Valid"))
    assert invalid["status"] == "False" and "zones: c would have no bookie" in invalid["message"]

    kube.create("bookieclusters", bookie_cluster_manifest(zk_connect, delay=30))
    wait_for("cluster ready", lambda: status(kube, "bookieclusters", "bk").get("readyBookies") == 3)
    assert kube.list("bookies", NS, "bookfleet.io/cluster=bad") == []

    # Rolling upgrade: any change that reaches the pod (here image and resources) restarts one bookie at a time,
    # each back, ready and registered before the next goes.
    kube.patch("bookieclusters", NS, "bk", {"spec": {"image": "bookfleet/bookie:0.2.0", "resources": {
        "requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}}})
    most_down = 0

    def upgraded() -> bool:
        nonlocal most_down
        pods = {p["metadata"]["name"]: p for p in kube.list("pods", NS, "bookfleet.io/cluster=bk")}
        ready = [n for n, p in pods.items() if condition(p.get("status") or {}, "Ready").get("status") == "True"]
        most_down = max(most_down, 3 - len(ready))
        return len(ready) == 3 and all(p["spec"]["containers"][0]["image"].endswith("0.2.0") and
                                       p["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "250m"
                                       for p in pods.values())

    wait_for("all bookies upgraded", upgraded, interval=0.05, timeout=90)
    assert most_down == 1
    # A bookie restarted by the upgrade may still show lostSince until the next pass sees its pod ready again; it
    # must clear without a repair ever being launched.
    wait_for("no bookie counted lost", lambda: all(not status(kube, "bookies", f"bk-{i}").get("lostSince")
                                                   for i in range(3)))
    assert kube.list("jobs", NS) == []
    wait_for("updatedBookies", lambda: status(kube, "bookieclusters", "bk").get("updatedBookies") == 3)

    # Scale down: the highest ordinal is drained (its ledgers repaired elsewhere) before anything is deleted.
    last_id = kube.get("bookies", NS, "bk-2")["spec"]["bookieId"]
    ledger_ids = [asyncio.run(write_ledger(zk_connect, 5))]
    while last_id not in MetadataStore(zk).read(ledger_ids[-1])[0].segments[0].bookies:
        ledger_ids.append(asyncio.run(write_ledger(zk_connect, 5)))  # until one needs bk-2 (placement is random)
    kube.patch("bookieclusters", NS, "bk", {"spec": {"replicas": 2}})
    read_only_during_repair = []

    def removed() -> bool:
        if kube.list("jobs", NS):
            read_only_during_repair.append(zk.exists(zkpaths.readonly(last_id)) is not None)
        return kube.get("bookies", NS, "bk-2") is None

    wait_for("bk-2 removed", removed, timeout=300)  # a Spark repair on a loaded machine takes minutes
    assert any(read_only_during_repair)  # forced read-only through ZooKeeper while its ledgers moved
    assert bookiestate.read(zk, last_id) is None
    assert kube.get("pods", NS, "bk-2") is None
    released = {c["metadata"]["name"]: c for c in kube.list("persistentvolumeclaims", NS, "bookfleet.io/bookie=bk-2")}
    assert set(released) == {"bk-2-journal", "bk-2-ledgers"}  # whenScaled: Retain (the default) keeps them
    assert zk.exists(zkpaths.cookie(last_id)) is None
    assert UnderReplication(zk).ledger_ids() == []
    [repair] = kube.list("jobs", NS)
    assert repair["metadata"]["labels"]["bookfleet.io/bookie"] == "bk-2"
    for ledger_id in ledger_ids:
        assert asyncio.run(read_ledger(zk_connect, ledger_id)) == [f"entry-{i}".encode() for i in range(5)]
    wait_for("cluster ready at 2", lambda: (s := status(kube, "bookieclusters", "bk")).get("desiredBookies") == 2
             and s.get("phase") == "Ready")

    # Scaled up again: bk-2 is a fresh, writable bookie on new volumes (the kept ones hold a retired cookie).
    kube.patch("bookieclusters", NS, "bk", {"spec": {"replicas": 3}})
    wait_for("bk-2 writable again", lambda: status(kube, "bookies", "bk-2").get("phase") == "Running", timeout=90)
    assert last_id in {info.bookie_id for info in BookieRegistry(zk).writable()}
    fresh = {c["metadata"]["name"]: c["metadata"]["uid"]
             for c in kube.list("persistentvolumeclaims", NS, "bookfleet.io/bookie=bk-2")}
    assert fresh.keys() == released.keys() and not set(fresh.values()) & {c["metadata"]["uid"]
                                                                           for c in released.values()}

    # Deleting the cluster keeps every bookie's volumes (whenDeleted: Retain, the default).
    kube.delete("bookieclusters", NS, "bk")
    wait_for("bookies and pods gone", lambda: not kube.list("bookies", NS, "bookfleet.io/cluster=bk")
             and not kube.list("pods", NS, "bookfleet.io/cluster=bk"), timeout=30)  # not kopf's 60 s daemon backoff
    assert {c["metadata"]["name"] for c in kube.list("persistentvolumeclaims", NS, "bookfleet.io/cluster=bk")} == {
        f"bk-{i}-{v}" for i in range(3) for v in ("journal", "ledgers")}


FAILED_STATUS = {
    "job": lambda stamp: {"failed": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": stamp}]},
    "sparkapplication": lambda stamp: {"applicationState": {"state": "FAILED"}, "terminationTime": stamp},
}


@pytest.mark.parametrize("launcher", ["job", "sparkapplication"])
def test_failed_repair_is_retried_with_backoff_and_ledgers_are_created(launcher, kube, operator_process, zk_connect,
                                                                       zk):
    """No pod-runner: pods never run, so the test plays the repair's outcome itself."""
    plural = f"{launcher}s"
    kube.create("bookieclusters", bookie_cluster_manifest(zk_connect, delay=0, autoRecovery={
        "lostBookieRecoveryDelaySeconds": 0, "repair": {"launcher": launcher}}))
    wait_for("bk-0's pod recorded", lambda: status(kube, "bookies", "bk-0").get("pod"))
    lost_id = kube.get("bookies", NS, "bk-0")["spec"]["bookieId"]
    ledger_id = MetadataStore(zk).create(new_metadata([lost_id, "elsewhere:3181"], 2, 2))
    kube.delete("pods", NS, "bk-0")
    for volume in ("journal", "ledgers"):
        kube.delete("persistentvolumeclaims", NS, f"bk-0-{volume}")
    first = wait_for("first attempt", lambda: kube.list(plural, NS))[0]
    assert UnderReplication(zk).marker(ledger_id).missing_bookies == {lost_id}
    failed = FAILED_STATUS[launcher](time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    kube.patch(plural, NS, first["metadata"]["name"], {"status": failed}, subresource="status")
    repaired = wait_for("RepairFailed condition",
                        lambda: (c := condition(status(kube, "bookies", "bk-0"), "Repaired")).get("reason")
                        == "RepairFailed" and c)
    assert repaired["status"] == "False"
    assert len(kube.list(plural, NS)) == 1  # backing off
    second = wait_for("second attempt", lambda: len(jobs := kube.list(plural, NS)) == 2 and jobs[1], timeout=30)
    assert second["metadata"]["annotations"]["bookfleet.io/repair-attempt"] == "1"
    assert kube.list("jobs" if launcher != "job" else "sparkapplications", NS) == []

    # A Ledger without an id gets one, and its metadata in ZooKeeper.
    kube.create("ledgers", {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger",
                            "metadata": {"name": "fresh", "namespace": NS},
                            "spec": {"cluster": "bk", "ensembleSize": 1, "writeQuorum": 1, "ackQuorum": 1}})
    created = wait_for("ledger created", lambda: condition(status(kube, "ledgers", "fresh"), "Created"))
    assert created["status"] == "False" and "NotEnoughBookies" in created["reason"]  # no bookie runs here
    zk.create(zkpaths.available("solo:3181"), BookieInfo(bookie_id="solo:3181", address="127.0.0.1:1").encode(),
              makepath=True, ephemeral=True)
    fresh = wait_for("ledger state", lambda: (s := status(kube, "ledgers", "fresh")).get("state") and s)
    assert fresh["state"] == "OPEN" and fresh["segments"] == [{"firstEntryId": 0, "bookies": ["solo:3181"]}]
    assert MetadataStore(zk).read(fresh["ledgerId"])[0].ensemble_size == 1
    assert fresh.get("repair") is None and fresh.get("underReplicated") is None

    # An adopted ledger shows its under-replication and both repair attempts.
    kube.create("ledgers", {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger",
                            "metadata": {"name": "lost", "namespace": NS},
                            "spec": {"cluster": "bk", "ensembleSize": 2, "writeQuorum": 2, "ackQuorum": 2,
                                     "ledgerId": ledger_id}})
    lost = wait_for("repair on the ledger's status", lambda: (s := status(kube, "ledgers", "lost")).get("repair") and s)
    assert lost["underReplicated"]["missingBookies"] == [lost_id]
    assert (lost["repair"]["job"], lost["repair"]["attempts"]) == (second["metadata"]["name"], 2)
    assert condition(lost, "DataLoss")["status"] == "False"
    UnderReplication(zk).mark_data_loss(ledger_id, [3, 4])
    data_loss = wait_for("DataLoss", lambda: (c := condition(status(kube, "ledgers", "lost"), "DataLoss"))
                         .get("status") == "True" and c)
    assert "[3, 4]" in data_loss["message"]
    assert {"Created", "NotEnoughBookies"} <= event_reasons(kube, "Ledger", "fresh")
    # The Event follows the status patch that showed the condition: wait for it rather than race it.
    wait_for("the lost ledger's Events", lambda: "EntriesLost" in event_reasons(kube, "Ledger", "lost")
             and {"UnderReplicated", "RepairLaunched"} <= event_reasons(kube, "BookieCluster", "bk"), timeout=30)


def test_disabled_auto_recovery_launches_no_repair_and_says_so(kube, operator_process, zk_connect, zk):
    """The cluster's switch is written into ZooKeeper, where the auditor, the repair job and the operator read it.
    While it is off a lost bookie gets no repair Job (one would only exit "disabled", look successful with ledgers
    left, and be relaunched until the operator gave up) and its Bookie says why; switched on, the repair starts."""
    kube.create("bookieclusters", bookie_cluster_manifest(zk_connect, delay=0, autoRecovery={
        "enabled": False, "lostBookieRecoveryDelaySeconds": 0}))
    wait_for("bk-0's pod recorded", lambda: status(kube, "bookies", "bk-0").get("pod"))
    under_replication = UnderReplication(zk)
    assert under_replication.is_disabled()
    lost_id = kube.get("bookies", NS, "bk-0")["spec"]["bookieId"]
    ledger_id = MetadataStore(zk).create(new_metadata([lost_id, "elsewhere:3181"], 2, 2))
    kube.delete("pods", NS, "bk-0")
    for volume in ("journal", "ledgers"):
        kube.delete("persistentvolumeclaims", NS, f"bk-0-{volume}")
    disabled = wait_for("the AutoRecoveryDisabled condition",
                        lambda: (c := condition(status(kube, "bookies", "bk-0"), "Repaired")).get("reason")
                        == "AutoRecoveryDisabled" and c)
    assert disabled["status"] == "False" and "disabled" in disabled["message"]
    assert kube.list("jobs", NS) == [] and under_replication.marker(ledger_id) is None

    kube.patch("bookieclusters", NS, "bk", {"spec": {"autoRecovery": {"enabled": True}}})
    wait_for("the repair Job once auto-recovery is enabled", lambda: kube.list("jobs", NS))
    assert not under_replication.is_disabled()
    assert under_replication.marker(ledger_id).missing_bookies == {lost_id}


def test_ledger_spec_is_checked_against_its_cluster_and_its_zones_are_honoured(kube, operator_process, zk_connect,
                                                                                zk):
    kube.create("bookieclusters", bookie_cluster_manifest(zk_connect, zones=["zone-a", "zone-b", "zone-c"]))
    wait_for("bk-0", lambda: kube.get("bookies", NS, "bk-0"))
    for bookie_id, zone in (("in-a:3181", "zone-a"), ("in-b:3181", "zone-b")):
        registration = BookieInfo(bookie_id=bookie_id, address="127.0.0.1:1", zone=zone)
        zk.create(zkpaths.available(bookie_id), registration.encode(), makepath=True, ephemeral=True)

    def ledger(name: str, **spec: Any) -> None:
        kube.create("ledgers", {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger",
                                "metadata": {"name": name, "namespace": NS},
                                "spec": {"cluster": "bk", "ensembleSize": 1, "writeQuorum": 1, "ackQuorum": 1,
                                         **spec}})

    ledger("elsewhere", zones=["zone-x"])
    ledger("too-wide", ensembleSize=2, writeQuorum=2, zones=["zone-a"])
    ledger("in-b", zones=["zone-b"])
    invalid = wait_for("Valid=False", lambda: (c := condition(status(kube, "ledgers", "elsewhere"), "Valid"))
                       .get("status") == "False" and c)
    assert invalid["reason"] == "InvalidSpec"
    assert "zones zone-x are not zones of BookieCluster 'bk'" in invalid["message"]
    too_wide = wait_for("Valid=False", lambda: (c := condition(status(kube, "ledgers", "too-wide"), "Valid"))
                        .get("status") == "False" and c)
    assert "ensembleSize 2 is larger than the 1 bookies in zones zone-a" in too_wide["message"]
    placed = wait_for("the in-b ledger created", lambda: (s := status(kube, "ledgers", "in-b")).get("state") and s)
    assert placed["segments"] == [{"firstEntryId": 0, "bookies": ["in-b:3181"], "writeSetsSharingAZone": 0}]
    assert condition(placed, "Valid")["status"] == "True"
    assert status(kube, "ledgers", "elsewhere").get("ledgerId") is None


def test_operator_metrics_count_passes_decisions_and_the_fleets_health_under_its_cluster(kube, operator_process,
                                                                                        zk_connect, zk):
    """The fleet's health comes from ZooKeeper: a ledger a client made directly (no Ledger resource) counts too."""
    kube.create("bookieclusters", bookie_cluster_manifest(zk_connect))
    ledger_id = MetadataStore(zk).create(new_metadata(["b1:3181", "b2:3181"], 2, 2))
    direct = MetadataStore(zk).create(new_metadata(["b1:3181", "b2:3181"], 2, 2))
    for marked in (ledger_id, direct):
        UnderReplication(zk).mark(marked, ["b2:3181"])
    UnderReplication(zk).mark_data_loss(ledger_id, [1])
    for name, spec in (("damaged", {"cluster": "bk", "ledgerId": ledger_id}), ("orphan", {"cluster": "gone"})):
        kube.create("ledgers", {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger",
                                "metadata": {"name": name, "namespace": NS},
                                "spec": {"ensembleSize": 2, "writeQuorum": 2, "ackQuorum": 2, **spec}})
    metric = operator_process.metric
    fleet = {"namespace": NS, "bookiecluster": "bk"}
    wait_for("the fleet's health in the metrics", lambda: metric("bookfleet_operator_ledgers_under_replicated",
                                                                 **fleet) == 2
             and metric("bookfleet_operator_ledgers_data_loss", **fleet) == 1, timeout=30)
    assert metric("bookfleet_operator_oldest_under_replicated_seconds", **fleet) >= 0
    wait_for("the damaged Ledger's loss counted", lambda: metric(
        "bookfleet_operator_events_total", kind="Ledger", reason="EntriesLost", type="Warning", **fleet) >= 1)
    wait_for("the under-replication counted on the cluster", lambda: metric(
        "bookfleet_operator_events_total", kind="BookieCluster", reason="UnderReplicated", type="Warning",
        **fleet) >= 1)
    assert metric("bookfleet_operator_events_total", kind="Ledger", reason="InvalidSpec", namespace=NS,
                  bookiecluster="gone") >= 1
    assert metric("bookfleet_operator_reconciles_total", resource="ledgers", **fleet) >= 1
    assert metric("bookfleet_operator_reconciles_total", resource="bookieclusters", **fleet) >= 1
    assert metric("bookfleet_operator_reconcile_seconds_count", resource="ledgers", **fleet) >= 1
    UnderReplication(zk).clear(UnderReplication(zk).marker(direct))
    wait_for("a repaired ledger leaves the count", lambda: metric("bookfleet_operator_ledgers_under_replicated",
                                                                  **fleet) == 1, timeout=30)


def test_operator_issues_certificates_and_its_bookies_serve_mutual_tls(
    kube, podrunner, operator_process, zk_connect, zk, tmp_path, monkeypatch
):
    cluster = bookie_cluster_manifest(zk_connect, replicas=2)
    cluster["spec"]["security"] = {"tls": "Operator"}
    kube.create("bookieclusters", cluster)
    wait_for("2 bookies running", lambda: all(status(kube, "bookies", f"bk-{i}").get("phase") == "Running"
                                              for i in range(2)), timeout=120)
    assert all(info.tls for info in BookieRegistry(zk).all())
    for pod in (kube.get("pods", NS, f"bk-{i}") for i in range(2)):
        assert "--tls-dir" in pod["spec"]["containers"][0]["command"]
    stored = {key: base64.b64decode(value) for key, value in kube.get("secrets", NS, "bk-tls-ca")["data"].items()}
    ca = CertificateAuthority.from_pem(stored["ca.crt"], stored["ca.key"])
    monkeypatch.setenv(TLS_DIR_ENV, str(write_tls_dir(tmp_path / "app", ca.issue("app", [Role.CLIENT]))))
    ledger_id = asyncio.run(write_ledger(zk_connect, 5))
    assert asyncio.run(read_ledger(zk_connect, ledger_id)) == [f"entry-{i}".encode() for i in range(5)]


@pytest.fixture
def no_resync(monkeypatch):
    """Settled Bookies are passed only when something they depend on changes (no resync within a test)."""
    monkeypatch.setenv("BOOKFLEET_BOOKIE_RESYNC", "3600")


def test_a_settled_bookie_shows_a_registration_change_at_once(no_resync, kube, podrunner, operator_process,
                                                               zk_connect, zk):
    """A bookie frozen past its ZooKeeper session loses its registration while its pod still looks Ready (nothing
    changes in Kubernetes): the registrations' watch wakes its Bookie, with no resync to wait for; back, it
    registers again and shows Running."""
    kube.create("bookieclusters", bookie_cluster_manifest(zk_connect))
    wait_for("3 bookies running", lambda: all(status(kube, "bookies", f"bk-{i}").get("phase") == "Running"
                                              for i in range(3)))
    bookie_id = status(kube, "bookies", "bk-1")["bookieId"]
    process = podrunner.pods[(NS, "bk-1")].process
    os.kill(process.pid, signal.SIGSTOP)
    try:
        wait_for("bk-1's registration gone", lambda: zk.exists(zkpaths.available(bookie_id)) is None, timeout=30)
        wait_for("bk-1 unregistered", lambda: not status(kube, "bookies", "bk-1").get("registered"), timeout=10)
    finally:
        os.kill(process.pid, signal.SIGCONT)
    wait_for("bk-1 Running again", lambda: status(kube, "bookies", "bk-1").get("phase") == "Running", timeout=30)


def test_a_cluster_deleted_with_its_operator_gone_goes_at_once(kube, operator_process, zk_connect):
    """`kubectl delete namespace` and an Argo CD prune delete the operator with its BookieClusters and Bookies: none
    may carry a finalizer that only the operator would release (kopf's kept them Terminating for ever)."""
    kube.create("bookieclusters", bookie_cluster_manifest(zk_connect, replicas=1))
    wait_for("the cluster's and its Bookie's loops passed", lambda: status(kube, "bookieclusters", "bk")
             and status(kube, "bookies", "bk-0"))
    operator_process.kill()
    kube.delete("bookieclusters", NS, "bk")
    assert kube.get("bookieclusters", NS, "bk") is None
    assert kube.list("bookies", NS) == [] and kube.list("pods", NS) == []
