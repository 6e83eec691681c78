"""Repairs of a bookie's ledgers: mark them (the auditor's rule), launch a Job, track it, retry with backoff.

Everything is derived from what Kubernetes and ZooKeeper hold: the attempts of one loss are the Jobs annotated with
its loss time, named deterministically, so an operator restarted mid-repair finds them and launches nothing twice.
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
from dataclasses import dataclass

from kazoo.client import KazooClient

from bookfleet.kube import resources
from bookfleet.kube.models import Bookie, BookieCluster, RepairLauncher, RepairState
from bookfleet.kube.reconcilers import ledgerscan
from bookfleet.kube.runtime.api import BATCH, SPARK, KubeApi
from bookfleet.kube.runtime.context import OperatorContext, ZooKeeperTarget
from bookfleet.replication.auditor import mark_lost_bookie

log = logging.getLogger(__name__)

ANNOTATION_ATTEMPT = "bookfleet.io/repair-attempt"
RETRY_BASE_SECONDS = 5.0
RETRY_MAX_SECONDS = 300.0
MAX_ATTEMPTS = 6


class Outcome(enum.StrEnum):
    RUNNING = "Running"
    BACKING_OFF = "BackingOff"
    REPAIRED = "Repaired"
    GAVE_UP = "GaveUp"
    DISABLED = "Disabled"
    """Auto-recovery is switched off in ZooKeeper: nothing is launched (a repair would only exit "disabled")."""
    QUEUED = "Queued"
    """The cluster already runs its repair.maxConcurrent repairs: this one is launched once one of them ends."""


def retry_delay(attempt: int) -> float:
    """Seconds to wait after failed attempt number `attempt` (0-based): exponential, capped."""
    return min(RETRY_BASE_SECONDS * 2**attempt, RETRY_MAX_SECONDS)


SPARK_STATES = {"COMPLETED": RepairState.SUCCEEDED, "FAILED": RepairState.FAILED,
                "SUBMISSION_FAILED": RepairState.FAILED, "RUNNING": RepairState.RUNNING}
"""SparkApplication status.applicationState.state values of the Spark operator that end or start a repair."""


def job_state(job: dict) -> RepairState:
    """The state of a repair Job or SparkApplication."""
    status = job.get("status") or {}
    if job.get("kind") == "SparkApplication":
        return SPARK_STATES.get((status.get("applicationState") or {}).get("state", ""), RepairState.PENDING)
    for cond in status.get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") == "Complete":
            return RepairState.SUCCEEDED
        if cond.get("status") == "True" and cond.get("type") == "Failed":
            return RepairState.FAILED
    if status.get("succeeded"):
        return RepairState.SUCCEEDED
    return RepairState.RUNNING if status.get("active") or status.get("startTime") else RepairState.PENDING


def finished_at(job: dict) -> dt.datetime | None:
    status = job.get("status") or {}
    stamp = status.get("completionTime") or status.get("terminationTime") or next(
        (c.get("lastTransitionTime") for c in status.get("conditions") or [] if c.get("status") == "True"), None
    )
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None


def loss_of(job: dict) -> tuple[str | None, str | None]:
    """(bookie id, loss time) of a repair: the attempts of one loss share it."""
    annotations = job["metadata"].get("annotations") or {}
    return annotations.get(resources.ANNOTATION_BOOKIE_ID), annotations.get(resources.ANNOTATION_LOST_SINCE)


def attempt_order(job: dict) -> tuple[str, int]:
    """Sort key of repair Jobs: oldest attempt first."""
    return job["metadata"].get("creationTimestamp", ""), int(job["metadata"].get("annotations", {}).get(
        ANNOTATION_ATTEMPT, 0))


def repair_jobs(api: KubeApi, namespace: str, cluster: str, bookie: str | None = None) -> list[dict]:
    """Repair Jobs and SparkApplications of a cluster (optionally of one bookie), oldest attempt first."""
    selector = resources.labels(cluster, resources.REPAIR, bookie)
    jobs = api.list(BATCH, "jobs", namespace, selector)
    if api.served(SPARK, "sparkapplications", namespace):
        jobs += api.list(SPARK, "sparkapplications", namespace, selector)
    return sorted(jobs, key=attempt_order)


BookieKey = tuple[str, str, str]
"""(namespace, cluster, bookie id): how the operator's index of repair Jobs is keyed. A Ledger finds its repairs
through the bookies its under-replication marker names: the ledger ids themselves stay in ZooKeeper."""


def bookie_key(job: dict) -> BookieKey | None:
    """The key of a repair Job or SparkApplication in the repair index (kube.caches keeps it from the watch, so
    a Ledger's status costs no LIST)."""
    meta = job["metadata"]
    cluster = (meta.get("labels") or {}).get(resources.LABEL_CLUSTER)
    bookie_id = (meta.get("annotations") or {}).get(resources.ANNOTATION_BOOKIE_ID)
    return (meta["namespace"], cluster, bookie_id) if cluster and bookie_id else None


def remaining_ledgers(zk: KazooClient, bookie_id: str, began_after: dt.datetime) -> list[int]:
    """Ledgers that still need `bookie_id`: those whose metadata names it, from a scan begun after `began_after`
    (kube.reconcilers.ledgerscan: one scan serves the passes of every bookie of the cluster).

    The markers are not read: a reader or a repair asks a bookie only for the ledgers whose metadata names it, and a
    repair swaps it out of the metadata by compare-and-set. A marker still naming it on a ledger it was
    swapped out of waits on the other bookies it names; their own losses (or the next repair run) see to it. Walking
    every marker here made each pass of a lost or draining bookie cost a read per under-replicated ledger.
    """
    return ledgerscan.ledgers_on(zk, bookie_id, began_after)


def launch(ctx: OperatorContext, cluster: BookieCluster, bookie: Bookie, since: dt.datetime, attempt: int) -> dict:
    """Mark the bookie's ledgers and create attempt `attempt` of the repair (a no-op if it exists)."""
    zk = ctx.zk(ZooKeeperTarget.of(cluster))
    ledgers = mark_lost_bookie(zk, bookie.spec.bookie_id)
    launcher = cluster.spec.auto_recovery.repair.launcher
    build = resources.spark_application if launcher == RepairLauncher.SPARK_APPLICATION else resources.repair_job
    manifest = build(cluster, bookie, since, (), attempt)  # the job reads the ledgers from the markers
    manifest["metadata"]["annotations"][ANNOTATION_ATTEMPT] = str(attempt)
    job, created = ctx.api.ensure(manifest)
    if created:
        log.info("launched repair %s of bookie %s (%d ledgers)", job["metadata"]["name"], bookie.metadata.name,
                 len(ledgers))
        ctx.api.post_event(bookie.to_wire(), "RepairLaunched",
                           f"{manifest['kind']} {job['metadata']['name']} repairs {len(ledgers)} ledger(s)"
                           f" (attempt {attempt + 1})")
    return job


@dataclass(frozen=True)
class RepairObserved:
    """The attempts of one loss, oldest first, and the ledgers that still need the bookie (read only once the
    latest attempt succeeded; None otherwise)."""

    attempts: tuple[dict, ...] = ()
    remaining: tuple[int, ...] | None = None
    others_active: int = 0
    """Repairs of the cluster's other losses and drains still pending or running: what the concurrency cap counts."""


@dataclass(frozen=True)
class RepairStep:
    outcome: Outcome
    launch: int | None = None
    """The attempt to launch now (None: nothing to launch)."""


def observe_repair(ctx: OperatorContext, cluster: BookieCluster, bookie: Bookie, since: dt.datetime) -> RepairObserved:
    """The repair Jobs of the loss at `since` (named after it), how many of the cluster's other repairs are active
    and, once the latest attempt succeeded, what is left."""
    names = {resources.repair_name(cluster.metadata.name, bookie.metadata.name, since, n) for n in range(MAX_ATTEMPTS)}
    jobs = repair_jobs(ctx.api, cluster.metadata.namespace, cluster.metadata.name)
    attempts = tuple(j for j in jobs if j["metadata"]["name"] in names)
    others = sum(1 for j in jobs if j["metadata"]["name"] not in names
                 and job_state(j) in (RepairState.PENDING, RepairState.RUNNING))
    if not attempts or job_state(attempts[-1]) != RepairState.SUCCEEDED:
        return RepairObserved(attempts, others_active=others)
    ended = finished_at(attempts[-1]) or dt.datetime.now(dt.UTC)  # what it moved is in a scan begun later
    left = remaining_ledgers(ctx.zk(ZooKeeperTarget.of(cluster)), bookie.spec.bookie_id, ended)
    if left:
        log.warning("repair %s succeeded but %d ledger(s) still need %s", attempts[-1]["metadata"]["name"], len(left),
                    bookie.spec.bookie_id)
    return RepairObserved(attempts, tuple(left), others)


def decide_repair(disabled: bool, observed: RepairObserved, at: dt.datetime, limit: int) -> RepairStep:
    """Where the repair of one loss stands and which attempt to launch (pure): the first at once, a failed one
    (or one that left ledgers behind) again after its backoff, at most MAX_ATTEMPTS in all; any of them only while
    fewer than `limit` other repairs of the cluster are active (else QUEUED: passes of two lost bookies that run at
    the same moment may each launch the last free one)."""
    step = _next_step(disabled, observed, at)
    if step.launch is not None and observed.others_active >= limit:
        return RepairStep(Outcome.QUEUED)
    return step


def _next_step(disabled: bool, observed: RepairObserved, at: dt.datetime) -> RepairStep:
    if disabled:
        return RepairStep(Outcome.DISABLED)
    if not observed.attempts:
        return RepairStep(Outcome.RUNNING, 0)
    latest = observed.attempts[-1]
    attempt = int(latest["metadata"].get("annotations", {}).get(ANNOTATION_ATTEMPT, len(observed.attempts) - 1))
    state = job_state(latest)
    if state in (RepairState.PENDING, RepairState.RUNNING):
        return RepairStep(Outcome.RUNNING)
    if state == RepairState.SUCCEEDED and not observed.remaining:
        return RepairStep(Outcome.REPAIRED)
    if attempt + 1 >= MAX_ATTEMPTS:
        return RepairStep(Outcome.GAVE_UP)
    ended = finished_at(latest) or at
    if (at - ended).total_seconds() < retry_delay(attempt):
        return RepairStep(Outcome.BACKING_OFF)
    return RepairStep(Outcome.RUNNING, attempt + 1)
