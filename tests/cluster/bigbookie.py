"""A bookie with more ledgers than an annotation holds, lost on the local cluster.

Repair Jobs once carried every ledger id of the lost bookie in a `bookfleet.io/ledgers` annotation; the API server
caps an object's annotations at 256 KiB (keys and values together), so past some count of ids the Job was refused
and the repair never started. The count depends on the ids' digits: `ledgers_past_the_limit` computes it for the
ids this cluster's ZooKeeper can hand out (the smallest: consecutive from the highest id in use), and the scenario
creates ledgers until their real ids overflow the cap. The ledgers are made cheaply: closed, empty, E2/Qw2 metadata on
the lost bookie and one other, written straight to ZooKeeper from many threads sharing one session (the repair still
has to move every one of them off the lost bookie: the segments are rewritten, the markers cleared). They are
deleted afterwards.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient

from bookfleet.kube import resources
from bookfleet.kube.models import Bookie
from bookfleet.kube.reconcilers import repairs
from bookfleet.meta import zk
from bookfleet.meta.metadata import LedgerState, MetadataStore, new_metadata
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.polling import wait_for
from tests.cluster.walkthrough import (
    NAMESPACE,
    LocalCluster,
    apply_settings,
    bookie_cluster,
    events,
    lose_bookie,
    new_repair_jobs,
    repair_jobs,
    say,
    scale,
)

ANNOTATIONS_LIMIT = 256 * 1024
"""The API server's cap on an object's annotations, keys and values together (TotalAnnotationSizeLimitB)."""
OLD_LEDGERS_ANNOTATION = "bookfleet.io/ledgers"
"""Where repair Jobs carried the lost bookie's ledger ids before they were read from the markers."""
ZK_THREADS = 32
BATCH = 2000
"""Ledgers created between two looks at whether their ids overflow the old shape."""
"""Threads sharing one ZooKeeper session to create and delete the ledgers: their requests are pipelined."""
DELAY = 10
REPAIR_TIMEOUT = 1200
"""How long the repair of every ledger may take once its Job exists."""


def annotation_bytes(annotations: Mapping[str, str]) -> int:
    """What the API server counts against the cap."""
    return sum(len(key) + len(value) for key, value in annotations.items())


def with_ledger_ids(manifest: dict[str, Any], ledger_ids: Sequence[int]) -> dict[str, Any]:
    """The repair Job in its old shape: every ledger id in an annotation."""
    old = json.loads(json.dumps(manifest))
    old["metadata"]["annotations"][OLD_LEDGERS_ANNOTATION] = ",".join(map(str, ledger_ids))
    return old


def ledgers_past_the_limit(first_id: int, annotations: Mapping[str, str]) -> int:
    """How many ledgers, with consecutive ids from `first_id`, make the old shape's annotations exceed the cap."""
    size = annotation_bytes(annotations) + len(OLD_LEDGERS_ANNOTATION) - 1  # no comma before the first id
    count = 0
    while size <= ANNOTATIONS_LIMIT:
        size += len(str(first_id + count)) + 1
        count += 1
    return count


def repair_job_as_built(cluster: LocalCluster, bookie: str) -> dict[str, Any]:
    """The repair Job the operator builds for the loss of `bookie` now (its first attempt)."""
    body = cluster.get("bookie", "-n", NAMESPACE, bookie)
    job = resources.repair_job(bookie_cluster(cluster), Bookie.model_validate(body), dt.datetime.now(dt.UTC), (), 0)
    job["metadata"]["annotations"][repairs.ANNOTATION_ATTEMPT] = "0"
    return job


def refusal(cluster: LocalCluster, manifest: dict[str, Any]) -> str:
    """What the API server says to creating `manifest` (a server-side dry run: admitted, nothing is stored); "" if
    it is admitted."""
    try:
        cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(manifest))
    except AssertionError as refused:
        return str(refused)
    return ""


@contextmanager
def zookeeper(cluster: LocalCluster) -> Iterator[KazooClient]:
    """A session on the example cluster's ZooKeeper (its pod IP, its chroot) with the cluster's credential."""
    secret = cluster.get("secret", "-n", NAMESPACE, "bookfleet-zk-auth")["data"]["auth"]
    [server] = cluster.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=zookeeper")["items"]
    chroot = bookie_cluster(cluster).spec.zookeeper.partition("/")[2]
    hosts = f"{server['status']['podIP']}:2181" + (f"/{chroot}" if chroot else "")
    with zk.session(hosts, auth=base64.b64decode(secret).decode()) as session:
        yield session


def next_ledger_id(session: KazooClient) -> int:
    """The smallest id the generator can hand out next."""
    return max(MetadataStore(session).ledger_ids(), default=-1) + 1


def create_ledgers(session: KazooClient, count: int, ensemble: tuple[str, str]) -> list[int]:
    """`count` closed, empty E2/Qw2/Qa2 ledgers on `ensemble`, as a writer that closed them at once leaves them."""
    metadata = new_metadata(ensemble, 2, 2).model_copy(update={"state": LedgerState.CLOSED})
    store = MetadataStore(session)
    with ThreadPoolExecutor(ZK_THREADS) as pool:
        return sorted(pool.map(lambda _: store.create(metadata), range(count)))


def delete_ledgers(session: KazooClient, ledger_ids: Sequence[int]) -> None:
    store = MetadataStore(session)
    with ThreadPoolExecutor(ZK_THREADS) as pool:
        list(pool.map(store.delete, ledger_ids))


@dataclass
class BigBookie:
    """What the loss of a bookie holding `len(ledgers)` ledgers did; seconds from the loss."""

    bookie: str
    ledgers: list[int]
    old_shape_bytes: int
    old_shape_refusal: str
    job: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    create_seconds: float = 0.0
    left_on_bookie: int = -1
    markers_left: int = -1
    still_naming_bookie: int = -1

    def figures(self) -> dict[str, Any]:
        return {"ledgers": len(self.ledgers), "first_id": self.ledgers[0], "last_id": self.ledgers[-1],
                "old_shape_annotation_bytes": self.old_shape_bytes, "annotations_limit": ANNOTATIONS_LIMIT,
                "repair_job_annotation_bytes": annotation_bytes(self.job["metadata"]["annotations"]),
                "lost_bookie_recovery_delay_seconds": DELAY, "seconds_to_create_ledgers": round(self.create_seconds),
                "seconds_after_loss": {name: round(value, 1) for name, value in self.seconds.items()}}


def check_launched(cluster: LocalCluster, outcome: BigBookie) -> None:
    """The premise and the first half: the old shape was refused for these ids, and the operator's Job exists, names
    the bookie, carries no ids and says how many ledgers it repairs."""
    checks = {
        "old shape over the cap": outcome.old_shape_bytes > ANNOTATIONS_LIMIT,
        "old shape refused": "metadata.annotations: Too long" in outcome.old_shape_refusal,
        "Job of the bookie": outcome.job["metadata"]["labels"].get(resources.LABEL_BOOKIE) == outcome.bookie,
        "no ids in the Job": annotation_bytes(outcome.job["metadata"]["annotations"]) < 1024,
        "RepairLaunched counts them": any(  # these and whatever else the bookie held
            event["reason"] == "RepairLaunched" and (said := re.search(r"repairs (\d+) ledger", event["message"]))
            and int(said[1]) >= len(outcome.ledgers) for event in events(cluster, outcome.bookie)),
    }
    if failed := [name for name, ok in checks.items() if not ok]:
        raise AssertionError(f"big bookie: {', '.join(failed)} failed: {json.dumps(outcome.figures())}")


def lose_a_big_bookie(cluster: LocalCluster, bookie: str, other: str) -> BigBookie:
    """Give `bookie` more ledgers than the old Job shape could name, lose it with its volumes, and wait until the
    operator's repair Job has moved every one off it (no metadata names it, no marker left)."""
    say("4 bookies: the example's E = Qw = 3 ledger on the lost bookie needs one to move its replica to")
    scale(cluster, 4)
    apply_settings(cluster, {"autoRecovery": {"lostBookieRecoveryDelaySeconds": DELAY}})
    ids = {name: cluster.get("bookie", "-n", NAMESPACE, name)["spec"]["bookieId"] for name in (bookie, other)}
    as_built = repair_job_as_built(cluster, bookie)
    with zookeeper(cluster) as session:
        count = ledgers_past_the_limit(next_ledger_id(session), as_built["metadata"]["annotations"])
        say(f"creating ledgers on {bookie} and {other} until their ids overflow the old Job shape (at least {count})")
        started = time.monotonic()
        ledgers: list[int] = []
        while annotation_bytes(with_ledger_ids(as_built, ledgers)["metadata"]["annotations"]) <= ANNOTATIONS_LIMIT:
            ledgers += create_ledgers(session, BATCH, (ids[bookie], ids[other]))
        created = time.monotonic() - started
        say(f"{len(ledgers)} ledgers {ledgers[0]}..{ledgers[-1]} in {created:.0f} s")
        try:
            old = with_ledger_ids(as_built, ledgers)
            outcome = BigBookie(bookie, ledgers, annotation_bytes(old["metadata"]["annotations"]),
                                refusal(cluster, old), create_seconds=created)
            earlier = {job["metadata"]["name"] for job in repair_jobs(cluster, bookie)}
            say(f"losing {bookie}: its pod and volumes deleted (lost-bookie delay {DELAY} s)")
            lost_at = time.monotonic()
            lose_bookie(cluster, ids[bookie])
            index = MetadataStore(session)

            def note(milestone: str) -> None:
                if milestone not in outcome.seconds:
                    outcome.seconds[milestone] = time.monotonic() - lost_at
                    say(f"{milestone} {outcome.seconds[milestone]:.0f} s after the loss")

            def launched() -> bool:
                if jobs := new_repair_jobs(cluster, bookie, earlier):
                    outcome.job = cluster.get("job", "-n", NAMESPACE, jobs[0])
                    note("repair_job_created")
                return bool(outcome.job)

            wait_for(launched, timeout=900, what=f"the repair Job of {bookie}", interval=5.0)
            check_launched(cluster, outcome)

            def repaired() -> bool:
                outcome.left_on_bookie = len(index.ledgers_on_bookie(ids[bookie]))
                if outcome.left_on_bookie == 0:
                    note("ledgers_off_bookie")
                if outcome.job and (cluster.get("job", "-n", NAMESPACE, outcome.job["metadata"]["name"])
                                    .get("status") or {}).get("succeeded"):
                    note("repair_job_succeeded")
                return {"ledgers_off_bookie", "repair_job_succeeded"} <= outcome.seconds.keys()

            try:
                wait_for(repaired, timeout=REPAIR_TIMEOUT, what=f"{len(ledgers)} ledgers repaired off {bookie}",
                         interval=5.0)
            finally:
                say(f"big bookie: {json.dumps(outcome.figures())} ({outcome.left_on_bookie} still on {bookie})")
            outcome.markers_left = len(UnderReplication(session).ledger_ids())
            stored = index.read_all(ledgers)
            outcome.still_naming_bookie = sum(1 for found in stored.values()
                                              if found is None or ids[bookie] in found[0].bookies())
            wait_for(lambda: (cluster.get("bookie", "-n", NAMESPACE, bookie).get("status") or {}).get("phase")
                     == "Running", timeout=600, what=f"{bookie} replaced and Running", interval=2.0)
            return outcome
        finally:
            say(f"deleting the {len(ledgers)} ledgers")
            delete_ledgers(session, ledgers)
