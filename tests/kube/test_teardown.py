"""`bookfleet delete-cluster` (the chart's pre-delete hook) against the emulator: it never waits for ever, holds
one page of Ledgers at a time, and the cluster's volumes stay unless its whenDeleted policy says Delete."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from bookfleet.kube import resources
from bookfleet.kube.models import Bookie, BookieCluster
from bookfleet.kube.reconcilers import teardown
from bookfleet.kube.runtime.api import PLURALS, KubeApi
from tests.emulator import EmulatorThread
from tests.operatorbench import teardown as teardown_bench

NS = "default"
REPO = Path(__file__).resolve().parents[2]


def delete_cluster(kube: EmulatorThread, timeout: float) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "bookfleet", "delete-cluster", "bk", "--namespace", NS, "--timeout", str(timeout),
         "--kubeconfig", str(kube.kubeconfig)],
        capture_output=True, text=True, timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def create_fleet(kube: EmulatorThread, finalizers: list[str], when_deleted: str = "Retain") -> None:
    """A cluster, one Bookie and a Ledger of it (and a Ledger of another cluster) as an operator leaves them (kopf's
    finalizer while it runs their loops), the Bookie's pod and claims as bookies.py makes them."""
    manifest = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "BookieCluster",
                "metadata": {"name": "bk", "namespace": NS, "finalizers": finalizers},
                "spec": {"replicas": 1, "zookeeper": "zk:2181",
                         "persistentVolumeClaimRetentionPolicy": {"whenDeleted": when_deleted}}}
    cluster = BookieCluster.model_validate(kube.create("bookieclusters", manifest))
    (bookie,) = resources.bookies_for_cluster(cluster)
    bookie["metadata"]["finalizers"] = finalizers
    created = Bookie.model_validate(kube.create("bookies", bookie))
    for obj in (resources.bookie_pod(cluster, created), *resources.bookie_pvcs(cluster, created)):
        kube.create(PLURALS[obj["kind"]], obj)
    for ledger, of_cluster in (("bk-ledger", "bk"), ("other-ledger", "other")):
        kube.create("ledgers", {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger",
                                "metadata": {"name": ledger, "namespace": NS, "finalizers": finalizers},
                                "spec": {"cluster": of_cluster}})


def create_ledgers(kube: EmulatorThread, count: int, finalizers: list[str]) -> None:
    """`count` Ledgers, two in three of them the cluster bk's (the rest another's), every other one with
    `finalizers`."""
    for number in range(count):
        kube.create("ledgers", {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger",
                                "metadata": {"name": f"bk-{number:05}", "namespace": NS,
                                             "finalizers": finalizers if number % 2 else []},
                                "spec": {"cluster": "bk" if number % 3 else "other"}})


def left(kube: EmulatorThread) -> dict[str, list[str]]:
    return {plural: sorted(o["metadata"]["name"] for o in kube.list(plural, NS))
            for plural in ("bookieclusters", "bookies", "ledgers", "pods", "persistentvolumeclaims")}


def api_of(kube: EmulatorThread) -> KubeApi:
    return KubeApi(kubernetes.config.new_client_from_config(config_file=str(kube.kubeconfig)))


def test_without_an_operator_the_finalizers_are_released_and_the_volumes_kept(kube):
    """kopf's finalizer (left by an operator before this one, which holds none) guards no work: released at once."""
    create_fleet(kube, [teardown.FINALIZER])
    assert "deleted" in delete_cluster(kube, timeout=0.5)
    assert left(kube) == {"bookieclusters": [], "bookies": [], "ledgers": ["other-ledger"], "pods": [],
                          "persistentvolumeclaims": ["bk-0-journal", "bk-0-ledgers"]}
    assert "does not exist" in delete_cluster(kube, timeout=0.5)


@pytest.mark.parametrize(("when_deleted", "claims"), [("Retain", ["bk-0-journal", "bk-0-ledgers"]), ("Delete", [])])
def test_a_cluster_goes_with_its_bookies_and_its_volumes_follow_the_policy(kube, when_deleted, claims):
    create_fleet(kube, [], when_deleted)
    assert "deleted" in delete_cluster(kube, timeout=30)
    assert left(kube) == {"bookieclusters": [], "bookies": [], "ledgers": ["other-ledger"], "pods": [],
                          "persistentvolumeclaims": claims}


def test_the_ledgers_are_read_a_page_at_a_time_and_never_listed_again(kube):
    """The uninstall at scale: the Ledgers are listed once, in pages of 500 (never all held at once), and not again
    while the teardown waits for a cluster another finalizer holds."""
    create_fleet(kube, [teardown.FINALIZER])
    create_ledgers(kube, 1_200, [teardown.FINALIZER])
    kube.patch("bookieclusters", NS, "bk", {"metadata": {"finalizers": [teardown.FINALIZER, "example.com/held"]}})
    assert teardown.delete_cluster(api_of(kube), NS, "bk", timeout=0.3, interval=0.05) is teardown.Teardown.HELD
    assert kube.emulator.list_requests["ledgers"] == 3  # 1,202 Ledgers: three pages, once
    assert sorted(o["metadata"]["name"] for o in kube.list("ledgers", NS)) == sorted(
        ["other-ledger", *(f"bk-{number:05}" for number in range(0, 1_200, 3))])
    assert kube.get("bookieclusters", NS, "bk")["metadata"]["finalizers"] == ["example.com/held"]


class WeakLedger(dict):
    """A Ledger as a LIST page carries it, weakly referenceable: whether something still holds it can be seen."""


class WatchedPages(KubeApi):
    """Hands out each LIST page's Ledgers and, as each next page arrives, counts those of pages before the previous
    one still alive: what a teardown holds of the pages it is done with (the caller still has the previous one)."""

    def __init__(self, kube: EmulatorThread) -> None:
        super().__init__(api_of(kube).client)
        self.handed: list[list[weakref.ref]] = []
        self.held_back: list[int] = []

    def pages(self, *args, **kwargs) -> Iterator[list[dict]]:
        for page in super().pages(*args, **kwargs):
            gc.collect()
            self.held_back.append(sum(ledger() is not None for done in self.handed[:-1] for ledger in done))
            ledgers = [WeakLedger(ledger) for ledger in page]
            self.handed.append([weakref.ref(ledger) for ledger in ledgers])
            yield ledgers


def test_the_teardown_holds_no_page_it_is_done_with(kube):
    """The hook's memory is one page of Ledgers whatever their count (100,000 inside its 256 MiB): no Ledger of a
    page deleted before the current one is still referenced when the next page comes."""
    create_ledgers(kube, 2_000, [teardown.FINALIZER])
    api = WatchedPages(kube)
    assert teardown.delete_ledgers(api, NS, "bk") == 1_333
    assert len(api.held_back) == 4 and api.held_back == [0, 0, 0, 0]
    assert not any(ledger() for done in api.handed for ledger in done)


class CompactingApi(KubeApi):
    """Before each page of a LIST, the store is compacted, as etcd is every 5 minutes under kube-apiserver: what a
    teardown paging through 100,000 Ledgers for longer than that meets."""

    def __init__(self, kube: EmulatorThread) -> None:
        super().__init__(api_of(kube).client)
        self.kube = kube

    def list_page(self, *args, **kwargs) -> dict:
        self.kube.call(self.kube.emulator.compact)
        return super().list_page(*args, **kwargs)


def test_a_teardown_outliving_its_lists_snapshot_goes_on_with_the_rest(kube):
    """Each page's continue token expires (410 Expired) by the time it is used: the teardown goes on with the token
    the answer carries, deletes every Ledger of its cluster and no other's (it failed with ApiException 410 once the
    bench's 20,000 Ledgers took longer than the compaction interval)."""
    create_fleet(kube, [])
    create_ledgers(kube, 1_200, [])
    assert teardown.delete_cluster(CompactingApi(kube), NS, "bk", timeout=30) is teardown.Teardown.DELETED
    assert sorted(o["metadata"]["name"] for o in kube.list("ledgers", NS)) == sorted(
        ["other-ledger", *(f"bk-{number:05}" for number in range(0, 1_200, 3))])


def test_the_uninstall_hook_deletes_every_ledger_of_its_cluster_on_a_real_api_server(api_server):
    """`bookfleet bench operator --teardown` at a test's scale: the hook's command, run as its Job runs it, against
    kube-apiserver with 300 Ledgers an older operator left finalized. What it cost against the Job's limits is the
    bench's to report, not a test's to assert (it failed a CI run on a loaded machine)."""
    report = teardown_bench.measure(api_server, 300)
    assert report["hook_said"] == f"BookieCluster {teardown_bench.CLUSTER}, its Bookies and its Ledgers deleted"
    assert report["ledgers_left"] == 0 and report["other_clusters_ledgers_kept"]
