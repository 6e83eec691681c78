"""A zone partitioned off, and healed, on the local cluster: the partition variant of the zone loss (zoneloss.py,
whose set-up and checks it shares). The zone's nodes stay up and its pods run on with their links up, reaching each
other but nothing outside the zone: not the other zones' pods, not ZooKeeper (the chart's server runs in another
zone), not the API server. The control plane lives outside every zone here (on the host), as it does for a zone cut
off from a cluster whose control plane is in the other zones or behind a regional endpoint across the cut: so the
zone's kubelets lose it too, their nodes go NotReady and their pods' status stays as it was until the heal.

Two writers record their history (tests/chaos/writer.py, the one-writer chaos harness's writer, in client pods): one
on a node inside the zone writes one zone-aware E3/Qw3/Qa2 ledger (one replica per zone), whose adds wait (a long
add timeout) rather than give up; one outside takes that ledger over once the partition starts (reopen, or recovery
when entries past the LAC need deciding: either fences the ledger on the bookies it reaches) and writes on. With its
zone's one bookie the inside writer can get no Qa acknowledgement; when the partition heals its waiting adds reach
the fenced bookies. After the heal every ledger of both histories is closed and read back, recorded in a third
history, and the porcupine checker (tests/chaos/checker.py) decides whether the whole is legal for a single-writer
append-only log.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import MetadataStore
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.polling import wait_for
from tests.chaos import checker
from tests.cluster import zoneloss
from tests.cluster.stalecopies import FleetAccess, fleet_access
from tests.cluster.walkthrough import (
    NAMESPACE,
    ROOT,
    LocalCluster,
    client_log,
    repair_jobs,
    say,
    start_client,
)

PROCESS_ZONES = True
"""Its cluster's zones run on the process kubelet: its writers run this checkout's tests.chaos.writer, which no image
holds, and their histories are read from their scratch volumes on the host."""
INSIDE, TAKER, FINAL = "inside", "taker", "final"
"""The writers' and the read-back's names in the histories; their pods are `partition-<name>`."""
ACKS_BEFORE = 200
"""Adds acknowledged to the inside writer before the partition starts."""
ADD_TIMEOUT = 900
"""The inside writer's add timeout: longer than the partition, so its adds are still waiting when it heals."""
ADD_INTERVAL = "0.01"
"""Seconds between a writer's appends: at most 100 adds/s each, so the read-back and the check stay short."""
SETTLED = {"zone_bookies_lost", "affected_ledgers_at_qw", "taken_over", "taker_acked_after_takeover"}
"""What the partition waits for (and for no ledger marked and no repair running) before it heals."""


def pod_name(writer: str) -> str:
    return f"partition-{writer}"


def scratch(cluster: LocalCluster, pod: str) -> Path:
    """The pod's /tmp (its emptyDir) as the process kubelet keeps it on the host (it stays there after the pod is
    gone: the inside writer's may be deleted by the taint manager while its node is NotReady, and stopped at the
    heal)."""
    uid = cluster.get("pod", "-n", NAMESPACE, pod)["metadata"]["uid"]
    return cluster.state / "pods" / uid / "volumes" / "tmp"


def check_running(cluster: LocalCluster, writer: str) -> None:
    """AssertionError with the writer's output if its pod failed (a writer that crashed ends the scenario)."""
    if pod_phase(cluster, pod_name(writer)) == "Failed":
        log = cluster.container_log(NAMESPACE, pod_name(writer), "client")
        raise AssertionError(f"writer {writer} failed:\n{log[-3000:]}")


def pod_phase(cluster: LocalCluster, pod: str) -> str:
    """The pod's phase, or Deleted once it is gone."""
    pods = cluster.get("pods", "-n", NAMESPACE, "--field-selector", f"metadata.name={pod}")["items"]
    return pods[0].get("status", {}).get("phase", "Pending") if pods else "Deleted"


def start_module(cluster: LocalCluster, pod: str, node: str, module: str, *args: str) -> None:
    """`python -m module args` of this checkout in a client pod on `node` (the pod's interpreter is this one's)."""
    start_client(cluster, pod, f"exec env PYTHONPATH={ROOT} python -m {module} {' '.join(args)}", node)


def start_writer(cluster: LocalCluster, name: str, node: str, zk: str, seed: int, *args: str) -> None:
    start_module(cluster, pod_name(name), node, "tests.chaos.writer", "--zk", zk, "--dir", "/tmp", "--name", name,
                 "--seed", str(seed), *args)


@dataclass(frozen=True)
class Op:
    """One operation of a history: what was invoked, and what the client was told (None: never answered)."""

    process: str
    f: str
    ledger: int
    entry: int | None
    invoked: int
    done: int | None
    told: dict[str, Any] | None


def operations(path: Path) -> list[Op]:
    """The operations of one history file (tests/chaos/history.py), in invocation order; a line still being written
    is left out."""
    invoked: dict[str, dict[str, Any]] = {}
    told: dict[str, dict[str, Any]] = {}
    text = path.read_text() if path.exists() else ""
    for line in text[:text.rfind("\n") + 1].splitlines():
        event = json.loads(line)
        (invoked if event["type"] == "invoke" else told)[event["id"]] = event
    ops = []
    for op_id, event in invoked.items():
        answer = told.get(op_id)
        ok = answer if answer and answer["type"] == "ok" else None
        ops.append(Op(event["process"], event["f"], event["ledger"], event.get("entry"), event["t"],
                      answer["t"] if answer else None, ok))
    return ops


def acked(ops: list[Op]) -> list[Op]:
    return [op for op in ops if op.f == "add" and op.told is not None]


def fence_of(ops: list[Op], ledger_id: int) -> Op | None:
    """The taker's first successful reopen or close of the ledger: the fence point (`told["last"]`)."""
    return next((op for op in ops if op.ledger == ledger_id and op.f in ("reopen", "close") and op.told), None)


def marked_ledgers(access: FleetAccess) -> list[int]:
    """The ledgers marked under-replicated now."""
    with zkclient.session(access.zookeeper, auth=access.auth) as session:
        return UnderReplication(session).ledger_ids()


def repairs_running(cluster: LocalCluster) -> list[str]:
    return [job["metadata"]["name"] for job in repair_jobs(cluster) if not any(
        c["type"] in ("Complete", "Failed") and c["status"] == "True"
        for c in (job.get("status") or {}).get("conditions", []))]


@dataclass
class ZonePartition:
    """What the partition and its heal did; seconds are counted from the partition (resp. the heal)."""

    setup: zoneloss.ZoneSetUp
    history_dir: Path
    ledger: int = -1
    """The inside writer's ledger."""
    ledger_bookies_in_zone: int = -1
    partitioned_at: int = 0
    """time.monotonic_ns() at the partition (the histories' clock)."""
    healed_at: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    seconds_after_heal: dict[str, float] = field(default_factory=dict)
    marked: set[str] = field(default_factory=set)
    repairs: list[dict[str, Any]] = field(default_factory=list)
    repairs_after_heal: list[str] = field(default_factory=list)
    writer_phases: dict[str, str] = field(default_factory=dict)
    """How each writer pod ended (Succeeded: it stopped when told)."""
    ops: dict[str, list[Op]] = field(default_factory=dict)
    """History name -> its operations."""
    verdict: checker.Verdict | None = None
    read_back: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """The spread and kept ledgers, read back by `zoneloss.read_all`."""

    def fence(self) -> Op | None:
        return fence_of(self.ops.get(TAKER, []), self.ledger)

    def inside_acks_past_fence(self) -> list[Op]:
        """Adds to the fenced ledger acknowledged to the inside writer past the fence point. (An add the bookies
        outside got before the partition may be acknowledged late, its answer held up by the partition: recovery
        found it, it lies within the fence point.)"""
        fence = self.fence()
        if fence is None:
            return []
        return [op for op in acked(self.ops[INSIDE])
                if op.ledger == self.ledger and op.told["entry"] > fence.told["last"]]

    def inside_adds_cut_off(self) -> list[Op]:
        """The inside writer's adds still unanswered when its zone was cut off, or made while it was: it writes on,
        so there is at least the one it was waiting for."""
        return [op for op in self.ops[INSIDE] if op.f == "add" and op.invoked < self.healed_at
                and (op.done is None or op.done > self.partitioned_at)]

    def writers_acks_not_read_back(self, writer: str) -> int:
        """Adds acknowledged to `writer` that the read-back after the heal did not read with their payload."""
        read = {(op.ledger, op.entry, op.told.get("digest")) for op in self.ops.get(FINAL, [])
                if op.f == "read" and op.told is not None}
        return sum((op.ledger, op.told["entry"], op.told["digest"]) not in read for op in acked(self.ops[writer]))

    def figures(self) -> dict[str, Any]:
        fence = self.fence()
        inside, taker = acked(self.ops[INSIDE]), acked(self.ops[TAKER])
        filled = len(self.setup.spread) + len(self.setup.kept)
        fill_read = sum(map(len, self.read_back.values()))
        after_heal = [op for op in inside if (op.done or 0) > self.healed_at]
        cut_off = self.inside_adds_cut_off()
        form = self.setup.form
        return {
            "lost_bookie_recovery_delay_seconds": form.delay, "zone": self.setup.zone,
            "bookies": form.bookies, "partition": True,
            "affected_ledgers": len(self.setup.spread), "affected_bytes": len(self.setup.spread) * form.entries
            * zoneloss.SIZE,
            "inside_writer_ledger": self.ledger, "inside_writer_ledger_bookies_in_zone": self.ledger_bookies_in_zone,
            "seconds_after_partition": {name: round(value, 1) for name, value in self.seconds.items()},
            "seconds_after_heal": {name: round(value, 1) for name, value in self.seconds_after_heal.items()},
            "fence": None if fence is None else {"by": fence.f, "last": fence.told["last"], "seconds_after_partition":
                                                 round(((fence.done or 0) - self.partitioned_at) / 1e9, 1)},
            "inside_acks_before_partition": sum((op.done or 0) < self.partitioned_at for op in inside),
            "inside_acks_during_partition": sum(self.partitioned_at < (op.done or 0) < self.healed_at
                                                for op in inside),
            "inside_acks_after_heal": len(after_heal),
            "inside_acks_past_fence": len(self.inside_acks_past_fence()),
            "inside_adds_cut_off": len(cut_off),
            "inside_adds_cut_off_acknowledged": sum(op.told is not None for op in cut_off),
            "inside_adds_cut_off_failed": sum(op.told is None and op.done is not None for op in cut_off),
            "taker_acks": len(taker),
            "acknowledged_entries": len(inside) + len(taker) + filled * form.entries,
            "inside_acks_not_read_back": self.writers_acks_not_read_back(INSIDE),
            "entries_lost": self.writers_acks_not_read_back(INSIDE) + self.writers_acks_not_read_back(TAKER)
            + filled * form.entries - fill_read,
            "entries_not_as_written": zoneloss.entries_not_as_written(
                self.read_back, {ledger_id: form.entries for ledger_id in self.read_back}),
            "repair_jobs": self.repairs, "repairs_started_by_heal": len(self.repairs_after_heal),
            "writer_pods": self.writer_phases,
            "history": None if self.verdict is None else {
                key: self.verdict.figures[key] for key in ("verdict", "operations", "ledgers", "acknowledged",
                                                           "violations", "visualization", "seconds")},
            "history_dir": str(self.history_dir),
        }


def zone_partition(cluster: LocalCluster, history_dir: Path) -> ZonePartition:
    """Partition a zone off until its writer's ledger is taken over and every ledger with a replica there is back
    at Qw (nothing marked, no repair running), then heal it, stop the writers, read every ledger of their histories
    back and check the histories; they are kept in `history_dir`."""
    setup = zoneloss.set_up(cluster, zoneloss.LONG_FORM)
    zone, zk = setup.zone, setup.zk
    history_dir.mkdir(parents=True, exist_ok=True)
    outcome = ZonePartition(setup, history_dir)
    inside_node, outside_node = zoneloss.node_in(cluster, zone, True), zoneloss.node_in(cluster, zone, False)
    say(f"a history writer on {inside_node} (zone {zone}): one E3/Qw3/Qa2 zone-aware ledger")
    start_writer(cluster, INSIDE, inside_node, zk, 23, "--config", "3,3,2", "--min-entries", "1000000",
                 "--max-entries", "1000001", "--add-timeout", str(ADD_TIMEOUT), "--add-interval", ADD_INTERVAL)
    inside_dir = wait_for(lambda: check_running(cluster, INSIDE) or (
        (d := scratch(cluster, pod_name(INSIDE))).joinpath(f"{INSIDE}.ledger").exists()
        and len(acked(operations(d / f"{INSIDE}.history.jsonl"))) >= ACKS_BEFORE and d),
        timeout=600, what=f"{ACKS_BEFORE} adds acknowledged inside the zone", interval=2.0)
    outcome.ledger = int((inside_dir / f"{INSIDE}.ledger").read_text())
    access = fleet_access(cluster, cluster.state / "zone-partition-client-tls")
    with zkclient.session(access.zookeeper, auth=access.auth) as session:
        metadata, _ = MetadataStore(session).read(outcome.ledger)
    outcome.ledger_bookies_in_zone = len(metadata.bookies() & set(setup.bookies.values()))
    if outcome.ledger_bookies_in_zone != 1:  # the premise: Qa out of the inside writer's reach once cut off
        raise AssertionError(f"ledger {outcome.ledger} has {outcome.ledger_bookies_in_zone} replicas in zone {zone}: "
                             f"{metadata.segments}")
    jobs_before = {job["metadata"]["name"] for job in repair_jobs(cluster)}
    dirs = {INSIDE: inside_dir}

    say(f"partitioning zone {zone} off (bookies {', '.join(sorted(setup.bookies))}); a writer on {outside_node} "
        f"takes ledger {outcome.ledger} over")
    cut_at = cluster.partition_zone(zone)
    outcome.partitioned_at = time.monotonic_ns()
    start_writer(cluster, TAKER, outside_node, zk, 24, "--config", "3,3,2", "--take-over", str(outcome.ledger),
                 "--add-interval", ADD_INTERVAL)
    taker_dir = dirs[TAKER] = scratch(cluster, pod_name(TAKER))

    def note(milestone: str, reached: bool) -> None:
        if reached and milestone not in outcome.seconds:
            outcome.seconds[milestone] = time.time() - cut_at
            say(f"{milestone} {outcome.seconds[milestone]:.0f} s after the partition")

    def settled() -> bool:
        check_running(cluster, TAKER)
        note("zone_bookies_lost", zoneloss.bookies_lost(cluster, setup.bookies))
        note("affected_ledgers_at_qw", all([zoneloss.back_at_qw(cluster, name, outcome.marked, setup.bookies.values())
                                            for name in setup.spread]))
        ops = operations(taker_dir / f"{TAKER}.history.jsonl")
        fence = fence_of(ops, outcome.ledger)
        note("taken_over", fence is not None)
        note("taker_acked_after_takeover", fence is not None and any(
            (op.done or 0) > (fence.done or 0) for op in acked(ops)))
        if outcome.seconds.keys() < SETTLED or marked_ledgers(access) or repairs_running(cluster):
            return False
        note("nothing_marked_no_repair_running", True)
        return True

    wait_for(settled, timeout=1800, interval=2.0,
             what=f"ledger {outcome.ledger} taken over, the ledgers back at Qw without zone {zone}, no repair left")
    say(f"zone {zone} heals; the inside writer stops once its waiting adds are answered")
    inside_dir.joinpath("stop").touch()
    healed_at = cluster.heal_zone(zone)
    outcome.healed_at = time.monotonic_ns()
    outcome.seconds["healed"] = healed_at - cut_at
    wait_for(lambda: zoneloss.all_bookies_running(cluster, setup.form.bookies), timeout=900, interval=2.0,
             what=f"{setup.form.bookies} Running Bookies after the heal")
    outcome.seconds_after_heal["bookies_running"] = time.time() - healed_at

    say("stopping the writers")
    taker_dir.joinpath("stop").touch()
    for writer in (INSIDE, TAKER):
        outcome.writer_phases[writer] = wait_for(
            lambda w=writer: (p := pod_phase(cluster, pod_name(w))) in ("Succeeded", "Failed", "Deleted") and p,
            timeout=ADD_TIMEOUT + 300, interval=2.0, what=f"writer {writer} stopped")
        shutil.copy(dirs[writer] / f"{writer}.history.jsonl", history_dir)
        outcome.ops[writer] = operations(history_dir / f"{writer}.history.jsonl")
    ledgers = sorted({op.ledger for ops in outcome.ops.values() for op in ops})
    say(f"closing and reading back the {len(ledgers)} ledgers of the histories")
    start_module(cluster, pod_name(FINAL), outside_node, "tests.chaos.readback", "--zk", zk, "--history",
                 f"/tmp/{FINAL}.history.jsonl", "--ledgers", ",".join(map(str, ledgers)))
    client_log(cluster, pod_name(FINAL), timeout=1800)
    shutil.copy(scratch(cluster, pod_name(FINAL)) / f"{FINAL}.history.jsonl", history_dir)
    outcome.ops[FINAL] = operations(history_dir / f"{FINAL}.history.jsonl")
    outcome.verdict = checker.check(sorted(history_dir.glob("*.history.jsonl")), history_dir / "html")
    say(f"history checker: {outcome.verdict.verdict}")
    outcome.read_back = zoneloss.read_all(cluster, [*setup.spread.values(), *setup.kept.values()])
    outcome.repairs = zoneloss.repair_timeline(cluster, jobs_before, cut_at)
    outcome.repairs_after_heal = zoneloss.repairs_created_since(cluster, jobs_before, healed_at)
    return outcome
