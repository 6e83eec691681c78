"""One Ledger pass end to end, in process: observe against real ZooKeeper and a fake API, decide, act."""

from __future__ import annotations

import copy
from typing import Any

from bookfleet.kube import ledgers
from bookfleet.kube.context import OperatorContext
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import MetadataStore

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

    def patch_status(self, plural: str, namespace: str, name: str, status: dict) -> None:
        stored = self.objects[plural]
        stored["status"] = {**(stored.get("status") or {}), **status}

    def post_event(self, involved: dict, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(reason)


def test_a_stale_copy_of_the_ledger_never_creates_it_twice(zk_connect, zk):
    """A timer may hand over a copy older than the last pass's status patch: creation reads the Ledger afresh, or it
    would reserve a second id and create a second ledger."""
    zk.create(zkpaths.available("b1:3181"), b'{"bookie_id": "b1:3181", "address": "127.0.0.1:1"}', makepath=True,
              ephemeral=True)
    api = FakeApi(zk_connect)
    ctx = OperatorContext(api)  # type: ignore[arg-type]
    try:
        for _ in range(2):
            ledgers.sync(ctx, copy.deepcopy(LEDGER), lambda key: ())  # the copy from before any status
    finally:
        ctx.close()
    status = api.objects["ledgers"]["status"]
    assert MetadataStore(zk).ledger_ids() == [status["ledgerId"]]
    assert status["state"] == "OPEN" and api.events == ["Created"]
