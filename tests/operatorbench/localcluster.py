"""`bookfleet bench operator --node-failure` and `--zone-loss`: the operator on the local Kubernetes cluster
(tests/cluster: a real control plane, process kubelets), the chart installed as the README says.

`--node-failure` fails the node of a bookie holding a replica: seconds from the node being NotReady to the ledgers
marked and the repair Job created, to a healthy Ledger and a fresh bookie. `--zone-loss` cuts a whole zone off for
longer than the lost-bookie delay, then returns it (tests/cluster/zoneloss.py); with `--partition`, the zone is
partitioned off instead, a writer inside it, and heals (tests/cluster/zonepartition.py).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from bookfleet.bench.baseline import cpu_loop, raw_fsync_bandwidth
from tests.cluster import walkthrough, zoneloss, zonepartition

NODE_FAILURE_ENTRIES = 100


def machine_baseline() -> dict[str, float]:
    """The same-run raw fsync and CPU loop, before the cluster starts."""
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp:
        return {**raw_fsync_bandwidth(Path(tmp), 1024, seconds=1.0), **cpu_loop()}


def node_failure(args: argparse.Namespace) -> int:
    baseline = machine_baseline()
    with walkthrough.running_cluster() as cluster:
        walkthrough.install(cluster)
        failure = walkthrough.node_failure(cluster, NODE_FAILURE_ENTRIES)
    figures = failure.figures()
    report = {"bench": "operator", "scenario": "node-failure", **figures,
              "entries_read_back": len(failure.read_back), "baseline": baseline,
              "targets": {"repair_job_after_node_not_ready": figures["lost_bookie_recovery_delay_seconds"] + 5}}
    print(json.dumps(report, indent=None if args.json else 2))
    return 0 if len(failure.read_back) == NODE_FAILURE_ENTRIES else 1


def zone_loss_report(figures: dict[str, Any], baseline: dict[str, float]) -> dict[str, Any]:
    """The zone loss's JSON (the bench's, and the line its tier test prints): figures, baseline, the issue's targets."""
    return {"bench": "operator", "scenario": "zone-loss", **figures, "baseline": baseline,
            "targets": {"affected_ledgers_at_qw": figures["lost_bookie_recovery_delay_seconds"] + 60,
                        "entries_lost": 0, "entries_not_as_written": 0, "repairs_started_by_return": 0,
                        "stale_copies_reclaimed_after_return": figures["gc_interval_seconds"]}}


def zone_partition_report(figures: dict[str, Any], baseline: dict[str, float]) -> dict[str, Any]:
    """The zone partition's JSON (the bench's, and the line its tier test prints)."""
    return {"bench": "operator", "scenario": "zone-partition", **figures, "baseline": baseline,
            "targets": {"entries_lost": 0, "inside_acks_past_fence": 0, "repairs_started_by_heal": 0,
                        "history": "legal"}}


def zone_partition(args: argparse.Namespace) -> int:
    baseline = machine_baseline()
    history_dir = Path(tempfile.mkdtemp(prefix="bookfleet-zone-partition-"))  # kept: the histories and drawings
    with walkthrough.running_cluster(process_zones=zonepartition.PROCESS_ZONES) as cluster:
        walkthrough.install(cluster)
        outcome = zonepartition.zone_partition(cluster, history_dir)
    figures = outcome.figures()
    print(json.dumps(zone_partition_report(figures, baseline), indent=None if args.json else 2))
    failed = figures["entries_lost"] or figures["inside_acks_past_fence"] or figures["repairs_started_by_heal"] \
        or not (outcome.verdict and outcome.verdict.legal)
    return 1 if failed else 0


def zone_loss(args: argparse.Namespace) -> int:
    if getattr(args, "partition", False):
        return zone_partition(args)
    baseline = machine_baseline()
    with walkthrough.running_cluster() as cluster:
        walkthrough.install(cluster)
        figures = zoneloss.zone_loss(cluster).figures()
    print(json.dumps(zone_loss_report(figures, baseline), indent=None if args.json else 2))
    failed = figures["entries_lost"] or figures["entries_not_as_written"] or figures["repairs_started_by_return"] \
        or figures["stale_copies_left"]
    return 1 if failed else 0
