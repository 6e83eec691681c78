"""The operator's Kubernetes calls: plain JSON over the kubernetes client's REST layer, no generated models.

Creation is idempotent by name (409 means someone, maybe a previous run of this handler, already made it), and
deletion of something already gone is a no-op: that is what makes every reconciliation safe to repeat.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from bookfleet.kube.models import GROUP, VERSION
from bookfleet.kube.runtime import metrics

PLURALS = {
    "Pod": "pods",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Service": "services",
    "ConfigMap": "configmaps",
    "NetworkPolicy": "networkpolicies",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "ServiceAccount": "serviceaccounts",
    "Event": "events",
    "Job": "jobs",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "SparkApplication": "sparkapplications",
    "BookieCluster": "bookieclusters",
    "Bookie": "bookies",
    "Ledger": "ledgers",
    "Secret": "secrets",
    "Certificate": "certificates",
    "CustomResourceDefinition": "customresourcedefinitions",
}
FIELD_MANAGER = "bookfleet-operator"
"""The operator's name in server-side apply: the fields it applies are its own, and changed back when they drift."""
CORE = "v1"
BATCH = "batch/v1"
CUSTOM = f"{GROUP}/{VERSION}"
SPARK = "sparkoperator.k8s.io/v1beta2"


CONNECTIONS = 64
"""The client's connection pool: each informer's watch holds one connection per namespace all along, beside the
passes' requests (urllib3's default of 10 discarded connections, and their TLS handshakes, once six informers ran)."""


THROTTLED_RETRIES = 5
"""How often a request the API server answered 429 Too Many Requests is sent again before the pass fails."""
MAX_RETRY_AFTER = 30.0
"""The longest wait a 429's Retry-After gets (a larger one is the next pass's business)."""


class RateLimiter:
    """client-go's token bucket: `qps` requests a second sustained, `burst` at once. Every request of the operator
    takes a token and waits for one when the bucket is empty, so a storm of passes (a bookie loss at 100,000 Ledgers)
    queues here instead of at the API server, whose priority and fairness would answer 429 to every client sharing
    the operator's flow."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic):
        if qps <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs qps > 0 and burst >= 1, got {qps} and {burst}")
        self.qps, self.burst, self._clock = qps, burst, clock
        self._tokens, self._at = float(burst), clock()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take a token: the seconds to wait before the request may go."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps) - 1
            self._at = now
            return max(0.0, -self._tokens / self.qps)


def retry_after(headers: Mapping[str, str], attempt: int) -> float:
    """Seconds to wait before sending a throttled request again: the Retry-After the API server named (seconds, at
    most MAX_RETRY_AFTER), else 1, 2, 4 ... s by attempt."""
    try:
        named = float(headers.get("Retry-After", ""))
    except ValueError:
        named = float(2 ** attempt)
    return min(max(named, 0.0), MAX_RETRY_AFTER)


def load_config(kubeconfig: str | None) -> None:
    """The kubernetes client's settings: a kubeconfig file when given, else the pod's service account."""
    if kubeconfig:
        kubernetes.config.load_kube_config(config_file=kubeconfig)
    else:
        kubernetes.config.load_incluster_config()
    config = kubernetes.client.Configuration.get_default_copy()
    config.connection_pool_maxsize = CONNECTIONS
    kubernetes.client.Configuration.set_default(config)


def expired_list_continuation(exc: ApiException) -> str:
    """The continue token a 410 Expired answer to a paged LIST carries for the rest of the list; "" if none."""
    if exc.status != 410:
        return ""
    try:
        status = json.loads(exc.body or "")
    except ValueError:
        return ""
    return status.get("metadata", {}).get("continue", "") if isinstance(status, dict) else ""


class WatchStream:
    """One watch request's events, read as they come; `close()`, from any thread, ends it at once (an informer
    that stops does not wait out the request)."""

    def __init__(self, response: urllib3.BaseHTTPResponse):
        self._response = response

    def __iter__(self) -> Iterator[dict]:
        try:
            yield from (json.loads(line) for line in iter_resp_lines(self._response) if line.strip())
        finally:
            self._response.release_conn()

    def close(self) -> None:
        self._response.shutdown()


def collection_path(api_version: str, plural: str, namespace: str | None) -> str:
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"


class KubeApi:
    """JSON in, JSON out; every method names the object it failed on."""

    def __init__(self, client: kubernetes.client.ApiClient | None = None, limiter: RateLimiter | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        """`limiter`: the client-side rate limit (None: none, for a one-off command such as the uninstall hook's);
        429 Too Many Requests is waited out and retried either way."""
        self.client = client or kubernetes.client.ApiClient()
        self._limiter, self._sleep = limiter, sleep
        self._served: dict[tuple[str, str], bool] = {}

    def _send(self, request: tuple, **options: Any) -> Any:
        """One request within the rate limit; a 429 answer is sent again after its Retry-After, a few times."""
        for attempt in range(THROTTLED_RETRIES + 1):
            if self._limiter is not None:
                self._sleep(self._limiter.reserve())
            response = self.client.call_api(*request, **options)
            if response.status != 429 or attempt == THROTTLED_RETRIES:
                return response
            metrics.THROTTLED.inc()
            response.read()
            self._sleep(retry_after(response.headers, attempt))
        raise AssertionError("unreachable: the last attempt returns")

    def _call(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None,
              content_type: str = "application/json") -> Any:
        request = self.client.param_serialize(
            method, path, query_params=list((query or {}).items()), body=body,
            header_params={"Content-Type": content_type, "Accept": "application/json"}, auth_settings=["BearerToken"],
        )
        response = self._send(request)
        data = response.read()
        if response.status >= 400:
            raise ApiException(status=response.status, reason=response.reason, body=data.decode(errors="replace"))
        return json.loads(data) if data else None

    def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> dict | None:
        try:
            return self._call("GET", f"{collection_path(api_version, plural, namespace)}/{name}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, api_version: str, plural: str, namespace: str | None, labels: dict[str, str] | None = None) -> list:
        query = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} if labels else None
        return self._call("GET", collection_path(api_version, plural, namespace), query=query).get("items", [])

    def list_page(self, api_version: str, plural: str, namespace: str | None, selector: str,
                  continue_token: str = "") -> dict:
        """One page (500 objects) of a LIST, with its metadata: `continue` for the next page, and on the last one
        the `resourceVersion` a watch starts from."""
        query = {"labelSelector": selector, "limit": "500"} | ({"continue": continue_token} if continue_token else {})
        return self._call("GET", collection_path(api_version, plural, namespace), query=query)

    def pages(self, api_version: str, plural: str, namespace: str | None, selector: str = "") -> Iterator[list[dict]]:
        """A LIST page by page (500 objects each): a caller that handles each page as it comes never holds the whole
        collection (100,000 Ledgers). A list that outlives etcd's compaction of its snapshot (kube-apiserver compacts
        every 5 minutes; a caller slow between pages, such as the uninstall hook deleting each page, meets it) goes
        on with the continue token the 410 Expired answer carries: the rest of the list from a newer snapshot, so an
        object changed meanwhile may be seen or not, which a caller that takes each object once as it comes allows."""
        token = ""
        while True:
            try:
                page = self.list_page(api_version, plural, namespace, selector, token)
            except ApiException as exc:
                renewed = expired_list_continuation(exc) if token else ""
                if not renewed:
                    raise
                token = renewed
                continue
            yield page.get("items", [])
            if not (token := page["metadata"].get("continue", "")):
                return

    def watch(self, api_version: str, plural: str, namespace: str | None, selector: str, resource_version: str,
              timeout_seconds: int) -> WatchStream:
        """The watch events after `resource_version` (bookmarks included), until the server ends the stream after
        `timeout_seconds`; an ERROR event (410: that version is too old) is yielded like the others."""
        query = {"labelSelector": selector, "watch": "true", "resourceVersion": resource_version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_seconds)}
        request = self.client.param_serialize(
            "GET", collection_path(api_version, plural, namespace), query_params=list(query.items()),
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        response = self._send(request, _request_timeout=(10, timeout_seconds + 30))
        if response.status >= 400:
            body = response.read().decode(errors="replace")
            response.response.release_conn()
            raise ApiException(status=response.status, reason=response.reason, body=body)
        return WatchStream(response.response)

    def served(self, api_version: str, plural: str, namespace: str) -> bool:
        """Whether the API server knows the resource (e.g. SparkApplication only with the Spark operator)."""
        if (api_version, plural) not in self._served:
            try:
                self._call("GET", collection_path(api_version, plural, namespace), query={"limit": "1"})
                self._served[(api_version, plural)] = True
            except ApiException as exc:
                if exc.status != 404:
                    raise
                return False
        return True

    def ensure(self, manifest: dict) -> tuple[dict, bool]:
        """Create `manifest` unless an object of that name exists; returns (the object, whether it was created).

        Looks first: reconcilers ensure every object of a cluster on each pass, and nearly all of them exist."""
        meta = manifest["metadata"]
        plural = PLURALS[manifest["kind"]]
        existing = self.get(manifest["apiVersion"], plural, meta.get("namespace"), meta["name"])
        if existing:
            return existing, False
        try:
            return self.create(manifest), True
        except ApiException as exc:
            if exc.status != 409:
                raise
        existing = self.get(manifest["apiVersion"], plural, meta.get("namespace"), meta["name"])
        return existing or manifest, False

    def apply(self, manifest: dict, manager: str = FIELD_MANAGER) -> dict:
        """Server-side apply as `manager`: creates the object, or makes every field the operator applies what
        `manifest` says (forced: it owns them), leaving fields other managers set alone. An object that already says
        so is not written (the API server makes it a no-op)."""
        meta = manifest["metadata"]
        path = collection_path(manifest["apiVersion"], PLURALS[manifest["kind"]], meta.get("namespace"))
        return self._call("PATCH", f"{path}/{meta['name']}", body=manifest,
                          query={"fieldManager": manager, "force": "true"},
                          content_type="application/apply-patch+yaml")

    def create(self, manifest: dict) -> dict:
        """POST `manifest` (ApiException 409 when its name is taken)."""
        path = collection_path(manifest["apiVersion"], PLURALS[manifest["kind"]], manifest["metadata"].get("namespace"))
        return self._call("POST", path, body=manifest)

    def patch(self, api_version: str, plural: str, namespace: str | None, name: str, patch: dict,
              subresource: str = "") -> dict | None:
        """A JSON merge patch; None when the object is gone."""
        path = f"{collection_path(api_version, plural, namespace)}/{name}" + (f"/{subresource}" if subresource else "")
        try:
            return self._call("PATCH", path, body=patch, content_type="application/merge-patch+json")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_status(self, plural: str, namespace: str, name: str, status: dict,
                     resource_version: str | None = None) -> dict | None:
        """`resource_version`: a precondition (409 Conflict when the object has moved on since)."""
        version = {"metadata": {"resourceVersion": resource_version}} if resource_version else {}
        return self.patch(CUSTOM, plural, namespace, name, {"status": status, **version}, subresource="status")

    def delete(self, api_version: str, plural: str, namespace: str | None, name: str,
               grace_period_seconds: int | None = None) -> bool:
        """True if something was deleted (or is being deleted), False if it was already gone.

        `grace_period_seconds=0` removes a pod at once, without waiting for a kubelet (one on a dead node never
        confirms)."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        try:
            self._call("DELETE", f"{collection_path(api_version, plural, namespace)}/{name}", body=body)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def post_event(self, involved: dict, reason: str, message: str, warning: bool = False) -> None:
        """A Kubernetes Event on `involved` (what `kubectl describe` shows): one decision, so counted here, where every
        action that announces one passes (kube.metrics)."""
        meta = involved["metadata"]
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:10]}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": involved["apiVersion"], "kind": involved["kind"], "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid")},
            "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
            "source": {"component": "bookfleet-operator"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        # Its name is new, so it is created without looking first: the chart's ServiceAccount may create Events, not
        # read them.
        self.create(event)
        metrics.record_event(involved, reason, warning)
