"""The one act step: decided actions are applied in order, and a status patch calls the API only on a change."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from bookfleet.kube import resources
from bookfleet.kube.models import Bookie, BookieCluster
from bookfleet.kube.reconcilers import clusters, repairs
from bookfleet.kube.reconcilers.actions import (
    Apply,
    ApplyShared,
    Decision,
    Delete,
    Ensure,
    Patch,
    PatchStatus,
    PostEvent,
    act,
)
from bookfleet.kube.reconcilers.bookies import LaunchRepair
from bookfleet.kube.runtime.api import CUSTOM, FIELD_MANAGER, KubeApi
from bookfleet.kube.runtime.context import OperatorContext, patch_status
from bookfleet.polling import wait_for
from tests.fixtures.apiserver import install_crds


class RecordingApi:
    """Records the calls the actions make, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def ensure(self, manifest: dict) -> tuple[dict, bool]:
        self.calls.append(("ensure", manifest["metadata"]["name"]))
        return manifest, True

    def patch(self, api_version: str, plural: str, namespace: str | None, name: str, patch: dict) -> None:
        self.calls.append(("patch", plural, name, patch))

    def delete(self, api_version: str, plural: str, namespace: str | None, name: str) -> bool:
        self.calls.append(("delete", plural, name))
        return True

    def patch_status(self, plural: str, namespace: str, name: str, status: dict, resource_version=None) -> None:
        self.calls.append(("status", plural, name, status))

    def post_event(self, involved: dict, reason: str, message: str, warning: bool = False) -> None:
        self.calls.append(("event", involved["metadata"]["name"], reason, warning))


BODY = {"metadata": {"name": "bk-0", "namespace": "ns"}, "status": {"phase": "Running"}}


def test_actions_are_applied_in_the_decided_order() -> None:
    api = RecordingApi()
    body = {**BODY}
    act(OperatorContext(api), body, [  # type: ignore[arg-type]
        PatchStatus("bookies", {"phase": "Lost"}),
        Delete("v1", "pods", "ns", "bk-0"),
        Ensure({"metadata": {"name": "bk-0-journal"}}),
        Patch("v1", "pods", "ns", "bk-1", {"metadata": {"labels": {"a": "b"}}}),
        PostEvent("BookieLost", "pod bk-0 is gone", warning=True),
        PostEvent("Decommissioned", "bk-1 removed", involved={"metadata": {"name": "cluster"}}),
    ])
    assert api.calls == [
        ("status", "bookies", "bk-0", {"phase": "Lost"}),
        ("delete", "pods", "bk-0"),
        ("ensure", "bk-0-journal"),
        ("patch", "pods", "bk-1", {"metadata": {"labels": {"a": "b"}}}),
        ("event", "bk-0", "BookieLost", True),
        ("event", "cluster", "Decommissioned", False),
    ]
    assert body["status"] == {"phase": "Lost"}


def test_an_unchanged_status_makes_no_api_call() -> None:
    api = RecordingApi()
    act(OperatorContext(api), {**BODY}, [PatchStatus("bookies", {"phase": "Running"})])  # type: ignore[arg-type]
    assert api.calls == []


RUNNING_REPAIR = {"job": "bk-repair-0", "bookieId": "bk-0.bk:3181", "state": "Running", "finished": None}
"""A repair status as decided while its Job runs: `finished` null, so that a merge patch removes an older one."""


def test_a_status_as_the_server_merged_it_makes_no_api_call() -> None:
    """A null inside a field removes that key on the server, so the stored status lacks it: a restarted operator
    reading it back has nothing to write (it patched every Ledger with a running repair again)."""
    api = RecordingApi()
    stored = {key: value for key, value in RUNNING_REPAIR.items() if value is not None}
    body = {**BODY, "status": {"repair": stored}}
    act(OperatorContext(api), body, [PatchStatus("ledgers", {"repair": RUNNING_REPAIR})])  # type: ignore[arg-type]
    assert api.calls == []


def test_a_status_patch_leaves_the_body_as_the_server_merges_it() -> None:
    """Objects merge key by key (a repair's attempts kept while another key changes), a null removes its key."""
    api = RecordingApi()
    body = {**BODY, "status": {"phase": "Running", "repair": {**RUNNING_REPAIR, "finished": "2026-11-27T20:00:00Z"}}}
    act(OperatorContext(api), body, [PatchStatus("ledgers", {"repair": {"state": "Running", "finished": None}})])  # type: ignore[arg-type]
    assert body["status"] == {"phase": "Running", "repair": {"job": "bk-repair-0", "bookieId": "bk-0.bk:3181",
                                                             "state": "Running"}}


def test_a_status_the_real_api_server_stored_is_current_to_a_restarted_operator(api_server):
    """The server's own merge of the operator's patch, read back as a restarted operator lists it: the same changes
    again make no request (checked against kube-apiserver, not against our reading of RFC 7386)."""
    api = install_crds(api_server)
    body = api.create({"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger",
                       "metadata": {"name": "ledger", "namespace": "default"}, "spec": {"cluster": "bk"}})
    changes = {"state": "OPEN", "underReplicated": None,
               "repair": {**RUNNING_REPAIR, "started": "2026-11-27T20:00:00Z", "attempts": 1}}
    assert patch_status(OperatorContext(api), "ledgers", body, changes)
    restarted = api.get(CUSTOM, "ledgers", "default", "ledger")
    assert restarted is not None and restarted["status"] == body["status"]
    assert not patch_status(OperatorContext(api), "ledgers", restarted, changes)


def test_actions_compare_as_values() -> None:
    """decide() tests compare decided lists: equal actions are equal values."""
    assert [Delete("v1", "pods", "ns", "bk-0"), PostEvent("R", "m")] == [Delete("v1", "pods", "ns", "bk-0"),
                                                                         PostEvent("R", "m")]


@pytest.mark.parametrize(("recheck_in", "requeue", "retry", "due"), [
    (None, False, 10.0, None),  # only a change calls for a pass
    (4.0, False, 10.0, 4.0),  # the clock: the end of a delay
    (None, True, 10.0, 10.0),  # waits for what no watch reports: the loop's retry interval
    (4.0, True, 10.0, 4.0),  # whichever comes first
    (30.0, True, 10.0, 10.0),
    (None, True, None, None),  # a loop without a retry interval
])
def test_every_reconciler_is_due_again_at_its_recheck_or_its_retry_whichever_is_first(recheck_in, requeue, retry, due):
    moment = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    recheck_at = None if recheck_in is None else moment + dt.timedelta(seconds=recheck_in)
    assert Decision(recheck_at=recheck_at, requeue=requeue).due(moment, retry) == due


ANNOTATIONS_LIMIT = 256 * 1024
"""The API server's limit on an object's annotations, keys and values together (TotalAnnotationSizeLimitB)."""


class AdmittingApi:
    """Creates what the API server would admit: objects within the annotations limit."""

    def __init__(self) -> None:
        self.created: list[dict] = []
        self.events: list[str] = []

    def ensure(self, manifest: dict) -> tuple[dict, bool]:
        annotations = manifest["metadata"].get("annotations") or {}
        if sum(len(key) + len(value) for key, value in annotations.items()) > ANNOTATIONS_LIMIT:
            raise ApiException(status=422, reason="metadata.annotations: Too long: must have at most 262144 bytes")
        self.created.append(manifest)
        return manifest, True

    def post_event(self, involved: dict, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(f"{reason}: {message}")


@pytest.mark.parametrize("launcher", ["job", "sparkapplication"])
def test_a_repair_of_a_bookie_with_more_ledgers_than_an_annotation_holds_is_created(monkeypatch, launcher):
    """50,000 ledger ids would take ~390 KiB of annotations: the ledgers reach the repair through the markers in
    ZooKeeper, so the Job is the same size whatever the bookie held."""
    ledgers = list(range(10**6, 10**6 + 50_000))
    monkeypatch.setattr(repairs, "mark_lost_bookie", lambda zk, bookie_id: ledgers)
    cluster = BookieCluster.model_validate({
        "metadata": {"name": "bk", "namespace": "ns", "uid": "c1"},
        "spec": {"zookeeper": "zk:2181", "autoRecovery": {"repair": {"launcher": launcher}}}})
    (bookie,) = [Bookie.model_validate({**b, "metadata": {**b["metadata"], "uid": "b0"}})
                 for b in resources.bookies_for_cluster(cluster)[:1]]
    api = AdmittingApi()
    ctx = OperatorContext(api)  # type: ignore[arg-type]
    monkeypatch.setattr(ctx, "zk", lambda target: None)
    since = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    act(ctx, {}, [LaunchRepair(cluster, bookie, since, 0)])
    (job,) = api.created
    assert repairs.bookie_key(job) == ("ns", "bk", bookie.spec.bookie_id)
    assert str(ledgers[-1]) not in json.dumps(job)
    assert api.events == [f"RepairLaunched: {job['kind']} {job['metadata']['name']} repairs 50000 ledger(s) "
                          "(attempt 1)"]


def test_apply_brings_an_object_an_older_operator_made_up_to_date(kube):
    """Over HTTP (the emulator): a Service created by an earlier version, with another port, becomes what the current
    spec builds after one pass's Apply; a missing one is created."""
    api = KubeApi(kubernetes.config.new_client_from_config(config_file=str(kube.kubeconfig)))
    stored = kube.create("bookieclusters", {"apiVersion": "bookfleet.io/v1alpha1", "kind": "BookieCluster",
                                            "metadata": {"name": "bk", "namespace": "default"},
                                            "spec": {"zookeeper": "zk:2181", "bookie": {"httpPort": 8080}}})
    cluster = BookieCluster.model_validate(stored)
    service, budget = resources.bookies_service(cluster), resources.bookie_disruption_budget(cluster)
    old = json.loads(json.dumps(service))
    old["spec"]["ports"][1]["port"] = 8000
    api.create(old)
    ctx = OperatorContext(api)
    act(ctx, stored, [Apply(service), Apply(budget)])
    live = api.get("v1", "services", "default", "bk-bookies")
    assert [p["port"] for p in live["spec"]["ports"]] == [3181, 8080]
    assert api.get("policy/v1", "poddisruptionbudgets", "default", "bk-bookies")["spec"]["minAvailable"] == 2


class ApplyRecorder:
    """A KubeApi whose server-side applies are recorded as (kind, field manager)."""

    def __init__(self, api: KubeApi) -> None:
        self.api, self.applies = api, []

    def apply(self, manifest: dict, manager: str = FIELD_MANAGER) -> dict:
        self.applies.append((manifest["kind"], manager))
        return self.api.apply(manifest, manager)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)


def test_a_repair_account_shared_by_two_clusters_goes_with_the_last_of_them(api_server):
    """The repair ServiceAccount, Role and RoleBinding each cluster of a namespace applies: each cluster is one of their
    owners, so on a real API server the garbage collector keeps them while one cluster is left and deletes them with
    the last (they outlived every cluster before). A pass that finds them claimed applies each once."""
    recorder = ApplyRecorder(install_crds(api_server))
    account = [("serviceaccounts", "v1"), ("roles", "rbac.authorization.k8s.io/v1"),
               ("rolebindings", "rbac.authorization.k8s.io/v1")]
    uids = {}
    for name in ("first", "second"):
        body = recorder.create({"apiVersion": "bookfleet.io/v1alpha1", "kind": "BookieCluster",
                                "metadata": {"name": name, "namespace": "default"}, "spec": {"zookeeper": "zk:2181"}})
        uids[name] = body["metadata"]["uid"]
        act(OperatorContext(recorder), body, clusters.apply_owned_objects(BookieCluster.model_validate(body)))

    def owners() -> set[tuple[str, ...] | None]:
        """The owners' names of each object of the account (None: deleted), as a set: one member when all agree."""
        found = [recorder.get(version, plural, "default", "bookfleet-repair") for plural, version in account]
        return {None if obj is None else tuple(sorted(o["name"] for o in obj["metadata"].get("ownerReferences", [])))
                for obj in found}

    assert owners() == {("first", "second")}
    recorder.applies.clear()
    second = recorder.get(CUSTOM, "bookieclusters", "default", "second")
    act(OperatorContext(recorder), second, clusters.apply_owned_objects(BookieCluster.model_validate(second)))
    assert f"{FIELD_MANAGER}/{uids['second']}" not in {manager for _, manager in recorder.applies}

    recorder.delete(CUSTOM, "bookieclusters", "default", "first")
    wait_for(lambda: owners() == {("second",)}, 60,
             "the first cluster's references dropped by the garbage collector, the account kept", interval=0.5)
    recorder.delete(CUSTOM, "bookieclusters", "default", "second")
    wait_for(lambda: owners() == {None}, 60, "the repair account deleted with the last cluster", interval=0.5)


class StoringApi(RecordingApi):
    """Also answers server-side applies as for objects stored with `labels`, recording each one's field manager."""

    def __init__(self, labels: dict[str, str]) -> None:
        super().__init__()
        self.labels = labels

    def apply(self, manifest: dict, manager: str = FIELD_MANAGER) -> dict:
        self.calls.append(("apply", manager))
        metadata = manifest["metadata"]
        return {**manifest, "metadata": {**metadata, "labels": {**self.labels, **(metadata.get("labels") or {})}}}


@pytest.mark.parametrize(("labels", "claimed"), [({}, True), ({resources.LABEL_MANAGED_BY: "bookfleet-operator"}, True),
                                                 ({resources.LABEL_MANAGED_BY: "Helm"}, False)])
def test_a_shared_object_another_tool_manages_is_left_to_it(labels, claimed) -> None:
    """The chart makes the repair account of its own release (labelled managed-by Helm): a cluster naming it never
    becomes one of its owners, or the garbage collector would delete Helm's objects with the last cluster."""
    api = StoringApi(labels)
    cluster = BookieCluster.model_validate({"metadata": {"name": "bk", "namespace": "ns", "uid": "u"},
                                            "spec": {"zookeeper": "zk:2181"}})
    act(OperatorContext(api), {}, [a for a in clusters.apply_owned_objects(cluster) if isinstance(a, ApplyShared)])  # type: ignore[arg-type]
    assert api.calls == [("apply", FIELD_MANAGER), *([("apply", f"{FIELD_MANAGER}/u")] if claimed else [])] * 3
