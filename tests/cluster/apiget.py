"""`kubectl get ... -o json` answered in the test's own process: the tier's polls read the cluster many times a
second in all, and a kubectl process per read cost about half a second of wall time on the loaded machine (its
start, its kubeconfig and its TLS handshake), most of each poll; a read over a kept connection takes a tenth of that.

Only what the tier asks kubectl for: a resource by any of kubectl's names for it (plural, singular, kind, short name;
the core group's first, as kubectl resolves `events`), an optional object name, `-n`, `-l`, `--field-selector`, and
`--show-managed-fields` (kubectl leaves managedFields out otherwise); a list's items carry their kind and apiVersion,
as kubectl's do."""

from __future__ import annotations

import json
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes

FLAGS = {"-n": "namespace", "-l": "labelSelector", "--field-selector": "fieldSelector"}


@dataclass(frozen=True)
class Resource:
    prefix: str
    """/api/v1 or /apis/<group>/<version>"""
    plural: str
    namespaced: bool


class ApiGet:
    """The reads of one cluster (its admin kubeconfig), on one kept connection pool."""

    def __init__(self, kubeconfig: Path) -> None:
        self.client = kubernetes.config.new_client_from_config(str(kubeconfig))
        self.resources: dict[str, Resource] = {}
        self.lock = threading.Lock()

    def __call__(self, *args: str) -> Any:
        names, options, managed = [], {}, False
        rest = iter(args)
        for arg in rest:
            if arg in FLAGS:
                options[FLAGS[arg]] = next(rest)
            elif arg == "--show-managed-fields":
                managed = True
            else:
                names.append(arg)
        kind, *name = names
        resource = self.resource(kind)
        namespace = options.pop("namespace", "default")
        path = resource.prefix + (f"/namespaces/{namespace}" if resource.namespaced else "") + f"/{resource.plural}"
        if name:
            path += f"/{name[0]}"
        body = self.request(path + ("?" + urllib.parse.urlencode(options) if options else ""), args)
        for item in body.get("items", []):  # as kubectl lists them: each item says what it is
            item.setdefault("apiVersion", body["apiVersion"])
            item.setdefault("kind", body["kind"].removesuffix("List"))
        if not managed:
            for item in body.get("items", [body]):
                item.get("metadata", {}).pop("managedFields", None)
        return body

    def request(self, path: str, args: tuple[str, ...]) -> Any:
        response = self.client.rest_client.pool_manager.request("GET", self.client.configuration.host + path,
                                                                 timeout=60)
        if response.status >= 400:
            raise AssertionError(f"kubectl get {' '.join(args)} failed: {response.status} {response.data.decode()}")
        return json.loads(response.data)

    def resource(self, kind: str) -> Resource:
        """The resource kubectl means by `kind`; the API's discovery read again for one not known (a CRD installed
        since)."""
        with self.lock:
            if kind not in self.resources:
                self.resources = self.discover()
            if kind not in self.resources:
                raise AssertionError(f"kubectl get {kind}: the server has no resource type {kind!r}")
            return self.resources[kind]

    def discover(self) -> dict[str, Resource]:
        prefixes = ["/api/v1"] + [f"/apis/{group['preferredVersion']['groupVersion']}"
                                  for group in self.request("/apis", ("--raw", "/apis"))["groups"]]
        found: dict[str, Resource] = {}
        for prefix in prefixes:
            for entry in self.request(prefix, ("--raw", prefix))["resources"]:
                if "/" in entry["name"]:  # a subresource (status, scale, log ...)
                    continue
                resource = Resource(prefix, entry["name"], entry["namespaced"])
                for alias in (entry["name"], entry.get("singularName") or "", entry["kind"].lower(),
                              *entry.get("shortNames", [])):
                    if alias:
                        found.setdefault(alias, resource)
        return found
