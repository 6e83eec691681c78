"""A whole zone lost, and back, on the local cluster: six bookies, two per zone, E3/Qw3/Qa2 zone-aware
ledgers written before and through the outage, one zone cut off (kubelets silent, pods' links down, bookies running
on unreachable) for longer than the lost-bookie delay, then returned: its bookies, whose pods and volumes the
operator kept (their nodes were NotReady, never deleted), rejoin with their data and cookies.

It needs its own local cluster: the tier's shared one loses a node and a spare to earlier tests, and this one needs
three zones of two live nodes each.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from bookfleet.client.connection import BookieError
from bookfleet.kube import resources
from bookfleet.polling import wait_for
from tests.cluster.stalecopies import FleetAccess, fleet_access
from tests.cluster.walkthrough import (
    CLUSTER,
    NAMESPACE,
    ZONE_LABEL,
    LocalCluster,
    acting_operator,
    apply_settings,
    bookie_claims,
    bookie_cluster,
    bookie_pods,
    client_log,
    event_reasons,
    example_bookies,
    issue_client_certificate,
    ledger_status,
    ready,
    repair_jobs,
    run_client,
    say,
    scale,
    server_seconds,
    start_client,
    zones_served,
)


@dataclass(frozen=True)
class Form:
    """How big a zone scenario is."""

    bookies: int
    """Bookies while it runs: the zone cut must leave at least three (E) to repair onto."""
    delay: int
    """lostBookieRecoveryDelaySeconds: the cut lasts longer (it lasts until every affected ledger is back at Qw)."""
    entries: int
    """Entries written to each spread and kept ledger before the cut."""
    spares: bool
    """Whether the cluster's cordoned spare nodes are uncordoned first (to run two bookies per zone)."""
    collection: bool
    """Whether the return waits until the returning bookies collected their stale copies (a ledger this young is kept
    for the bookies' grace, 60 s, so in the short form that is one more collection interval)."""
    round_pause: float
    """Seconds between the writer's rounds: each round is four CLI processes, a core's worth of Python start-up while
    it runs, which the short form shares with the rest of `make test`."""


LONG_FORM = Form(bookies=6, delay=20, entries=200, spares=True, collection=True, round_pause=0)
"""On a cluster of its own (`make chaos`, `make cluster-zone-loss`): two bookies per zone, so a zone's loss leaves
two zones of two, the repairs a choice of bookies."""
SHORT_FORM = Form(bookies=4, delay=5, entries=50, spares=False, collection=False, round_pause=5)
"""The cluster tier's (`make test`), on its shared cluster as its node failure left it: four bookies, two in one
zone; one of the other zones is cut."""
SPREAD = 5
"""Ledgers over all three zones (a replica in the cut one each). Random placement puts all three replicas in three
zones for 40 % of ledgers: five all spread by chance is 1 %."""
SIZE = 1024
ROUND_ENTRIES = 50
"""Entries a writer round adds to its fresh ledger."""
WRITER, READER = "zone-loss-writer", "zone-loss-reader"
SETTLED = {"affected_ledgers_at_qw", "writer_round_after_repairs", "volumes_kept"}
"""What the cut waits for before the zone returns."""


def ledger_manifest(name: str, zones: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"cluster": CLUSTER, "ensembleSize": 3, "writeQuorum": 3, "ackQuorum": 2}
    if zones:
        spec["zones"] = zones
    return {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": spec}


def zone_to_cut(cluster: LocalCluster) -> str:
    """A zone not running the chart's (single) ZooKeeper server whose loss leaves three bookies (E) to repair onto,
    preferring one without the acting operator replica (its successor would wait out kopf's peering lifetime)."""
    zones = {node["metadata"]["name"]: node["metadata"]["labels"][ZONE_LABEL] for node in cluster.get("nodes")["items"]}
    acting = acting_operator(cluster)
    pods = cluster.get("pods", "-n", NAMESPACE)["items"]

    def zones_of(component: str) -> list[str]:
        return [zones.get(pod["spec"].get("nodeName", ""), "") for pod in pods
                if pod["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]

    bookies = [b["spec"]["zone"] for b in example_bookies(cluster)]
    operator_zone = next((zones.get(pod["spec"].get("nodeName", "")) for pod in pods
                          if pod["metadata"]["name"] == acting), None)
    choices = [(zone == operator_zone, zone) for zone in set(zones.values()) - set(zones_of("zookeeper"))
               if len(bookies) - bookies.count(zone) >= 3]
    if not choices:
        raise AssertionError(f"no zone to cut: bookies by zone {sorted(bookies)}, ZooKeeper in {zones_of('zookeeper')}")
    return min(choices)[1]


def ids_of(cluster: LocalCluster, names: list[str]) -> dict[str, int]:
    """Each Ledger's id once the operator created it; else AssertionError with why not (its conditions)."""
    ids = {}
    for name in names:
        try:
            ids[name] = wait_for(lambda n=name: (status := ledger_status(cluster, n)).get("ledgerId") is not None
                                 and status, timeout=300, what=f"Ledger {name} created", interval=1.0)["ledgerId"]
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {ledger_status(cluster, name).get('conditions')}") from exc
    return ids


def sharing(cluster: LocalCluster, name: str) -> list[int]:
    """writeSetsSharingAZone of each segment of a Ledger's status."""
    return [segment.get("writeSetsSharingAZone", -1) for segment in ledger_status(cluster, name).get("segments", [])]


def writer_script(zk: str, stop_id: int, pause: float) -> str:
    """Rounds of create (zone-aware E3/Qw3/Qa2) -> write -> close until the stop ledger is closed, `pause` seconds
    apart; any failure ends the pod Failed (a writer that gave up)."""
    return (f"set -e; while ! bookfleet ledger info {stop_id} --zk {zk} --json | grep -q '\"state\": \"CLOSED\"'; do "
            f"sleep {pause}; "
            f"id=$(bookfleet ledger create --zk {zk} -e 3 -w 3 -a 2 --placement zone-aware); "
            f"echo \"round $(date +%s) $id\"; "
            f"bookfleet ledger write $id --zk {zk} --count {ROUND_ENTRIES} --size {SIZE} --json; "
            f"bookfleet ledger close $id --zk {zk} > /dev/null; echo \"closed $(date +%s) $id\"; done")


def writer_rounds(cluster: LocalCluster) -> list[tuple[float, int]]:
    """(wall-clock close time, ledger id) of the writer's finished rounds, from its log so far."""
    pods = cluster.get("pods", "-n", NAMESPACE, "--field-selector", f"metadata.name={WRITER}")["items"]
    if not pods or not pods[0].get("status", {}).get("containerStatuses"):
        return []
    log = cluster.container_log(NAMESPACE, WRITER, "client")
    return [(float(parts[1]), int(parts[2])) for line in log.splitlines()
            if (parts := line.split())[:1] == ["closed"] and len(parts) == 3]


CLI_CALLS = """
import shlex, sys
from bookfleet.cli import main
for call in sys.argv[1:]:
    print(CALLED + call, flush=True)
    if main(shlex.split(call)):
        sys.exit(f"bookfleet {call} failed")
"""
"""`python -c` with `bookfleet` command lines as arguments: each run in turn by the CLI's own main, in one process
(a CLI process's start and imports cost about a second of CPU on the loaded machine, and these pods run tens of
them); each call's output follows a line CALLED + the call, and the first that fails ends the pod Failed."""
CALLED = "called: "


def cli_calls(calls: list[str]) -> str:
    """The shell script of a client pod running these `bookfleet` command lines (CLI_CALLS)."""
    program = f"CALLED = {CALLED!r}" + CLI_CALLS
    return shlex.join(["python", "-c", program, *calls])


def read_all(cluster: LocalCluster, ledger_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Every entry of the ledgers, read by one client pod: ledger id -> entries."""
    zk = bookie_cluster(cluster).spec.zookeeper
    start_client(cluster, READER, cli_calls([f"ledger read {i} --zk {zk} --json" for i in ledger_ids]))
    read: dict[int, list[dict[str, Any]]] = {}
    current = None
    for line in client_log(cluster, READER, timeout=900).splitlines():
        if line.startswith(CALLED):
            current = read.setdefault(int(line.removeprefix(CALLED).split()[2]), [])
        elif line.startswith("{") and current is not None:
            current.append(json.loads(line))
    return read


@dataclass
class ZoneLoss:
    """What the zone outage and return did; seconds are counted from the cut."""

    form: Form
    zone: str
    spread: dict[str, int]
    """Ledger name -> id: a replica in every zone (so one in the cut zone)."""
    kept: dict[str, int]
    """Ledger name -> id: placed in the two other zones only (spec.zones)."""
    sharing_before: dict[str, list[int]]
    sharing_after: dict[str, list[int]] = field(default_factory=dict)
    marked: set[str] = field(default_factory=set)
    """Ledgers seen under-replicated after the cut."""
    seconds: dict[str, float] = field(default_factory=dict)
    replacements: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The cut zone's Bookies while it was gone: phase, Lost condition, the pod's phase and scheduling message."""
    claims_before: dict[str, str] = field(default_factory=dict)
    """The cut zone's bookies' PVCs (name -> uid) before the cut."""
    claims_after: dict[str, str] = field(default_factory=dict)
    """The same PVCs after the return (the same uids: the bookies rejoined on their volumes)."""
    returned: dict[str, list[str]] = field(default_factory=dict)
    """The cut zone's Bookies -> their Event reasons after the return."""
    writer_rounds: list[tuple[float, int]] = field(default_factory=list)
    writer_acked: dict[int, int] = field(default_factory=dict)
    """Writer ledger id -> entries acknowledged."""
    cut_at: float = 0.0
    repairs_after_return: list[str] = field(default_factory=list)
    repairs: list[dict[str, Any]] = field(default_factory=list)
    """The repair Jobs created after the cut (`repair_timeline`)."""
    read_back: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    gc_interval: int = 0
    """The bookies' --gc-interval (BookieCluster spec.bookie.gcIntervalSeconds)."""
    stale: dict[str, set[int]] = field(default_factory=dict)
    """Cut bookie id -> ledgers whose metadata named it before the cut and, closed, names it no more after the return
    (repaired away): its copies of them are stale."""
    stale_at_return: dict[str, set[int]] = field(default_factory=dict)
    """Of those, the copies each bookie still held when first reached after the return."""
    stale_left: dict[str, set[int]] = field(default_factory=dict)
    """Of those, the copies each bookie held when last asked (empty once reclaimed)."""
    seconds_after_return: dict[str, float] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    """The cut zone's bookie pods -> restarts of their bookie container, seen after the return."""

    def acknowledged(self) -> dict[int, int]:
        """Ledger id -> entries acknowledged to its writer."""
        return {**{i: self.form.entries for i in (*self.spread.values(), *self.kept.values())}, **self.writer_acked}

    def entries_not_as_written(self) -> int:
        return entries_not_as_written(self.read_back, self.acknowledged())

    def figures(self) -> dict[str, Any]:
        acked = sum(self.acknowledged().values())
        read = sum(map(len, self.read_back.values()))
        return {"lost_bookie_recovery_delay_seconds": self.form.delay, "zone": self.zone,
                "bookies": self.form.bookies, "affected_ledgers": len(self.spread),
                "affected_bytes": len(self.spread) * self.form.entries * SIZE,
                "seconds_after_cut": {name: round(value, 1) for name, value in self.seconds.items()},
                "write_sets_sharing_a_zone_after_repairs": self.sharing_after,
                "repair_jobs": self.repairs,
                "writer_rounds": len(self.writer_rounds),
                "writer_rounds_during_cut": sum(self.cut_at < at < self.cut_at + self.seconds["zone_returned"]
                                                for at, _ in self.writer_rounds),
                "acknowledged_entries": acked, "entries_read_back": read, "entries_lost": acked - read,
                "entries_not_as_written": self.entries_not_as_written(),
                "repairs_started_by_return": len(self.repairs_after_return),
                "gc_interval_seconds": self.gc_interval,
                "seconds_after_return": {name: round(value, 1) for name, value in self.seconds_after_return.items()},
                "stale_copies": sum(map(len, self.stale.values())),
                "stale_copies_held_at_return": sum(map(len, self.stale_at_return.values())),
                "stale_copies_left": sum(map(len, self.stale_left.values())),
                "returning_bookie_restarts": self.restarts,
                "volumes_kept_through_return": self.claims_after == self.claims_before,
                "bookies_rejoined": sorted(bookie for bookie, reasons in self.returned.items()
                                           if "BookieReturned" in reasons and "BookieReplaced" not in reasons),
                "bookies_while_cut": self.replacements}


def zone_claims(cluster: LocalCluster, bookies: dict[str, str]) -> dict[str, str]:
    """The PVCs (name -> uid) of the named Bookies."""
    return {claim["metadata"]["name"]: claim["metadata"]["uid"] for claim in bookie_claims(cluster)
            if claim["metadata"]["name"].rsplit("-", 1)[0] in bookies}


@dataclass(frozen=True)
class ZoneSetUp:
    """What the zone scenarios (this cut, and the partition of zonepartition.py) start from."""

    form: Form
    zone: str
    """The zone to cut off."""
    others: list[str]
    bookies: dict[str, str]
    """The zone's Bookies: name -> bookie id."""
    spread: dict[str, int]
    kept: dict[str, int]
    sharing_before: dict[str, list[int]]
    """writeSetsSharingAZone of the spread ledgers (all 0: checked here)."""
    zk: str


def set_up(cluster: LocalCluster, form: Form) -> ZoneSetUp:
    """The form's bookies, the client certificate and the lost-bookie delay; the zone to cut; SPREAD ledgers over
    all three zones and one kept off it, the form's entries written to each and closed. The premise (every spread
    write set spans three zones: zone-aware placement) is checked here, before the long part."""
    say(f"{form.bookies} bookies; client certificate; lost-bookie delay {form.delay} s")
    if form.spares:
        for spare in ("node-a2", "node-b2", "node-c2"):
            cluster.kubectl("uncordon", spare)
    scale(cluster, form.bookies)
    # Whatever earlier tests left, the layout the cut relies on: each bookie registered with its node's zone.
    wait_for(lambda: zones_served(cluster), timeout=300, what="every bookie serving with its node's zone",
             interval=1.0)
    issue_client_certificate(cluster)
    apply_settings(cluster, {"autoRecovery": {"lostBookieRecoveryDelaySeconds": form.delay}})
    zone = zone_to_cut(cluster)
    others = sorted({b["spec"]["zone"] for b in example_bookies(cluster)} - {zone})
    spread_names, kept_names = [f"spread-{i}" for i in range(SPREAD)], ["kept-0"]
    for name in spread_names:
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(ledger_manifest(name)))
    for name in kept_names:
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(ledger_manifest(name, others)))
    spread, kept = ids_of(cluster, spread_names), ids_of(cluster, kept_names)
    zk = bookie_cluster(cluster).spec.zookeeper
    say(f"writing {form.entries} entries of {SIZE} B to each of {len(spread) + len(kept)} ledgers, closing them")
    start_client(cluster, "zone-loss-fill", cli_calls([
        call for i in (*spread.values(), *kept.values()) for call in (
            f"ledger write {i} --zk {zk} --count {form.entries} --size {SIZE}", f"ledger close {i} --zk {zk}")]))
    client_log(cluster, "zone-loss-fill", timeout=900)
    wait_for(lambda: all(ledger_status(cluster, n).get("state") == "CLOSED" and -1 not in sharing(cluster, n)
                         for n in (*spread, *kept)), timeout=300, what="Ledgers closed, zones in status", interval=1.0)
    sharing_before = {name: sharing(cluster, name) for name in spread}
    if any(counts != [0] for counts in sharing_before.values()):
        raise AssertionError(f"placement put two replicas of a write set in one zone: {sharing_before}")
    bookies = {b["metadata"]["name"]: b["spec"]["bookieId"] for b in example_bookies(cluster)
               if b["spec"].get("zone") == zone}
    return ZoneSetUp(form, zone, others, bookies, spread, kept, sharing_before, zk)


def node_in(cluster: LocalCluster, zone: str, inside: bool) -> str:
    """A Ready node with no taint (neither cordoned nor the real node) in `zone` (inside) or in another zone."""
    return next(n["metadata"]["name"] for n in cluster.get("nodes")["items"]
                if (n["metadata"]["labels"][ZONE_LABEL] == zone) == inside and ready(n) and not n["spec"].get("taints"))


def bookies_lost(cluster: LocalCluster, bookies: dict[str, str]) -> bool:
    """Whether every one of the named Bookies counts lost (status.lostSince)."""
    return all((cluster.get("bookie", "-n", NAMESPACE, b).get("status") or {}).get("lostSince") for b in bookies)


def back_at_qw(cluster: LocalCluster, name: str, marked: set[str], zone_bookie_ids: Collection[str]) -> bool:
    """One look at a Ledger (added to `marked` while under-replicated): was it marked, and is it back at Qw with no
    replica left on the zone's bookies?"""
    status = ledger_status(cluster, name)
    if status.get("underReplicated"):
        marked.add(name)
    return name in marked and not status.get("underReplicated") and all(
        bookie not in s["bookies"] for s in status.get("segments", []) for bookie in zone_bookie_ids)


def all_bookies_running(cluster: LocalCluster, count: int) -> bool:
    """Whether all `count` Bookies are Running and their pods Ready (the zone back)."""
    return [b.get("status", {}).get("phase") for b in example_bookies(cluster)] == ["Running"] * count and all(
        map(ready, bookie_pods(cluster)))


def repairs_created_since(cluster: LocalCluster, earlier: set[str], since: float) -> list[str]:
    """The repair Jobs not among `earlier` created at or after the wall-clock time `since`."""
    return [job["metadata"]["name"] for job in repair_jobs(cluster) if job["metadata"]["name"] not in earlier
            and job["metadata"]["creationTimestamp"] >= time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))]


def entries_not_as_written(read_back: dict[int, list[dict[str, Any]]], acknowledged: dict[int, int]) -> int:
    """Entries read back that are not what was written at their place (the fill and the rounds wrote entry i as i,
    zero-padded to SIZE bytes): an old copy read as current, or entries read past what was acknowledged."""
    return sum(entry["entry_id"] >= acknowledged.get(ledger_id, 0)
               or entry["payload"] != f"{entry['entry_id']:0{SIZE}d}"
               for ledger_id, entries in read_back.items() for entry in entries)


def zone_loss(cluster: LocalCluster, form: Form = LONG_FORM) -> ZoneLoss:
    """Cut a zone until every ledger with a replica there is back at Qw on the zones left and its bookies' fate is
    settled, then return it and read everything back."""
    setup = set_up(cluster, form)
    zone, spread, kept, zone_bookies, zk = setup.zone, setup.spread, setup.kept, setup.bookies, setup.zk
    stop_name = "writers-stop"
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(ledger_manifest(stop_name, setup.others)))
    stop_id = ids_of(cluster, [stop_name])[stop_name]
    outcome = ZoneLoss(form, zone, spread, kept, setup.sharing_before)
    writer_node = node_in(cluster, zone, inside=False)
    say(f"writer rounds on {writer_node}; waiting for one before the cut")
    start_client(cluster, WRITER, writer_script(zk, stop_id, form.round_pause), writer_node)
    # One round closed shows the writer writing; the checks ask for rounds during the cut and after the repairs.
    wait_for(lambda: writer_rounds(cluster), timeout=600, what="a writer round", interval=1.0)
    jobs_before = {job["metadata"]["name"] for job in repair_jobs(cluster)}
    outcome.claims_before = zone_claims(cluster, zone_bookies)
    outcome.gc_interval = bookie_cluster(cluster).spec.bookie.gc_interval_seconds
    access = fleet_access(cluster, cluster.state / "zone-loss-client-tls")
    named_before = access.ledgers_on(list(zone_bookies.values()))

    say(f"cutting zone {zone}: bookies {', '.join(sorted(zone_bookies))}")
    outcome.cut_at = cut_at = cluster.cut_zone(zone)

    def note(milestone: str, reached: bool) -> None:
        if reached and milestone not in outcome.seconds:
            outcome.seconds[milestone] = time.time() - cut_at
            say(f"{milestone} {outcome.seconds[milestone]:.0f} s after the cut")

    def settled() -> bool:
        for name in kept:
            if ledger_status(cluster, name).get("underReplicated"):
                outcome.marked.add(name)
        note("zone_bookies_lost", bookies_lost(cluster, zone_bookies))
        note("affected_ledgers_at_qw",  # each looked at: marks seen
             all([back_at_qw(cluster, name, outcome.marked, zone_bookies.values()) for name in spread]))
        note("affected_ledgers_marked", outcome.marked >= spread.keys())
        rounds = writer_rounds(cluster)
        note("writer_round_after_repairs", "affected_ledgers_at_qw" in outcome.seconds and any(
            at - cut_at > outcome.seconds["affected_ledgers_at_qw"] for at, _ in rounds))
        for bookie in zone_bookies:
            body = cluster.get("bookie", "-n", NAMESPACE, bookie)
            pods = cluster.get("pods", "-n", NAMESPACE, "--field-selector", f"metadata.name={bookie}")["items"]
            scheduled = next((c for c in (pods[0].get("status") or {}).get("conditions", [])
                              if c["type"] == "PodScheduled"), {}) if pods else {}
            lost = next((c for c in (body.get("status") or {}).get("conditions", []) if c["type"] == "Lost"), {})
            outcome.replacements[bookie] = {
                "phase": (body.get("status") or {}).get("phase"), "lost": lost.get("reason"),
                "lost_message": lost.get("message"), "pod_phase": (pods[0]["status"].get("phase") if pods else None),
                "pod_scheduling": scheduled.get("message") or scheduled.get("reason")}
        note("volumes_kept", "affected_ledgers_at_qw" in outcome.seconds and all(
            r["lost"] == "NodeLost" and "VolumesKept" in event_reasons(cluster, bookie, cut_at)
            for bookie, r in outcome.replacements.items()) and zone_claims(cluster, zone_bookies)
            == outcome.claims_before)
        return outcome.seconds.keys() >= SETTLED

    wait_for(settled, timeout=1800, what=f"ledgers back at Qw without zone {zone}, its bookies' volumes kept",
             interval=1.0)
    outcome.sharing_after = {name: sharing(cluster, name) for name in spread}

    say(f"zone {zone} returns")
    returned_at = cluster.heal_zone(zone)
    outcome.seconds["zone_returned"] = returned_at - cut_at
    outcome.stale = access.named_no_more(named_before)
    say(f"stale copies on the returning bookies: {({b: sorted(s) for b, s in outcome.stale.items()})}")
    wait_for(lambda: returned(cluster, outcome, access, zone_bookies, returned_at), timeout=900,
             what=f"{form.bookies} Running Bookies after the return, the stale copies reclaimed", interval=1.0)
    outcome.claims_after = zone_claims(cluster, zone_bookies)
    outcome.returned = {bookie: event_reasons(cluster, bookie, cut_at) for bookie in zone_bookies}
    outcome.restarts = {pod["metadata"]["name"]: sum(c.get("restartCount", 0) for c in pod["status"].get(
        "containerStatuses", [])) for pod in bookie_pods(cluster) if pod["metadata"]["name"] in zone_bookies}
    run_client(cluster, "zone-loss-stop", f"bookfleet ledger close {stop_id} --zk {zk}")
    log = client_log(cluster, WRITER, timeout=900)
    outcome.writer_rounds = writer_rounds(cluster)
    for line in log.splitlines():
        if line.startswith("{"):
            written = json.loads(line)
            outcome.writer_acked[written["ledger_id"]] = written["entries"]
    say("reading every acknowledged entry back")
    outcome.read_back = read_all(cluster, [*spread.values(), *kept.values(), *outcome.writer_acked])
    outcome.repairs = repair_timeline(cluster, jobs_before, cut_at)
    outcome.repairs_after_return = repairs_created_since(cluster, jobs_before, returned_at)
    return outcome


def returned(cluster: LocalCluster, outcome: ZoneLoss, access: FleetAccess, zone_bookies: dict[str, str],
             returned_at: float) -> bool:
    """One look after the return: are all bookies Running again, do the returning ones answer, are their stale copies
    gone? Notes when each first held (seconds after the cut, resp. after the return)."""
    def note(milestone: str, reached: bool) -> None:
        if reached and milestone not in outcome.seconds_after_return:
            outcome.seconds_after_return[milestone] = time.time() - returned_at
            say(f"{milestone} {outcome.seconds_after_return[milestone]:.0f} s after the return")

    if "bookies_running_after_return" not in outcome.seconds and all_bookies_running(cluster, outcome.form.bookies):
        outcome.seconds["bookies_running_after_return"] = time.time() - outcome.cut_at
    pod_ips = {pod["metadata"]["name"]: pod["status"].get("podIP") for pod in bookie_pods(cluster)}
    for name, bookie_id in zone_bookies.items():
        asked = outcome.stale_left.get(bookie_id, outcome.stale.get(bookie_id, set()))
        if (bookie_id in outcome.stale_left and not asked) or not pod_ips.get(name):
            continue
        try:
            held = access.still_held(pod_ips[name], bookie_id, asked)
        except (OSError, TimeoutError, BookieError):  # not reachable yet (its pod may be starting again)
            continue
        outcome.stale_at_return.setdefault(bookie_id, held)
        outcome.stale_left[bookie_id] = held
    note("returning_bookies_answered", outcome.stale_left.keys() == set(zone_bookies.values()))
    note("stale_copies_reclaimed", "returning_bookies_answered" in outcome.seconds_after_return
         and not any(outcome.stale_left.values()))
    awaited = "stale_copies_reclaimed" if outcome.form.collection else "returning_bookies_answered"
    return "bookies_running_after_return" in outcome.seconds and awaited in outcome.seconds_after_return


def repair_timeline(cluster: LocalCluster, earlier: set[str], cut_at: float) -> list[dict[str, Any]]:
    """The repair Jobs not among `earlier`, oldest first: their bookie, when each was created, started and finished
    and its driver container and executor pods started (seconds after the cut, whole seconds as the API keeps them),
    how it ended, how many driver pods it ran, and the drivers' repair lines (timed phases, "repaired N ledger(s) ...;
    M still marked ...")."""
    timeline = []
    scheduled = {event["involvedObject"]["name"]: event.get("eventTime") or event.get("firstTimestamp")
                 for event in cluster.get("events", "-n", NAMESPACE)["items"] if event.get("reason") == "Scheduled"}
    for job in sorted(repair_jobs(cluster), key=lambda job: job["metadata"]["creationTimestamp"]):
        name, status = job["metadata"]["name"], job.get("status") or {}
        if name in earlier:
            continue
        ended = next((c for c in status.get("conditions", []) if c["type"] in ("Complete", "Failed")
                      and c["status"] == "True"), {})
        drivers = cluster.get("pods", "-n", NAMESPACE, "-l", f"job-name={name}")["items"]
        summaries = [line.strip() for pod in drivers for line in driver_log(cluster, pod).splitlines()
                     if "repair: " in line or "still marked" in line or line.startswith("failure:")]
        executors = f"{name[:resources.EXECUTOR_PREFIX_MAX].rstrip('-')}-exec-"

        def after_cut(stamp: str | None) -> float | None:
            return None if stamp is None else round(server_seconds(stamp, cut_at), 1)

        timeline.append({"job": name, "bookie": job["metadata"]["labels"].get(resources.LABEL_BOOKIE),
                         "created": after_cut(job["metadata"]["creationTimestamp"]),
                         "started": after_cut(status.get("startTime")),
                         "ended": after_cut(ended.get("lastTransitionTime")), "outcome": ended.get("type"),
                         "driver_pods": len(drivers), "summaries": summaries,
                         "driver_started": [after_cut(state.get("startedAt")) for pod in drivers
                                            for status in pod["status"].get("containerStatuses", [])
                                            for state in (status.get("state") or {}).values()],
                         "executors_scheduled": sorted(after_cut(stamp) for pod, stamp in scheduled.items()
                                                       if pod.startswith(executors) and stamp)})
    return timeline


def driver_log(cluster: LocalCluster, pod: dict[str, Any]) -> str:
    """A repair driver pod's output ("" if it never started)."""
    try:
        return cluster.container_log(NAMESPACE, pod["metadata"]["name"], "driver")
    except FileNotFoundError:
        return ""


# --- what a zone loss must show, in its long form (tests/cluster/test_zone_loss.py) and the tier's short one -------

def no_acknowledged_entry_is_lost_and_every_entry_reads_back_as_written(outcome: ZoneLoss, figures: dict) -> None:
    assert figures["acknowledged_entries"] > 0
    assert figures["entries_lost"] == 0, figures
    assert figures["entries_not_as_written"] == 0, figures


def the_writer_kept_writing_through_the_cut_with_qa_reachable(outcome: ZoneLoss, figures: dict) -> None:
    """Any round that failed would have ended the writer pod Failed, and the scenario with it (client_log): rounds
    ran during the cut, and one after the repairs."""
    assert figures["writer_rounds_during_cut"] > 0, figures
    assert "writer_round_after_repairs" in outcome.seconds, figures


def exactly_the_ledgers_with_a_replica_in_the_zone_are_marked_and_back_at_qw_on_the_zones_left(
        outcome: ZoneLoss, figures: dict) -> None:
    assert "affected_ledgers_at_qw" in outcome.seconds, figures
    assert outcome.marked == outcome.spread.keys(), figures  # the ledgers kept off the zone were never marked
    # Three replicas on two zones: every write set shares a zone now, and the Ledger's status says so.
    assert all(counts and min(counts) >= 1 for counts in outcome.sharing_after.values()), outcome.sharing_after


def the_return_starts_no_repair_and_its_bookies_rejoin_on_their_volumes(outcome: ZoneLoss, figures: dict) -> None:
    """The cut bookies ran on, cut off from ZooKeeper for minutes, and rejoin without a restart."""
    assert figures["repairs_started_by_return"] == 0, outcome.repairs_after_return
    assert figures["volumes_kept_through_return"], (outcome.claims_before, outcome.claims_after)
    assert figures["bookies_rejoined"] == sorted(outcome.returned), outcome.returned
    assert set(outcome.restarts.values()) == {0}, outcome.restarts


def the_returning_bookies_copies_of_ledgers_repaired_away_are_garbage_collected(outcome: ZoneLoss,
                                                                                  figures: dict) -> None:
    """Every affected ledger had its replica in the zone on one of its bookies: the stale copies include them all."""
    assert set().union(*outcome.stale.values()) >= set(outcome.spread.values()), outcome.stale
    assert "stale_copies_reclaimed" in outcome.seconds_after_return, figures
    assert figures["stale_copies_left"] == 0, outcome.stale_left


def checks(form: Form) -> tuple[Callable[[ZoneLoss, dict], None], ...]:
    """What a zone loss of that form must show, each given its outcome and figures; the premise (zone-aware placement
    spread every write set over three zones) is checked by `set_up`, so a scenario without it fails there."""
    return (no_acknowledged_entry_is_lost_and_every_entry_reads_back_as_written,
            the_writer_kept_writing_through_the_cut_with_qa_reachable,
            exactly_the_ledgers_with_a_replica_in_the_zone_are_marked_and_back_at_qw_on_the_zones_left,
            the_return_starts_no_repair_and_its_bookies_rejoin_on_their_volumes,
            *((the_returning_bookies_copies_of_ledgers_repaired_away_are_garbage_collected,) if form.collection
              else ()))
