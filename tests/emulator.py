"""A Kubernetes API server emulator for tests and benchmarks: kmock's scaffold plus the semantics kopf relies on.

kmock 0.8 serves discovery and errors; its stateful emulator lacks resource versions, watch resumption, label
selectors, owner-reference garbage collection and a separate /status. This store implements those (one global
resourceVersion counter, an event history for watches, 410 Gone when a watch asks for a forgotten version) and
keeps kmock's request parsing, discovery and error rendering. Pods never run here: a harness sets their status.

`EmulatorThread` runs it on a loopback port in a background thread and offers a synchronous API to tests.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import dataclasses
import datetime
import json
import re
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml

from bookfleet.kube.runtime.context import merge_patched

HISTORY_LIMIT = 50_000
"""Watch events kept for resumption; older resourceVersions get 410 Gone (the client re-lists)."""


@dataclasses.dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = False
    printer_columns: tuple[tuple[str, str, str, int], ...] = ()
    """(name, type, jsonPath, priority) of a CRD's additionalPrinterColumns: what `kubectl get` shows."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


BUILTIN_TYPES = [
    ResourceType("", "v1", "pods", "Pod", status_subresource=True),
    ResourceType("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", status_subresource=True),
    ResourceType("", "v1", "services", "Service", status_subresource=True),
    ResourceType("", "v1", "events", "Event"),
    ResourceType("", "v1", "configmaps", "ConfigMap"),
    ResourceType("", "v1", "secrets", "Secret"),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount"),
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, status_subresource=True),
    ResourceType("", "v1", "nodes", "Node", namespaced=False, status_subresource=True),
    ResourceType("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False, status_subresource=True),
    ResourceType("batch", "v1", "jobs", "Job", status_subresource=True),
    ResourceType("apps", "v1", "deployments", "Deployment", status_subresource=True),
    ResourceType("apps", "v1", "statefulsets", "StatefulSet", status_subresource=True),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
    ResourceType("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"),
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", status_subresource=True),
    ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                 namespaced=False, status_subresource=True),
    ResourceType("sparkoperator.k8s.io", "v1beta2", "sparkapplications", "SparkApplication", status_subresource=True),
]


CALL_TIMEOUT = 120.0
"""Seconds a caller waits for the emulator's loop, which on a loaded machine serves many watches at once."""


class KubernetesApiError(kmock.KubernetesError):
    pass


def _error(status: int, reason: str, message: str) -> KubernetesApiError:
    return KubernetesApiError(status=status, reason=reason, message=message, details={})


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- label selectors -------------------------------------------------------------------------------------------

_SELECTOR_TERM = re.compile(
    r"\s*(?:(?P<neg>!)\s*(?P<absent>[\w./-]+)"
    r"|(?P<setkey>[\w./-]+)\s+(?P<setop>in|notin)\s+\((?P<values>[^)]*)\)"
    r"|(?P<key>[\w./-]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[\w./-]*))?)\s*(?:,|$)"
)


def label_selector(selector: str) -> Callable[[dict[str, str]], bool]:
    """A predicate over labels for a Kubernetes label selector (=, ==, !=, in, notin, exists, !exists)."""
    checks: list[Callable[[dict[str, str]], bool]] = []
    position = 0
    while position < len(selector):
        match = _SELECTOR_TERM.match(selector, position)
        if not match or match.end() == position:
            raise _error(400, "BadRequest", f"unable to parse labelSelector {selector!r} at {position}")
        position = match.end()
        if match["absent"]:
            checks.append(lambda labels, k=match["absent"]: k not in labels)
        elif match["setkey"]:
            values = {v.strip() for v in match["values"].split(",") if v.strip()}
            inside = match["setop"] == "in"
            checks.append(lambda labels, k=match["setkey"], vs=values, i=inside: (labels.get(k) in vs) == i)
        elif match["op"] == "!=":
            checks.append(lambda labels, k=match["key"], v=match["value"]: labels.get(k) != v)
        elif match["op"]:
            checks.append(lambda labels, k=match["key"], v=match["value"]: labels.get(k) == v)
        else:
            checks.append(lambda labels, k=match["key"]: k in labels)
    return lambda labels: all(check(labels) for check in checks)


def _field_selector(selector: str) -> Callable[[dict], bool]:
    """Only metadata.name / metadata.namespace equality: what clients in this project send."""
    wanted: list[tuple[list[str], str, bool]] = []
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negate = "!=" in term
        field, value = re.split(r"!=|==|=", term, maxsplit=1)
        wanted.append((field.strip().split("."), value.strip(), negate))

    def matches(obj: dict) -> bool:
        for path, value, negate in wanted:
            current: Any = obj
            for part in path:
                current = current.get(part, "") if isinstance(current, dict) else ""
            if (str(current) == value) == negate:
                return False
        return True

    return matches


# --- patches -------------------------------------------------------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the operator reads the server's (also used for strategic merge: lists are
    replaced, never merged by key); the stored object shares nothing with the request's body. The real API server
    checks that reading (tests/kube/test_operator_actions.py)."""
    return copy.deepcopy(merge_patched(target, patch))


def with_owners_of(stored: dict, applied: dict) -> dict:
    """`applied` with the stored object's owner references it does not name added (applied ones win by uid)."""
    claimed = applied.get("metadata", {}).get("ownerReferences")
    if claimed is None:
        return applied
    named = {ref["uid"] for ref in claimed}
    kept = [ref for ref in stored["metadata"].get("ownerReferences") or [] if ref["uid"] not in named]
    return {**applied, "metadata": {**applied["metadata"], "ownerReferences": [*kept, *claimed]}}


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise _error(422, "Invalid", f"JSON-patch path {path!r} does not start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _walk(doc: Any, parts: list[str], path: str) -> Any:
    for part in parts:
        try:
            doc = doc[int(part)] if isinstance(doc, list) else doc[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise _error(422, "Invalid", f"JSON-patch path {path!r} does not exist") from None
    return doc


def json_patch(document: dict, operations: list) -> dict:
    """RFC 6902 JSON patch; a failed `test` is 422 Unprocessable like the real API server."""
    doc = copy.deepcopy(document)
    for op in operations:
        kind, path = op.get("op"), op.get("path", "")
        parts = _pointer(path)
        parent, last = _walk(doc, parts[:-1], path), parts[-1]
        if kind == "test":
            if _walk(doc, parts, path) != op.get("value"):
                raise _error(422, "Invalid", f"JSON-patch test failed at {path!r}")
        elif kind in ("add", "replace"):
            if kind == "replace":
                _walk(doc, parts, path)
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(index, op.get("value"))
                else:
                    parent[index] = op.get("value")
            else:
                parent[last] = op.get("value")
        elif kind == "remove":
            _walk(doc, parts, path)
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise _error(422, "Invalid", f"JSON-patch op {kind!r} is not supported")
    return doc


# --- the emulator ----------------------------------------------------------------------------------------------

Key = tuple[str, str, str, str]  # group, plural, namespace ("" if cluster-scoped), name


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesScaffold):
    """In-memory API server state behind kmock's discovery; see the module docstring for what it adds."""

    types: dict[tuple[str, str, str], ResourceType] = attrs.field(factory=dict, init=False)
    objects: dict[Key, dict] = attrs.field(factory=dict, init=False)
    history: collections.deque[tuple[int, tuple[str, str], dict]] = attrs.field(factory=collections.deque, init=False)
    forgotten_version: int = attrs.field(default=0, init=False)
    version: int = attrs.field(default=0, init=False)
    list_requests: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)
    """LIST requests served, by plural (a page counts as one): what a test of paging and re-listing counts."""
    _tick: asyncio.Event | None = attrs.field(default=None, init=False)
    closing: bool = attrs.field(default=False, init=False)
    """Set by `end_watches`: every watch ends its response now."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for rtype in BUILTIN_TYPES:
            self.add_type(rtype)
        self.create(self.types[("", "v1", "namespaces")], None, {"metadata": {"name": "default"}})

    def add_type(self, rtype: ResourceType) -> None:
        self.types[(rtype.group, rtype.version, rtype.plural)] = rtype
        self.resources[kmock.resource(rtype.group, rtype.version, rtype.plural)] = kmock.ResourceInfo(
            kind=rtype.kind, namespaced=rtype.namespaced, singular=rtype.kind.lower(),
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            subresources={"status"} if rtype.status_subresource else set(),
        )

    def add_crd(self, crd: dict) -> None:
        """Serve the resource a CustomResourceDefinition declares (every version it lists)."""
        spec = crd.get("spec", {})
        for version in spec.get("versions", []):
            self.add_type(ResourceType(
                group=spec["group"], version=version["name"], plural=spec["names"]["plural"],
                kind=spec["names"]["kind"], namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                status_subresource="status" in version.get("subresources", {}),
                printer_columns=tuple((c["name"], c.get("type", "string"), c["jsonPath"], c.get("priority", 0))
                                      for c in version.get("additionalPrinterColumns", [])),
            ))

    # -- state changes (all callers hold the event loop; none of these await) --

    def compact(self) -> None:
        """Forget every version before the current one, as etcd's compaction (every 5 minutes under kube-apiserver)
        does: a watch from before gets 410 Gone, a list's continue token from before 410 Expired."""
        self.history.clear()
        self.forgotten_version = self.version

    def _record(self, rtype: ResourceType, kind: str, obj: dict) -> None:
        self.history.append((self.version, (rtype.group, rtype.plural), {"type": kind, "object": copy.deepcopy(obj)}))
        while len(self.history) > HISTORY_LIMIT:
            self.forgotten_version = self.history.popleft()[0]
        if self._tick is not None:
            self._tick.set()
            self._tick = None

    def _bump(self, obj: dict) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)

    def _key(self, rtype: ResourceType, namespace: str | None, name: str) -> Key:
        return (rtype.group, rtype.plural, (namespace or "") if rtype.namespaced else "", name)

    def create(self, rtype: ResourceType, namespace: str | None, body: Any) -> dict:
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise _error(400, "BadRequest", f"a {rtype.kind} needs a JSON object with metadata")
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        if rtype.namespaced:
            namespace = namespace or meta.get("namespace")
            if not namespace:
                raise _error(400, "BadRequest", f"a {rtype.kind} needs a namespace")
            if meta.get("namespace", namespace) != namespace:
                raise _error(400, "BadRequest", f"namespace {meta['namespace']!r} differs from the URL's {namespace!r}")
            meta["namespace"] = namespace
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _error(422, "Invalid", f"{rtype.kind}: metadata.name or metadata.generateName is required")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        key = self._key(rtype, namespace, meta["name"])
        if key in self.objects:
            raise _error(409, "AlreadyExists", f'{rtype.plural} "{meta["name"]}" already exists')
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        meta.pop("deletionTimestamp", None)
        if rtype.status_subresource:
            obj.pop("status", None)
        self._bump(obj)
        self.objects[key] = obj
        if rtype.plural == "customresourcedefinitions":
            self.add_crd(obj)
        self._record(rtype, "ADDED", obj)
        return obj

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> dict:
        try:
            return self.objects[self._key(rtype, namespace, name)]
        except KeyError:
            raise _error(404, "NotFound", f'{rtype.plural} "{name}" not found') from None

    def list(self, rtype: ResourceType, namespace: str | None, labels: str = "", fields: str = "") -> list[dict]:
        wanted_labels = label_selector(labels) if labels else None
        wanted_fields = _field_selector(fields) if fields else None
        return [
            obj for (group, plural, ns, _), obj in self.objects.items()
            if (group, plural) == (rtype.group, rtype.plural) and (not namespace or ns == namespace)
            and (wanted_labels is None or wanted_labels(obj["metadata"].get("labels") or {}))
            and (wanted_fields is None or wanted_fields(obj))
        ]

    def update(self, rtype: ResourceType, namespace: str | None, name: str,
               change: Callable[[dict], dict], subresource: str | None = None) -> dict:
        """Apply `change` to a copy; /status changes only status, the main object never changes status."""
        key = self._key(rtype, namespace, name)
        old = self.get(rtype, namespace, name)
        changed = change(copy.deepcopy(old))
        if not isinstance(changed, dict):
            raise _error(422, "Invalid", f"the patched {rtype.kind} is not an object")
        wanted_version = (changed.get("metadata") or {}).get("resourceVersion")
        if wanted_version and wanted_version != old["metadata"]["resourceVersion"]:
            raise _error(409, "Conflict", f'{rtype.plural} "{name}": resourceVersion {wanted_version} is stale')
        if subresource == "status":
            new = {**copy.deepcopy(old), "status": changed.get("status")}
            if new["status"] is None:
                del new["status"]
        else:
            new = changed
            if rtype.status_subresource:
                new.pop("status", None)
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
        meta = new.setdefault("metadata", {})
        for field in ("uid", "creationTimestamp", "resourceVersion", "generation", "name", "namespace"):
            if field in old["metadata"]:
                meta[field] = old["metadata"][field]
        if old["metadata"].get("deletionTimestamp"):
            meta["deletionTimestamp"] = old["metadata"]["deletionTimestamp"]
        new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
        if new == old:
            return old
        if _spec_of(new) != _spec_of(old):
            meta["generation"] = old["metadata"].get("generation", 1) + 1
        self._bump(new)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self.objects[key]
            self._record(rtype, "DELETED", new)
            self._collect_garbage(meta["uid"])
            return new
        self.objects[key] = new
        if rtype.plural == "customresourcedefinitions":
            self.add_crd(new)
        self._record(rtype, "MODIFIED", new)
        return new

    def delete(self, rtype: ResourceType, namespace: str | None, name: str) -> dict:
        obj = self.get(rtype, namespace, name)
        meta = obj["metadata"]
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                return self.update(rtype, namespace, name, _mark_deleted)
            return obj
        del self.objects[self._key(rtype, namespace, name)]
        obj = copy.deepcopy(obj)
        self._bump(obj)
        self._record(rtype, "DELETED", obj)
        self._collect_garbage(meta["uid"])
        return obj

    def _collect_garbage(self, owner_uid: str) -> None:
        """Background cascading deletion: whatever names the deleted object as an owner goes too."""
        for (group, plural, namespace, name), obj in list(self.objects.items()):
            owners = obj["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == owner_uid for ref in owners):
                rtype = next(t for t in self.types.values() if (t.group, t.plural) == (group, plural))
                if self._key(rtype, namespace, name) in self.objects:
                    self.delete(rtype, namespace, name)

    def events_since(self, since: int, group_plural: tuple[str, str] | None = None) -> list[tuple[int, dict]]:
        """Recorded events newer than `since` (optionally of one resource), oldest first."""
        newer: list[tuple[int, dict]] = []
        for version, resource, event in reversed(self.history):
            if version <= since:
                break
            if group_plural is None or resource == group_plural:
                newer.append((version, event))
        newer.reverse()
        return newer

    def end_watches(self) -> None:
        """End every open watch, before the server stops: a watch whose client was killed -9 would otherwise hold
        aiohttp's shutdown for its 60 s grace period, since nothing is written to find the connection gone."""
        self.closing = True
        if self._tick is not None:
            self._tick.set()
            self._tick = None

    async def wait_newer(self, since: int, timeout: float | None) -> None:
        """Return once something newer than `since` happened, or after `timeout` seconds."""
        if self.version > since or self.closing:
            return
        if self._tick is None:
            self._tick = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._tick.wait(), timeout)

    # -- HTTP --

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        try:
            return await super()._handle(request)
        except kmock.KubernetesError as exc:
            return await self._render_error(exc)

    async def _serve_version(self, request: kmock.Request) -> dict:
        listing = await super()._serve_version(request)
        listing["groupVersion"] = listing["groupVersion"].lstrip("/")  # the core group is "v1", not "/v1"
        return listing

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        request = await ApiRequest.parse(raw)
        if request is None:
            return await super().__call__(raw)  # discovery, /version and kmock's own reactions
        try:
            rtype = self.types.get((request.group, request.version, request.plural))
            if rtype is None:
                raise _error(404, "NotFound", f"the server could not find the requested resource {raw.path}")
            return await self._serve(request, rtype)
        except kmock.KubernetesError as exc:
            return await self._render_error(exc)

    async def _serve(self, request: ApiRequest, rtype: ResourceType) -> aiohttp.web.StreamResponse:
        method, name, namespace, params = request.method, request.name, request.namespace, request.params
        if method == "GET" and params.get("watch") in ("true", "1"):
            return await self._watch(request, rtype)
        as_table = "as=Table" in request.headers.get("Accept", "")
        if method == "GET" and name is None:
            items = self.list(rtype, namespace, params.get("labelSelector", ""), params.get("fieldSelector", ""))
            self.list_requests[rtype.plural] += 1
            if as_table:
                return _json(self._table(rtype, items))
            after = params.get("continue", "")
            if after and json.loads(after)[2] < self.forgotten_version:  # compacted: the rest from now, as etcd does
                fresh = json.dumps([*json.loads(after)[:2], self.version])
                return _json({"apiVersion": "v1", "kind": "Status", "metadata": {"continue": fresh}, "code": 410,
                              "status": "Failure", "reason": "Expired",
                              "message": "The provided continue parameter is too old to display a consistent list"
                                         " result."}, status=410)
            items, more = _page(items, int(params.get("limit") or 0), after, self.version)
            return _json({"apiVersion": rtype.api_version, "kind": f"{rtype.kind}List",
                          "metadata": {"resourceVersion": str(self.version)} | ({"continue": more} if more else {}),
                          "items": items})
        if method == "POST" and name is None:
            return _json(self.create(rtype, namespace, request.data), status=201)
        if name is None:
            raise _error(405, "MethodNotAllowed", f"{method} on a collection of {rtype.plural} is not supported")
        if method == "GET":
            found = self.get(rtype, namespace, name)
            return _json(self._table(rtype, [found]) if as_table else found)
        if method == "DELETE":
            return _json(self.delete(rtype, namespace, name))
        if method == "PUT":
            body = request.data
            return _json(self.update(rtype, namespace, name, lambda _: copy.deepcopy(body), request.subresource))
        if method == "PATCH":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            patch = request.data
            if content_type == "application/json-patch+json":
                if not isinstance(patch, list):
                    raise _error(400, "BadRequest", "a JSON patch must be a list of operations")
                change: Callable[[dict], dict] = lambda obj: json_patch(obj, patch)  # noqa: E731
            elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                change = lambda obj: merge_patch(obj, patch)  # noqa: E731
            elif content_type == "application/apply-patch+yaml":
                # Server-side apply, approximated: creates a missing object, else merges (lists replaced whole but
                # ownerReferences, merged by uid as the real one does, so owners claiming a shared object each keep
                # theirs); no field ownership, so a field dropped from the applied object is not removed.
                if not params.get("fieldManager"):
                    raise _error(422, "Invalid", "server-side apply needs a fieldManager")
                if self._key(rtype, namespace, name) not in self.objects:
                    return _json(self.create(rtype, namespace, patch), status=201)
                change = lambda obj: merge_patch(obj, with_owners_of(obj, patch))  # noqa: E731
            else:
                raise _error(415, "UnsupportedMediaType", f"patch content type {content_type!r} is not supported")
            return _json(self.update(rtype, namespace, name, change, request.subresource))
        raise _error(405, "MethodNotAllowed", f"{method} is not supported")

    def _table(self, rtype: ResourceType, items: list[dict]) -> dict:
        """What `kubectl get` asks for: a meta.k8s.io Table with the CRD's printer columns (or Name and Age)."""
        columns = rtype.printer_columns or (("Age", "date", ".metadata.creationTimestamp", 0),)
        definitions = [{"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}]
        definitions += [{"name": name, "type": type_, "format": "", "description": "", "priority": priority}
                        for name, type_, _, priority in columns]
        rows = [{"cells": [obj["metadata"]["name"]] + [_cell(obj, path, type_) for _, type_, path, _ in columns],
                 "object": {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                            "metadata": obj["metadata"]}} for obj in items]
        return {"apiVersion": "meta.k8s.io/v1", "kind": "Table", "metadata": {"resourceVersion": str(self.version)},
                "columnDefinitions": definitions, "rows": rows}

    async def _watch(self, request: ApiRequest, rtype: ResourceType) -> aiohttp.web.StreamResponse:
        params = request.params
        namespace, name = request.namespace, request.name
        wanted_labels = label_selector(params["labelSelector"]) if params.get("labelSelector") else None
        wanted_fields = _field_selector(params["fieldSelector"]) if params.get("fieldSelector") else None

        def wanted(event: dict) -> bool:
            meta = event["object"]["metadata"]
            return ((not namespace or meta.get("namespace") == namespace) and (not name or meta["name"] == name)
                    and (wanted_labels is None or wanted_labels(meta.get("labels") or {}))
                    and (wanted_fields is None or wanted_fields(event["object"])))

        since = params.get("resourceVersion", "")
        if since in ("", "0"):
            initial = [{"type": "ADDED", "object": obj} for obj in self.list(rtype, namespace)]
            cursor = self.version
        elif not since.isdigit():
            raise _error(400, "BadRequest", f"resourceVersion {since!r} is not a number")
        elif int(since) < self.forgotten_version:
            initial, cursor = [_gone(since)], None
        else:
            initial, cursor = [], int(since)
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request.raw)
        timeout = float(params.get("timeoutSeconds") or 0) or None
        deadline = asyncio.get_running_loop().time() + timeout if timeout else None
        try:
            await _write_events(response, [event for event in initial if event["type"] == "ERROR" or wanted(event)])
            while cursor is not None and not self.closing:
                remaining = deadline - asyncio.get_running_loop().time() if deadline else None
                if remaining is not None and remaining <= 0:
                    break
                await self.wait_newer(cursor, remaining)
                events = self.events_since(cursor, (rtype.group, rtype.plural))
                cursor = self.version
                await _write_events(response, [event for _, event in events if wanted(event)])
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return response


@dataclasses.dataclass(frozen=True)
class ApiRequest:
    """A request for a resource path: /api/v1/... or /apis/GROUP/VERSION/[namespaces/NS/]PLURAL[/NAME[/SUB]]."""

    raw: aiohttp.web.BaseRequest
    method: str
    group: str
    version: str
    plural: str
    namespace: str | None
    name: str | None
    subresource: str | None
    params: dict[str, str]
    headers: dict[str, str]
    data: Any

    @classmethod
    async def parse(cls, raw: aiohttp.web.BaseRequest) -> ApiRequest | None:
        parts = raw.path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        body = await raw.read()
        try:
            data = json.loads(body) if body else None
        except ValueError:
            raise _error(400, "BadRequest", "the request body is not JSON") from None
        return cls(raw=raw, method=raw.method, group=group, version=version, plural=rest[0],
                   name=rest[1] if len(rest) > 1 else None, subresource="/".join(rest[2:]) or None,
                   namespace=namespace, params=dict(raw.query), headers=dict(raw.headers), data=data)


def _cell(obj: dict, path: str, type_: str) -> Any:
    """A printer column's value: a dotted jsonPath, dates shown as ages like the real API server does."""
    value: Any = obj
    for part in path.strip(".").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if type_ == "date" and isinstance(value, str):
        seconds = (datetime.datetime.now(datetime.UTC)
                   - datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))).total_seconds()
        return _age(seconds)
    if isinstance(value, list):
        return ",".join(map(str, value))
    return value


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(int(seconds), 0)}s"


def _page(items: list[dict], limit: int, after: str, version: int) -> tuple[list[dict], str]:
    """A LIST's page as the API server pages it (`limit`, `continue`): the items after the continue token, ordered
    by (namespace, name), and the token of the next page ("" on the last), which names the list's `version`."""
    if not limit and not after:
        return items, ""
    ordered = sorted(items, key=lambda obj: (obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))
    if after:
        last = tuple(json.loads(after)[:2])
        ordered = [obj for obj in ordered if (obj["metadata"].get("namespace", ""), obj["metadata"]["name"]) > last]
    if not limit or len(ordered) <= limit:
        return ordered, ""
    page = ordered[:limit]
    return page, json.dumps([page[-1]["metadata"].get("namespace", ""), page[-1]["metadata"]["name"], version])


def _mark_deleted(obj: dict) -> dict:
    obj["metadata"]["deletionTimestamp"] = _now()
    return obj


def _spec_of(obj: dict) -> dict:
    return {key: value for key, value in obj.items() if key not in ("metadata", "status")}


def _gone(since: str) -> dict:
    return {"type": "ERROR", "object": {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 410,
                                        "reason": "Expired", "message": f"too old resource version: {since}"}}


def _json(obj: Any, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.Response(text=json.dumps(obj), status=status, content_type="application/json")


async def _write_events(response: aiohttp.web.StreamResponse, events: list[dict]) -> None:
    if events:
        await response.write(b"".join(json.dumps(event).encode() + b"\n" for event in events))


# --- running it --------------------------------------------------------------------------------------------

class EmulatorThread:
    """The emulator on a loopback port in its own thread and event loop, with a synchronous API for harnesses."""

    def __init__(self) -> None:
        self.emulator = KubeEmulator()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="kube-emulator", daemon=True)
        self._server: kmock.Server | None = None
        self.url = ""
        self.kubeconfig: Path | None = None

    def __enter__(self) -> EmulatorThread:
        self._thread.start()
        self._server = kmock.Server(self.emulator)
        self.call(self._server.__aenter__)
        self.url = str(self._server.url).rstrip("/")
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self.call(self.emulator.end_watches)
        self.call(self._server.__aexit__, None, None, None)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` (sync or async) on the emulator's loop and return its result."""
        async def run() -> Any:
            result = fn(*args)
            return await result if asyncio.iscoroutine(result) else result

        try:
            return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=CALL_TIMEOUT)
        except TimeoutError:
            raise TimeoutError(f"the emulator did not run {fn.__name__} within {CALL_TIMEOUT:.0f}s") from None

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {"token": "emulator"}}],
            "contexts": [{"name": "emulator",
                          "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace}}],
        }
        path.write_text(yaml.safe_dump(config))
        self.kubeconfig = path
        return path

    def rtype(self, plural: str) -> ResourceType:
        """A served resource by plural name (e.g. "pods", "bookies")."""
        for rtype in list(self.emulator.types.values()):
            if rtype.plural == plural:
                return rtype
        raise KeyError(f"resource {plural!r} is not served by the emulator")

    def create(self, plural: str, body: dict, namespace: str | None = None) -> dict:
        return copy.deepcopy(self.call(self.emulator.create, self.rtype(plural), namespace, body))

    def get(self, plural: str, namespace: str | None, name: str) -> dict | None:
        found = self.call(lambda: self.emulator.objects.get(self.emulator._key(self.rtype(plural), namespace, name)))
        return copy.deepcopy(found)

    def list(self, plural: str, namespace: str | None = None, labels: str = "") -> list[dict]:
        return copy.deepcopy(self.call(self.emulator.list, self.rtype(plural), namespace, labels))

    def patch(self, plural: str, namespace: str | None, name: str, patch: dict, subresource: str | None = None) -> dict:
        change = lambda obj: merge_patch(obj, patch)  # noqa: E731
        return copy.deepcopy(self.call(self.emulator.update, self.rtype(plural), namespace, name, change, subresource))

    def delete(self, plural: str, namespace: str | None, name: str) -> dict | None:
        """Delete if present; returns the deleted object or None."""
        def delete() -> dict | None:
            rtype = self.rtype(plural)
            if self.emulator._key(rtype, namespace, name) not in self.emulator.objects:
                return None
            return self.emulator.delete(rtype, namespace, name)

        return copy.deepcopy(self.call(delete))

    def events(self, since: int, timeout: float) -> tuple[int, list[dict]]:
        """Block up to `timeout` for events newer than `since`; returns (new cursor, events)."""
        async def wait() -> tuple[int, list[dict]]:
            await self.emulator.wait_newer(since, timeout)
            return self.emulator.version, [event for _, event in self.emulator.events_since(since)]

        return self.call(wait)
