"""The operator's caches (kube/runtime/informers.py) against the API emulator: a re-list after a lost watch forgets what
went meanwhile and wakes only for what changed; a kind the server does not serve is empty, not a wait."""

from __future__ import annotations

import threading
import time

import pytest
from kubernetes.client.exceptions import ApiException

from bookfleet.kube.runtime import api, informers
from tests.emulator import EmulatorThread
from tests.fixtures.kube import NS

LABELS = {"app": "informed"}


def pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": LABELS},
            "spec": {"containers": [{"name": "c", "image": "none"}]}}


class BlippingApi(api.KubeApi):
    """The first watch request fails after `meanwhile()` ran, as a connection lost to the API server would."""

    def __init__(self, meanwhile):
        super().__init__()
        self.meanwhile, self.blipped = meanwhile, threading.Event()

    def watch(self, *args, **kwargs):
        if not self.blipped.is_set():
            self.meanwhile()
            self.blipped.set()
            raise ApiException(status=500, reason="connection lost")
        return super().watch(*args, **kwargs)


def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_relist_forgets_what_was_deleted_unwatched_and_wakes_only_for_what_changed(kube: EmulatorThread):
    api.load_config(str(kube.kubeconfig))
    for name in ("kept", "deleted", "changed"):
        kube.create("pods", pod(name), NS)

    def meanwhile() -> None:
        kube.delete("pods", NS, "deleted")
        kube.patch("pods", NS, "changed", {"metadata": {"annotations": {"touched": "yes"}}})
    woken: list[str] = []
    informer = informers.Informer(BlippingApi(meanwhile), api.CORE, "pods", LABELS, [NS],
                                  lambda body, deleted: woken.append(body["metadata"]["name"]))
    informer.start()
    try:
        wait_for(lambda: len(woken) >= 5)  # the first list's 3, the re-list's 2
        assert informer.get(NS, "deleted") is None
        assert informer.get(NS, "changed")["metadata"]["annotations"] == {"touched": "yes"}
        assert informer.get(NS, "kept") is not None
        time.sleep(0.5)
        assert sorted(woken[:3]) == ["changed", "deleted", "kept"]
        assert sorted(woken[3:]) == ["changed", "deleted"]  # not "kept": a re-list wakes no loop for nothing
    finally:
        informer.stop()


def test_a_store_that_keeps_only_versions_still_hands_whole_bodies_on_and_forgets_deletions_in_a_relist(
        kube: EmulatorThread):
    """Ledgers' informer keeps only names and versions (the feed keeps its own view of 100,000 of them): whoever is
    told still gets the whole object, and a re-list still tells a deletion made while no watch ran."""
    api.load_config(str(kube.kubeconfig))
    for name in ("kept", "deleted"):
        kube.create("pods", pod(name), NS)

    def meanwhile() -> None:
        kube.delete("pods", NS, "deleted")
    seen: list[tuple[str, bool, bool]] = []
    informer = informers.Informer(BlippingApi(meanwhile), api.CORE, "pods", LABELS, [NS], lambda body, deleted: (
        seen.append((body["metadata"]["name"], "spec" in body, deleted))), versions_only=True)
    informer.start()
    try:
        wait_for(lambda: len(seen) >= 3)  # the first list's two, then the re-list's deletion
        assert sorted(seen[:2]) == [("deleted", True, False), ("kept", True, False)]
        assert seen[2] == ("deleted", False, True)  # its kept identity is what is handed on
        assert informer.get(NS, "deleted") is None
        kept = informer.get(NS, "kept")
        version = kept["metadata"]["resourceVersion"]
        assert kept == {"metadata": {"namespace": NS, "name": "kept", "resourceVersion": version}}
        kube.patch("pods", NS, "kept", {"metadata": {"annotations": {"touched": "yes"}}})
        wait_for(lambda: len(seen) >= 4)
        assert seen[3] == ("kept", True, False)
    finally:
        informer.stop()


def test_a_kind_the_server_does_not_serve_is_empty_at_once(kube: EmulatorThread):
    api.load_config(str(kube.kubeconfig))
    informer = informers.Informer(api.KubeApi(), api.SPARK, "sparkapplications", LABELS, [NS],
                                  indexes={"name": lambda body: body["metadata"]["name"]})
    informer.start()
    try:
        started = time.monotonic()
        assert informer.get(NS, "repair") is None
        assert informer.indexed("name", "repair") == []
        assert time.monotonic() - started < 10  # no wait for a list that cannot come (SYNC_TIMEOUT is 120 s)
    finally:
        informer.stop()


def test_objects_are_found_by_their_index_keys_as_they_change_go_and_come_back_in_a_relist(kube: EmulatorThread):
    """The index is kept with the store (a lookup scans nothing): an object whose key changes moves, a deleted one
    goes, and a re-list after a lost watch files what it finds afresh."""
    api.load_config(str(kube.kubeconfig))
    for name in ("a-1", "a-2", "b-1"):
        kube.create("pods", {**pod(name), "metadata": {**pod(name)["metadata"], "annotations": {"group": name[0]}}}, NS)

    def meanwhile() -> None:  # while the first watch is lost
        kube.delete("pods", NS, "a-2")
    group = lambda body: (body["metadata"].get("annotations") or {}).get("group")  # noqa: E731
    informer = informers.Informer(BlippingApi(meanwhile), api.CORE, "pods", LABELS, [NS],
                                  indexes={"group": group, "name": lambda body: body["metadata"]["name"]})
    names = lambda key: sorted(body["metadata"]["name"] for body in informer.indexed("group", key))  # noqa: E731
    informer.start()
    try:
        wait_for(lambda: names("a") == ["a-1"] and names("b") == ["b-1"])  # the re-list forgot a-2
        kube.patch("pods", NS, "a-1", {"metadata": {"annotations": {"group": "b"}}})
        wait_for(lambda: names("b") == ["a-1", "b-1"])
        assert names("a") == []
        kube.delete("pods", NS, "b-1")
        wait_for(lambda: names("b") == ["a-1"])
        assert [body["metadata"]["name"] for body in informer.indexed("name", "a-1")] == ["a-1"]
        assert informer.indexed("name", "b-1") == []
    finally:
        informer.stop()


class SlowListApi(api.KubeApi):
    """The first list answers after a second, as a loaded API server's would at the operator's start-up."""

    def list_page(self, *args, **kwargs):
        time.sleep(1.0)
        return super().list_page(*args, **kwargs)


def test_a_lookup_by_index_before_the_first_list_waits_for_it_instead_of_finding_nothing(kube: EmulatorThread):
    """"Nothing under this key" must mean none exist: a BookieCluster pass at start-up that found no Bookies would
    decide on a cluster without bookies (its status would say 0 of them ready)."""
    api.load_config(str(kube.kubeconfig))
    kube.create("pods", pod("a-1"), NS)
    informer = informers.Informer(SlowListApi(), api.CORE, "pods", LABELS, [NS],
                                  indexes={"name": lambda body: body["metadata"]["name"]})
    informer.start()
    try:
        assert [body["metadata"]["name"] for body in informer.indexed("name", "a-1")] == ["a-1"]
    finally:
        informer.stop()


def test_a_store_that_keeps_only_versions_takes_no_indexes():
    with pytest.raises(ValueError, match="no bodies to index"):
        informers.Informer(api.KubeApi(), api.CUSTOM, "ledgers", {}, [NS], versions_only=True,
                           indexes={"name": lambda body: body["metadata"]["name"]})


class DownApi(api.KubeApi):
    """An API server that answers every list with 503, until the list after `up_after` failures."""

    def __init__(self, up_after: int):
        super().__init__()
        self.up_after, self.lists = up_after, 0

    def list_page(self, *args, **kwargs):
        self.lists += 1
        if self.lists <= self.up_after:
            raise ApiException(status=503, reason="unavailable")
        return {"metadata": {"resourceVersion": "1"}, "items": []}

    def watch(self, *args, **kwargs):
        raise ApiException(status=410, reason="expired")


def test_an_informer_lists_again_after_a_growing_jittered_wait_and_starts_over_once_a_list_succeeds():
    """Flat 2 s retries had every informer of every operator hammer an API server that came back; now each failure
    in a row doubles the wait (up to a minute), drawn at random from its upper half."""
    waits: list[float] = []
    informer = informers.Informer(DownApi(up_after=9), api.CORE, "pods", LABELS, [NS])

    def wait(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 11:
            informer._stopped.set()

    informer._stopped.wait = wait
    informer._run(NS)
    bounds = [(0.5, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 32), (30, 60), (30, 60), (30, 60),  # nine failed lists
              (0.5, 1), (0.5, 1)]  # a list came through: a watch's 410 waits the shortest again
    assert [first <= wait <= longest for wait, (first, longest) in zip(waits, bounds, strict=True)] == [True] * 11
    assert len(set(waits[6:9])) == 3  # jittered: capped waits still differ


def test_relist_delays_double_to_a_cap_within_the_upper_half_of_each():
    assert [informers.relist_delay(failures, 0.0) for failures in (1, 2, 3, 7, 8, 20)] == [0.5, 1, 2, 30, 30, 30]
    assert [informers.relist_delay(failures, 0.999999) for failures in (1, 7)] == pytest.approx([1, 60])
