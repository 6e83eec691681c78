"""The `cluster` tier on the installed fleet, before test_tier.py (whose last test uninstalls it): a client team's
certificate as the operator issues it, bookies' zones from their nodes, and the disk autoscaler on a small cluster of
its own."""

from __future__ import annotations

import base64
import json
import re
import secrets

import pytest
from cryptography import x509

from bookfleet.kube import resources
from bookfleet.meta import zk
from bookfleet.meta.metadata import MetadataStore
from bookfleet.meta.registry import BookieRegistry
from bookfleet.polling import wait_for
from bookfleet.security.roles import Role
from tests.cluster import walkthrough
from tests.cluster.test_tier import delete_bookie_cluster, one_bookie_cluster, zookeeper_with_chroot
from tests.cluster.walkthrough import CLUSTER, NAMESPACE, ZONE_LABEL, LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]


def zookeeper_hosts(cluster: LocalCluster) -> str:
    """The chart's ZooKeeper server by its pod IP (the host reaches pod IPs)."""
    [server] = cluster.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=zookeeper")["items"]
    return f"{server['status']['podIP']}:2181"


def demo_credential(cluster: LocalCluster) -> str:
    return base64.b64decode(cluster.get("secret", "-n", NAMESPACE, "bookfleet-zk-auth")["data"]["auth"]).decode()


def test_helm_test_writes_and_reads_a_ledger_through_every_bookie_of_the_chart_cluster(chart_installed: LocalCluster):
    """`helm test` as a user runs it on the install (first: nothing has changed the fleet yet): its pod (restricted
    Pod Security, the operator's image where the operator runs, the chart's client certificate and ZooKeeper
    credential) writes one entry through an ensemble of all three bookies over mutual TLS, reads it back and deletes
    the ledger; helm prints its log."""
    cluster = chart_installed
    report = cluster.helm_test(walkthrough.RELEASE, NAMESPACE)
    assert re.search(r"^Phase: +Succeeded$", report, re.M), report
    checked = re.search(r"^  from entry 0: (.+)\n(?:.*\n)*?ledger (\d+): written to 3 bookies, read back\n"
                        r"deleted ledger \2$", report, re.M)
    assert checked, report
    assert sorted(checked[1].split(", ")) == sorted(b["spec"]["bookieId"] for b in walkthrough.example_bookies(cluster))
    assert [ledger["metadata"]["name"] for ledger in cluster.get("ledgers", "-n", NAMESPACE)["items"]] == \
        [walkthrough.LEDGER]  # the test's ledger is not a Ledger object, and it left none behind in ZooKeeper:
    with zk.session(zookeeper_hosts(cluster), auth=demo_credential(cluster)) as session:
        assert MetadataStore(session).ledger_ids() == [walkthrough.ledger_status(cluster)["ledgerId"]]


def test_bookies_of_a_cluster_without_zones_take_their_nodes_zones_and_register_them(chart_installed: LocalCluster):
    """The example names no zones: the three bookies spread over the three zones' nodes, each Bookie takes its node's
    topology.kubernetes.io/zone (Event ZoneFromNode), its pod runs with --zone and is held in the zone, and each
    registration carries the zone placement spreads write sets over."""
    cluster = chart_installed
    assert not walkthrough.bookie_cluster(cluster).spec.zones
    by_id = walkthrough.zones_served(cluster)  # the install waited for it
    assert by_id is not None and sorted(by_id.values()) == ["zone-a", "zone-b", "zone-c"]
    for pod in walkthrough.bookie_pods(cluster):
        name = pod["metadata"]["name"]
        assert "ZoneFromNode" in walkthrough.event_reasons(cluster, name)
        zone = cluster.get("bookie", "-n", NAMESPACE, name)["spec"]["zone"]
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert {"key": ZONE_LABEL, "operator": "In", "values": [zone]} in [
            expression for term in terms["nodeSelectorTerms"] for expression in term["matchExpressions"]]
    # Each first pod, deleted as its bookie started (to restart it with the zone), went on its SIGTERM: the bookie
    # is not its pod's PID 1, which ignores a signal it has no handler for yet and was killed a minute later.
    assert cluster.stops_escalated() == []
    with zk.session(zookeeper_hosts(cluster), auth=demo_credential(cluster)) as session:
        registered = {info.bookie_id: info.zone for info in BookieRegistry(session).all()}
    assert registered == by_id


def test_a_client_pod_with_only_the_certificate_its_team_asked_for_writes_and_reads_over_mutual_tls(
        chart_installed: LocalCluster):
    """The team's name in spec.security.clientCertificates: the operator issues a client-role certificate of the
    cluster's CA into the team's Secret (no CA key in it); a pod mounting only that Secret creates, writes, closes
    and reads a ledger on bookies that serve mutual TLS only."""
    cluster = chart_installed
    files = walkthrough.issue_client_certificate(cluster)
    assert set(files) == {resources.CA_KEY, resources.CERT_KEY, resources.KEY_KEY}
    ca = base64.b64decode(cluster.get("secret", "-n", NAMESPACE, resources.ca_secret_name(CLUSTER))["data"][
        resources.CA_KEY])
    assert files[resources.CA_KEY] == ca
    certificate = x509.load_pem_x509_certificate(files[resources.CERT_KEY])
    units = certificate.subject.get_attributes_for_oid(x509.NameOID.ORGANIZATIONAL_UNIT_NAME)
    assert [unit.value for unit in units] == [Role.CLIENT]
    assert certificate.issuer == x509.load_pem_x509_certificate(ca).subject
    assert all("--tls-dir" in pod["spec"]["containers"][0]["command"] for pod in walkthrough.bookie_pods(cluster))

    zookeeper = walkthrough.bookie_cluster(cluster).spec.zookeeper
    flags = f"--zk {zookeeper}"
    log = walkthrough.run_client(cluster, "team-client", (
        f"set -e; id=$(bookfleet ledger create -e 3 -w 3 -a 2 {flags}); "
        f"bookfleet ledger write $id {flags} --count 20 --size 32; bookfleet ledger close $id {flags}; "
        f"bookfleet ledger read $id {flags} --json"))
    pod = cluster.get("pod", "-n", NAMESPACE, "team-client")
    secrets_mounted = [v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v]
    assert secrets_mounted == [walkthrough.client_secret(CLUSTER)]  # its team's certificate, nothing else
    entries = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert [e["entry_id"] for e in entries] == list(range(20))
    assert [e["payload"] for e in entries] == [f"{i:032d}" for i in range(20)]


GROW = "grow"
"""The autoscaled cluster: one bookie on a 32 MiB ledger quota, two at most."""
QUOTA = "32Mi"
FILL = ("for i in 1 2 3 4 5 6 7 8; do bookfleet ledger write $fill {flags} --count 256 --size 16384 "
        "|| {{ echo refused; break; }}; done")
"""Up to 32 MiB in 4 MiB writes into one ledger: its one bookie turns read-only past half its quota and, with no other
bookie to move the ledger to, refuses the rest."""


def grow_cluster(cluster: LocalCluster, hosts: str, auth: str) -> list[dict]:
    """One bookie in zone-a (named: a bookie taking its node's zone restarts once as it starts, which cost the added
    bookie a minute; the example's bookies show zones from nodes), autoscaled 1..1 until the test raises maxReplicas
    to 2: one more at 40 % of its quota, read-only past 50 % until under 30 % (the journal its fill leaves behind
    reclaimed, it stays full), one fewer when both are under 20 %; small journal and entry-log files and a short GC,
    so deleted data leaves the disk within seconds; drains repaired on the system node where the cluster has real
    nodes."""
    demo = walkthrough.bookie_cluster(cluster).spec
    repair = {"serviceAccountName": "bookfleet-repair", **walkthrough.repair_placement(cluster)}
    return one_bookie_cluster(GROW, auth, {
        "image": demo.image, "zookeeper": f"{hosts}/{GROW}",
        "storage": {"journal": {"size": "1Gi"}, "ledgers": {"size": QUOTA}},
        "bookie": {"diskUsageThreshold": 0.5, "diskUsageLwm": 0.3, "gcIntervalSeconds": 2,
                   "config": {"gc-grace": "2", "journal-roll-bytes": str(2**20), "entrylog-roll-bytes": str(2**20),
                              "memtable-bytes": str(2**20), "disk-check-interval": "1"}},
        "autoscaling": {"minReplicas": 1, "maxReplicas": 1, "scaleUpDiskUsage": 0.4, "scaleDownDiskUsage": 0.2,
                        "cooldownSeconds": 0},
        "autoRecovery": {"enabled": True, "repair": repair},
    })


def phases(cluster: LocalCluster, name: str) -> dict[str, str | None]:
    """The Bookies of cluster `name`: Bookie name -> phase."""
    return {b["metadata"]["name"]: (b.get("status") or {}).get("phase")
            for b in cluster.get("bookies", "-n", NAMESPACE)["items"] if b["metadata"]["name"].startswith(f"{name}-")}


def serving_bookies(cluster: LocalCluster, name: str) -> dict[str, str]:
    """The Bookies of cluster `name` that serve, writable (Running) or full (ReadOnly): Bookie name -> bookie id."""
    return {b["metadata"]["name"]: b["spec"]["bookieId"] for b in cluster.get("bookies", "-n", NAMESPACE)["items"]
            if b["metadata"]["name"].startswith(f"{name}-")
            and (b.get("status") or {}).get("phase") in ("Running", "ReadOnly")}


def test_the_disk_autoscaler_adds_a_bookie_new_ledgers_use_then_drains_it_away_losing_nothing(
        chart_installed: LocalCluster):
    """A one-bookie cluster filled past its scale-up usage and its read-only threshold while maxReplicas holds it at
    one (else the fill's ledger would move on to the added bookie and fill it too: each bookie's usage is its own);
    maxReplicas raised, it gets a second bookie, writable and near empty; new ledgers, one copy each, can only land on
    it. The fill deleted, both are under the scale-down usage: the second bookie is drained (its ledgers, their only
    copies, repaired onto the first) and removed, and every entry of the new ledgers reads back."""
    cluster = chart_installed
    hosts = zookeeper_with_chroot(cluster, GROW)
    auth = f"{GROW}:{secrets.token_hex(16)}"
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": grow_cluster(cluster, hosts, auth)}))
    try:
        wait_for(lambda: list(serving_bookies(cluster, GROW)) == [f"{GROW}-0"], timeout=300,
                 what=f"Bookie {GROW}-0 Running", interval=1.0)
        walkthrough.issue_client_certificate(cluster, GROW)
        flags = f"--zk {hosts}/{GROW}"
        log = walkthrough.run_client(cluster, f"{GROW}-fill", f"fill=$(bookfleet ledger create -e 1 -w 1 -a 1 "
                                     f"{flags}) && echo fill=$fill && " + FILL.format(flags=flags), on=GROW)
        fill = int(next(line for line in log.splitlines() if line.startswith("fill="))[5:])
        assert "refused" in log.splitlines(), log  # full: read-only, and nowhere to move the ledger to
        wait_for(lambda: phases(cluster, GROW) == {f"{GROW}-0": "ReadOnly"}, timeout=120,
                 what=f"{GROW}-0 ReadOnly", interval=1.0)
        assert "ScaledUp" not in walkthrough.event_reasons(cluster, GROW)  # at maxReplicas

        cluster.kubectl("patch", "bookiecluster", "-n", NAMESPACE, GROW, "--type", "merge", "-p",
                        json.dumps({"spec": {"autoscaling": {"maxReplicas": 2}}}))
        wait_for(lambda: phases(cluster, GROW) == {f"{GROW}-0": "ReadOnly", f"{GROW}-1": "Running"}, timeout=300,
                 what=f"a second bookie of {GROW} added and writable", interval=1.0)
        assert "ScaledUp" in walkthrough.event_reasons(cluster, GROW)
        usage = {b["metadata"]["name"]: b["status"]["diskUsage"] for b in cluster.get("bookies", "-n", NAMESPACE)[
            "items"] if b["metadata"]["name"].startswith(f"{GROW}-")}
        assert usage[f"{GROW}-0"] >= 0.4 and usage[f"{GROW}-1"] < 0.2, usage  # each bookie's usage its own
        first, added = (serving_bookies(cluster, GROW)[f"{GROW}-{i}"] for i in (0, 1))
        with zk.session(f"{hosts}/{GROW}", auth=auth) as session:
            assert [info.bookie_id for info in BookieRegistry(session).read_only()] == [first]  # full

        log = walkthrough.run_client(cluster, f"{GROW}-new", "set -e; for n in 1 2; do "
                                     f"id=$(bookfleet ledger create -e 1 -w 1 -a 1 {flags}); echo new=$id; "
                                     f"bookfleet ledger write $id {flags} --count 20 --size 32; "
                                     f"bookfleet ledger close $id {flags}; done; "
                                     f"bookfleet ledger delete {fill} {flags}", on=GROW)
        new = [int(line[4:]) for line in log.splitlines() if line.startswith("new=")]
        assert len(new) == 2
        with zk.session(f"{hosts}/{GROW}", auth=auth) as session:
            store = MetadataStore(session)
            assert [store.read(ledger)[0].bookies() for ledger in new] == [{added}, {added}]  # the only writable

        wait_for(lambda: list(serving_bookies(cluster, GROW)) == [f"{GROW}-0"] and not [
            b for b in cluster.get("bookies", "-n", NAMESPACE)["items"] if b["metadata"]["name"] == f"{GROW}-1"],
            timeout=600, what=f"{GROW}-1 drained and removed once the fill was collected", interval=1.0)
        reasons = set(walkthrough.event_reasons(cluster, GROW)) | set(walkthrough.event_reasons(cluster, f"{GROW}-1"))
        assert {"ScaledDown", "Decommissioning", "Decommissioned"} <= reasons, reasons
        with zk.session(f"{hosts}/{GROW}", auth=auth) as session:
            store = MetadataStore(session)
            assert [store.read(ledger)[0].bookies() for ledger in new] == [{first}, {first}]  # moved before it went
        log = walkthrough.run_client(cluster, f"{GROW}-read", "set -e; " + " ".join(
            f"bookfleet ledger read {ledger} {flags} --json;" for ledger in new), on=GROW)
        entries = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        assert [e["payload"] for e in entries] == [f"{i:032d}" for i in range(20)] * 2
    finally:
        delete_bookie_cluster(cluster, GROW)
