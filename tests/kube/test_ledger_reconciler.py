"""One Ledger pass end to end, in process: observe against real ZooKeeper and a fake API, decide, act; and the
feed that wakes it (kube.runtime.ledgerfeed) on ZooKeeper changes."""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Any

import pytest

from bookfleet import polling
from bookfleet.kube.reconcilers import ledgers
from bookfleet.kube.reconcilers.teardown import FINALIZER
from bookfleet.kube.runtime import ledgerfeed
from bookfleet.kube.runtime.context import OperatorContext, ZooKeeperTarget
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import MetadataStore, new_metadata
from bookfleet.meta.registry import BookieInfo
from bookfleet.meta.underreplication import UnderReplication

LEDGER = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger", "metadata": {"name": "l", "namespace": "ns"},
          "spec": {"cluster": "bk", "ensembleSize": 1, "writeQuorum": 1, "ackQuorum": 1}}


class FakeApi:
    """The Ledger and its cluster, stored; status patches land on the stored copy, Events are recorded."""

    def __init__(self, zk_connect: str) -> None:
        cluster = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "BookieCluster",
                   "metadata": {"name": "bk", "namespace": "ns"}, "spec": {"replicas": 1, "zookeeper": zk_connect}}
        self.objects = {"ledgers": copy.deepcopy(LEDGER), "bookieclusters": cluster}
        self.events: list[str] = []

    def get(self, api_version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(plural))

    def patch_status(self, plural: str, namespace: str, name: str, status: dict, resource_version=None) -> None:
        stored = self.objects[plural]
        stored["status"] = {**(stored.get("status") or {}), **status}

    def patch(self, api_version: str, plural: str, namespace: str, name: str, patch: dict) -> None:
        self.objects[plural]["metadata"].update(patch["metadata"])

    def post_event(self, involved: dict, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(reason)


def sources(api: FakeApi) -> ledgers.LedgerSources:
    return ledgers.LedgerSources(cluster=lambda namespace, name: api.get("", "bookieclusters", namespace, name),
                                 repairs_of=lambda key: ())


def test_kopfs_finalizer_left_by_an_older_operator_is_released_at_the_first_pass(zk_connect, zk):
    """Older operators ran Ledgers through kopf, which finalized each; nothing else drops that finalizer now, and
    deleting such a Ledger would wait for ever."""
    store = MetadataStore(zk)
    ledger_id = store.create(new_metadata(["b1:3181"], 1, 1))
    api = FakeApi(zk_connect)
    api.objects["ledgers"]["spec"]["ledgerId"] = ledger_id
    api.objects["ledgers"]["metadata"]["finalizers"] = ["example.com/keep", FINALIZER]
    ctx = OperatorContext(api)  # type: ignore[arg-type]
    try:
        ledgers.reconcile(ctx, copy.deepcopy(api.objects["ledgers"]), sources(api))
    finally:
        ctx.close()
    assert api.objects["ledgers"]["metadata"]["finalizers"] == ["example.com/keep"]
    assert stored_status(api)["state"] == "OPEN"


def test_a_stale_copy_of_the_ledger_never_creates_it_twice(zk_connect, zk):
    """A timer may hand over a copy older than the last pass's status patch: creation reads the Ledger afresh, or it
    would reserve a second id and create a second ledger."""
    zk.create(zkpaths.available("b1:3181"), BookieInfo(bookie_id="b1:3181", address="127.0.0.1:1").encode(),
              makepath=True, ephemeral=True)
    api = FakeApi(zk_connect)
    ctx = OperatorContext(api)  # type: ignore[arg-type]
    try:
        for _ in range(2):
            ledgers.reconcile(ctx, copy.deepcopy(LEDGER), sources(api))  # the copy from before any status
    finally:
        ctx.close()
    status = api.objects["ledgers"]["status"]
    assert MetadataStore(zk).ledger_ids() == [status["ledgerId"]]
    assert status["state"] == "OPEN" and api.events == ["Created"]


@pytest.fixture
def feed_on(zk_connect):
    """A LedgerFeed over the FakeApi and real ZooKeeper, its resync and retry far away: only watches wake a Ledger."""
    with running_feed(zk_connect, retry=3600) as running:
        yield running


@contextlib.contextmanager
def running_feed(zk_connect: str, retry: float):
    api = FakeApi(zk_connect)
    ctx = OperatorContext(api, event_window=0)  # type: ignore[arg-type]  # counted Events posted at once
    passes: list[ledgerfeed.LedgerKey] = []

    def reconcile(key: ledgerfeed.LedgerKey, body: dict | None) -> float | None:
        passes.append(key)
        return ledgers.reconcile(ctx, body or api.get("", "ledgers", *key), ledgers.LedgerSources(
            lambda namespace, name: api.get("", "bookieclusters", namespace, name), lambda key: (),
            feed.metadata_watch, feed.records), retry=retry)

    feed = ledgerfeed.LedgerFeed(reconcile, lambda namespace, cluster: ZooKeeperTarget(zk_connect, namespace), ctx.zk,
                                 resync=3600, retry=retry)
    feed.start()
    try:
        with feed.acting("ns", "bk"):
            yield api, feed, passes
    finally:
        feed.stop()
        ctx.close()


def test_a_ledger_waiting_for_bookies_is_created_once_one_registers_without_waiting_for_the_resync(zk_connect, zk):
    """No watch reports a bookie registering; a Ledger refused for NotEnoughBookies used to wait for the cluster's
    resync (minutes). Its pass asks to be run again after the feed's retry interval."""
    with running_feed(zk_connect, retry=0.5) as (api, feed, _):
        feed.ledger_changed(copy.deepcopy(api.objects["ledgers"]))
        wait_for(lambda: any(c["reason"] == "NotEnoughBookies" for c in stored_status(api).get("conditions") or []),
                 30, "the Ledger refused for want of bookies")
        zk.create(zkpaths.available("b1"), BookieInfo(bookie_id="b1", address="127.0.0.1:3181").encode(),
                  makepath=True, ephemeral=True)
        wait_for(lambda: stored_status(api).get("state") == "OPEN", 30, "the Ledger created")


def test_zookeeper_changes_reach_the_ledger_status_without_a_timer(feed_on, zk):
    """A marker appearing and going, a DATA_LOSS record and a close each wake the Ledger's pass through a ZooKeeper
    watch (no timer, no resync), and each pass reads the records the feed's tree caches show; a Ledger nothing
    happened to gets no pass."""
    api, feed, passes = feed_on
    store = MetadataStore(zk)
    ledger_id = store.create(new_metadata(["b1:3181", "b2:3181"], 2, 2))
    api.objects["ledgers"]["spec"] = {"cluster": "bk", "ledgerId": ledger_id, "ensembleSize": 2, "writeQuorum": 2}
    api.objects["bookieclusters"]["spec"]["replicas"] = 3
    feed.watch_zookeeper(zookeeper_of(api))
    feed.ledger_changed(copy.deepcopy(api.objects["ledgers"]))
    wait_for(lambda: stored_status(api).get("state") == "OPEN", 30, "the first pass")
    UnderReplication(zk).mark(ledger_id, ["b2:3181"])
    wait_for(lambda: (stored_status(api).get("underReplicated") or {}).get("missingBookies") == ["b2:3181"], 30,
             "the marker in status")
    UnderReplication(zk).mark_data_loss(ledger_id, [3])
    wait_for(lambda: any(c["type"] == "DataLoss" and c["status"] == "True" for c in stored_status(api)["conditions"]),
             30, "DataLoss in status")
    metadata, version = store.read(ledger_id)
    store.update(ledger_id, metadata.with_closed(9, 90), version)
    status = wait_for(lambda: (s := stored_status(api)).get("state") == "CLOSED" and s, 30, "the close in status")
    assert status["lastEntryId"] == 9 and api.events.count("UnderReplicated") == 1
    under_replication = UnderReplication(zk)
    under_replication.clear(under_replication.marker(ledger_id))
    wait_for(lambda: not stored_status(api).get("underReplicated"), 30, "the marker gone from status")
    settled = len(passes)
    time.sleep(1)  # nothing changes: no pass (this asserts the absence of a timer, not a speed)
    assert len(passes) == settled and len(feed.queue) == 0


def zookeeper_of(api: FakeApi) -> ZooKeeperTarget:
    cluster = api.objects["bookieclusters"]
    return ZooKeeperTarget(cluster["spec"]["zookeeper"], cluster["metadata"]["namespace"])


def stored_status(api: FakeApi) -> dict:
    return api.objects["ledgers"].get("status") or {}


def wait_for(check, timeout: float, what: str):
    return polling.wait_for(check, timeout, what)
