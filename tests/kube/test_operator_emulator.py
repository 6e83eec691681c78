"""The Kubernetes API emulator over HTTP: the semantics kopf and the kubernetes client rely on."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests import emulator as emulator_module

PODS = "/api/v1/namespaces/default/pods"
BOOKIES = "/apis/bookfleet.io/v1alpha1/namespaces/default/bookies"


def bookie(name: str, **labels: str) -> dict:
    return {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Bookie",
            "metadata": {"name": name, "labels": labels},
            "spec": {"cluster": "c", "bookieId": f"{name}:3181"}, "status": {"phase": "Ignored"}}


async def call(session: aiohttp.ClientSession, method: str, path: str, body=None,
               content_type: str = "application/json") -> tuple[int, dict]:
    async with session.request(method, path, data=None if body is None else json.dumps(body),
                               headers={"Content-Type": content_type}) as response:
        return response.status, await response.json()


async def watch(session: aiohttp.ClientSession, path: str, count: int, **params: str) -> list[dict]:
    events = []
    async with session.get(path, params={"watch": "true", **params}) as response:
        async for line in response.content:
            events.append(json.loads(line))
            if len(events) == count:
                break
    return events


@pytest.fixture
async def http(kube):
    async with aiohttp.ClientSession(kube.url) as session:
        yield session


async def test_objects_get_identity_versions_and_generation(http):
    status, created = await call(http, "POST", BOOKIES, bookie("b0"))
    meta = created["metadata"]
    assert status == 201 and (created["apiVersion"], created["kind"]) == ("bookfleet.io/v1alpha1", "Bookie")
    assert meta["uid"] and meta["creationTimestamp"] and meta["generation"] == 1 and int(meta["resourceVersion"]) > 0
    assert "status" not in created  # status is a subresource: ignored on create

    merge = "application/merge-patch+json"
    _, labelled = await call(http, "PATCH", f"{BOOKIES}/b0", {"metadata": {"labels": {"x": "y"}}}, merge)
    assert labelled["metadata"]["generation"] == 1
    assert int(labelled["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    _, changed = await call(http, "PATCH", f"{BOOKIES}/b0", {"spec": {"zone": "a"}, "status": {"phase": "X"}}, merge)
    assert changed["metadata"]["generation"] == 2 and "status" not in changed
    _, with_status = await call(http, "PATCH", f"{BOOKIES}/b0/status", {"status": {"phase": "Running"},
                                                                       "spec": {"zone": "b"}}, merge)
    assert with_status["status"] == {"phase": "Running"} and with_status["spec"]["zone"] == "a"
    assert with_status["metadata"]["uid"] == meta["uid"]


async def test_conflicts_and_failed_json_patch_tests(http):
    await call(http, "POST", BOOKIES, bookie("b0"))
    status, error = await call(http, "POST", BOOKIES, bookie("b0"))
    assert (status, error["reason"]) == (409, "AlreadyExists")
    patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": "0"},
             {"op": "add", "path": "/metadata/finalizers", "value": ["x"]}]
    status, error = await call(http, "PATCH", f"{BOOKIES}/b0", patch, "application/json-patch+json")
    assert status == 422 and "test failed" in error["message"]
    status, error = await call(http, "PATCH", f"{BOOKIES}/b0", {"metadata": {"resourceVersion": "1"}},
                               "application/merge-patch+json")
    assert status == 409
    status, error = await call(http, "GET", f"{BOOKIES}/missing")
    assert status == 404 and "missing" in error["message"]


async def test_watch_resumes_after_a_list_without_losing_or_replaying_events(http):
    await call(http, "POST", BOOKIES, bookie("b0"))
    _, listing = await call(http, "GET", BOOKIES)
    since = listing["metadata"]["resourceVersion"]
    await call(http, "POST", BOOKIES, bookie("b1"))  # between the list and the watch
    await call(http, "DELETE", f"{BOOKIES}/b0")
    events = await asyncio.wait_for(watch(http, BOOKIES, 2, resourceVersion=since), 5)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b1"), ("DELETED", "b0")]
    fresh = await asyncio.wait_for(watch(http, BOOKIES, 1), 5)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in fresh] == [("ADDED", "b1")]


async def test_watch_from_a_forgotten_version_is_gone(http, monkeypatch):
    monkeypatch.setattr(emulator_module, "HISTORY_LIMIT", 3)
    for i in range(5):
        await call(http, "POST", BOOKIES, bookie(f"b{i}"))
    [event] = await asyncio.wait_for(watch(http, BOOKIES, 1, resourceVersion="1"), 5)
    assert event["type"] == "ERROR" and event["object"]["code"] == 410


async def test_label_selectors_on_lists_and_watches(http):
    await call(http, "POST", BOOKIES, bookie("a", tier="x", zone="1"))
    await call(http, "POST", BOOKIES, bookie("b", tier="y"))
    await call(http, "POST", BOOKIES, bookie("c"))
    expectations = {"tier=x": ["a"], "tier!=x": ["b", "c"], "tier": ["a", "b"], "!tier": ["c"],
                    "tier in (x, y),!zone": ["b"], "tier notin (x)": ["b", "c"]}
    for selector, names in expectations.items():
        _, listing = await call(http, "GET", f"{BOOKIES}?labelSelector={selector}")
        assert sorted(i["metadata"]["name"] for i in listing["items"]) == names, selector
    events = await asyncio.wait_for(watch(http, BOOKIES, 1, labelSelector="tier=y"), 5)
    assert [e["object"]["metadata"]["name"] for e in events] == ["b"]
    status, error = await call(http, "GET", f"{BOOKIES}?labelSelector=tier in x")
    assert status == 400 and "labelSelector" in error["message"]


async def test_owner_deletion_cascades_and_finalizers_hold_deletion(http):
    _, owner = await call(http, "POST", BOOKIES, bookie("owner"))
    ref = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Bookie", "name": "owner", "uid": owner["metadata"]["uid"]}
    _, pod = await call(http, "POST", PODS, {"metadata": {"name": "p", "ownerReferences": [ref]}, "spec": {}})
    grandchild_ref = {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": pod["metadata"]["uid"]}
    await call(http, "POST", "/api/v1/namespaces/default/persistentvolumeclaims",
               {"metadata": {"name": "claim", "ownerReferences": [grandchild_ref], "finalizers": ["keep"]}})
    await call(http, "DELETE", f"{BOOKIES}/owner")
    assert (await call(http, "GET", f"{PODS}/p"))[0] == 404
    status, claim = await call(http, "GET", "/api/v1/namespaces/default/persistentvolumeclaims/claim")
    assert status == 200 and claim["metadata"]["deletionTimestamp"]
    await call(http, "PATCH", "/api/v1/namespaces/default/persistentvolumeclaims/claim",
               {"metadata": {"finalizers": None}}, "application/merge-patch+json")
    assert (await call(http, "GET", "/api/v1/namespaces/default/persistentvolumeclaims/claim"))[0] == 404
