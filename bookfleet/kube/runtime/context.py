"""What every reconciliation needs: the Kubernetes API, ZooKeeper sessions per cluster, and status helpers."""

from __future__ import annotations

import base64
import datetime as dt
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from bookfleet.kube.models import BookieCluster, Condition, ConditionStatus, set_condition
from bookfleet.kube.resources import CA_KEY, CERT_KEY, KEY_KEY, ZK_AUTH_KEY
from bookfleet.kube.runtime.api import CORE, KubeApi
from bookfleet.meta import zk as zkclient
from bookfleet.security.certs import IssuedCertificate, write_tls_dir


class CredentialMissing(LookupError):
    """A cluster names a ZooKeeper credential or TLS Secret that does not exist (yet) or lacks a key."""


@dataclass(frozen=True)
class ZooKeeperTarget:
    """A cluster's ZooKeeper as the operator reaches it: connect string, the Secret holding the credential its
    nodes are locked to (None: an open ZooKeeper), and the Secret with its TLS identity (None: plain TCP). Decided
    actions carry it, so each writes with its own cluster's identity."""

    connect: str
    namespace: str
    auth_secret: str | None = None
    tls_secret: str | None = None

    @classmethod
    def of(cls, cluster: BookieCluster) -> ZooKeeperTarget:
        security = cluster.spec.security
        return cls(cluster.spec.zookeeper, cluster.metadata.namespace, security.zookeeper_auth_secret,
                   security.zookeeper_tls_secret)


class ZooKeeperUnavailable(RuntimeError):
    """A cluster's ZooKeeper has no live session now (never reached yet, or its server gone): a pass fails at once
    instead of queueing a call that kazoo would hold until the server is back."""


CONNECT_WAIT = 10.0
"""Seconds a pass that cannot do without ZooKeeper waits for its cluster's session to (re)connect: the session
timeout, on that cluster's own threads only (kube.runtime.wakeups.ClusterPools)."""


ZOOKEEPER_TLS_REFRESH = 60.0
"""Seconds the operator uses a ZooKeeper TLS Secret as read before reading it again: one GET a minute per Secret,
and a certificate renewed days before it expires (cert-manager's default: a third of its life) reaches the
operator's sessions long before the old one stops working."""


OPENING_WAIT = 1.0
"""Seconds any caller waits for a session that never connected yet: a reachable ZooKeeper answers within
milliseconds, so a just-started operator's first passes read it; an unreachable one costs its own cluster's passes
this much, no more."""


class ZooKeeperSessions:
    """One kazoo client per (connect string, credential, TLS directory), each started in the background
    (`start_async`: kazoo's own thread connects and reconnects it) and handed out only while connected. The TLS
    directory is in the key because a plain cluster on the same connect string must never ride another's TLS session.
    The lock guards the dict alone, never a connect: one cluster's unreachable ZooKeeper never holds up another's
    session (a global lock held across a 10 s connect stalled every cluster)."""

    def __init__(self) -> None:
        self._clients: dict[tuple[str, str, str], tuple[KazooClient, threading.Event]] = {}
        """Each client with kazoo's event that is set while it is connected."""
        self._connected_once: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def get(self, connect: str, auth: str, tls_dir: str, wait: float) -> KazooClient:
        """The live session (over TLS with the identity in `tls_dir`, plain TCP for NO_TLS), after waiting at most
        `wait` seconds for it (OPENING_WAIT at least for one never connected yet); ZooKeeperUnavailable otherwise. A
        call on a session kazoo is reconnecting would wait for the server however long it stays away."""
        key = (connect, auth, tls_dir)
        with self._lock:
            if key not in self._clients:
                client = zkclient.new_client(connect, auth=auth, tls_dir=tls_dir)
                self._clients[key] = client, client.start_async()
            client, live = self._clients[key]
            opening = key not in self._connected_once
        if not live.wait(max(wait, OPENING_WAIT) if opening else wait):
            over = " over TLS" if tls_dir else " over plain TCP"
            raise ZooKeeperUnavailable(f"ZooKeeper at {connect} has no live session{over} (state {client.state})")
        if opening:
            with self._lock:
                self._connected_once.add(key)
        return client

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client, _ in clients:
            client.stop()
            client.close()


@dataclass
class OperatorContext:
    """Shared by all handlers. ZooKeeper sessions are opened once per (connect string, credential, TLS directory)
    and reused; each cluster's credential is read once from its Secret (the nodes' ACLs name it, so it cannot change
    under them), its ZooKeeper TLS Secret every `zookeeper_tls_refresh` seconds (certificates are renewed)."""

    api: KubeApi
    zk_override: str | None = None
    event_window: float = 60.0
    """Seconds over which the like Events of many objects are counted into one (`events`)."""
    events: EventTally = field(init=False)
    sessions: ZooKeeperSessions = field(default_factory=ZooKeeperSessions)
    zookeeper_tls_refresh: float = ZOOKEEPER_TLS_REFRESH
    _credentials: dict[tuple[str, str], str] = field(default_factory=dict)
    _tls_read: dict[tuple[str, str], float] = field(default_factory=dict)
    """When each ZooKeeper TLS Secret (namespace, name) was last read into its directory (time.monotonic)."""
    _tls_root: Path | None = None
    _tls_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.events = EventTally(self.api.post_event, self.event_window)

    def zk(self, target: ZooKeeperTarget, wait: float = CONNECT_WAIT) -> KazooClient:
        """A live session to a cluster's ZooKeeper with that cluster's credential (`--zk` replaces every cluster's
        own connect string when given, never its credential), waiting at most `wait` seconds for it to connect
        (0: a pass that decides what it can without ZooKeeper, or runs on threads all clusters share)."""
        return self.sessions.get(self.zk_override or target.connect, self.credential(target),
                                 self.zookeeper_tls(target), wait)

    def credential(self, target: ZooKeeperTarget) -> str:
        """The cluster's credential from its Secret, "" for none; raises CredentialMissing (the pass fails, logged,
        and is retried) while the Secret is not there."""
        if target.auth_secret is None:
            return zkclient.NO_AUTH
        key = (target.namespace, target.auth_secret)
        if key not in self._credentials:
            secret = self.api.get(CORE, "secrets", target.namespace, target.auth_secret)
            data = (secret or {}).get("data") or {}
            if ZK_AUTH_KEY not in data:
                raise CredentialMissing(f"Secret {target.namespace}/{target.auth_secret} with key {ZK_AUTH_KEY!r} "
                                        "(the cluster's zookeeperAuthSecret) not found")
            self._credentials[key] = base64.b64decode(data[ZK_AUTH_KEY]).decode().strip()
        return self._credentials[key]

    def zookeeper_tls(self, target: ZooKeeperTarget) -> str:
        """The directory (private to this process) holding the cluster's ZooKeeper TLS Secret's files, NO_TLS for
        none. kazoo reads the files at each connect, so the Secret read again every `zookeeper_tls_refresh` seconds
        and written over its files (key first) puts a renewed certificate into the session's next reconnect. Raises
        CredentialMissing (the pass fails and is retried) while the Secret or one of its keys is not there."""
        if target.tls_secret is None:
            return zkclient.NO_TLS
        key = (target.namespace, target.tls_secret)
        with self._tls_lock:
            if self._tls_root is None:
                self._tls_root = Path(tempfile.mkdtemp(prefix="bookfleet-zk-tls-"))
            directory = self._tls_root / target.namespace / target.tls_secret
            read = self._tls_read.get(key)
        if read is not None and time.monotonic() - read < self.zookeeper_tls_refresh:
            return str(directory)
        data = (self.api.get(CORE, "secrets", *key) or {}).get("data") or {}
        if not {CA_KEY, CERT_KEY, KEY_KEY} <= data.keys():
            raise CredentialMissing(f"Secret {target.namespace}/{target.tls_secret} with keys {CA_KEY}, {CERT_KEY}, "
                                    f"{KEY_KEY} (the cluster's zookeeperTlsSecret) not found")
        pem = {name: base64.b64decode(data[name]) for name in (CA_KEY, CERT_KEY, KEY_KEY)}
        issued = IssuedCertificate(cert_pem=pem[CERT_KEY], key_pem=pem[KEY_KEY], ca_pem=pem[CA_KEY])
        with self._tls_lock:  # one writer at a time: write_tls_dir's temporary files have fixed names
            write_tls_dir(directory, issued)
            self._tls_read[key] = time.monotonic()
        return str(directory)

    def close(self) -> None:
        self.events.flush()
        self.sessions.close()
        if self._tls_root is not None:
            shutil.rmtree(self._tls_root, ignore_errors=True)


@dataclass
class _Tallied:
    involved: dict[str, Any]
    warning: bool
    count: int = 0
    examples: list[str] = field(default_factory=list)


class EventTally:
    """Like Events of many objects, counted into one Event per reason on the object they share (a bookie loss
    under-replicates, repairs and heals every Ledger it held: four Events each, 400,000 at 100,000 Ledgers, became
    one per reason on their BookieCluster and window). The first of a window's Events starts its timer (`schedule`:
    a daemon threading.Timer); `flush` posts what was counted."""

    EXAMPLES = 5

    def __init__(self, post: Callable[..., None], window: float,
                 schedule: Callable[[float, Callable[[], None]], None] | None = None):
        self._post, self._window = post, window
        self._schedule = schedule or _daemon_timer
        self._tallies: dict[tuple[str, str, str], _Tallied] = {}
        self._lock = threading.Lock()

    def add(self, involved: dict[str, Any], reason: str, subject: str, message: str, warning: bool) -> None:
        """Count `subject`'s Event `reason` on `involved`."""
        meta = involved["metadata"]
        key = (meta["namespace"], meta["name"], reason)
        with self._lock:
            first = not self._tallies
            tally = self._tallies.setdefault(key, _Tallied(involved, warning))
            tally.count += 1
            if len(tally.examples) < self.EXAMPLES:
                tally.examples.append(f"{subject} ({message})" if message else subject)
        if first:
            self._schedule(self._window, self.flush)

    def flush(self) -> None:
        """Post one Event per (object, reason) counted since the last flush."""
        with self._lock:
            tallies, self._tallies = self._tallies, {}
        for (_, _, reason), tally in tallies.items():
            more = f" and {tally.count - len(tally.examples)} more" if tally.count > len(tally.examples) else ""
            self._post(tally.involved, reason, f"{tally.count} Ledger(s): {', '.join(tally.examples)}{more}",
                       warning=tally.warning)


def _daemon_timer(seconds: float, then: Callable[[], None]) -> None:
    timer = threading.Timer(seconds, then)
    timer.daemon = True
    timer.start()


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def rounded_up(moment: dt.datetime) -> dt.datetime:
    """To the next whole second: a loss time stored in status must never make a delay end early."""
    return moment.replace(microsecond=0) + dt.timedelta(seconds=1 if moment.microsecond else 0)


def now_rounded_up() -> dt.datetime:
    return rounded_up(now())


def timestamp(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patched(target: Any, patch: Any) -> Any:
    """`target` as the API server stores it after the JSON merge patch `patch` (RFC 7386: objects merge key by key,
    a null removes its key, anything else replaces), without changing either: the RFC's own ten-line pseudo-code, not
    worth a pinned dependency in the operator image."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patched(merged.get(key), value)
    return merged


def patch_status(ctx: OperatorContext, plural: str, body: dict[str, Any], changes: dict[str, Any],
                 if_unchanged: bool = False) -> bool:
    """The one status write of every reconciler: patch `changes` only if the status they make differs from the
    object's (no API call otherwise), as the server merges them: a null inside a field (a repair not finished yet)
    removes that key, so the stored status never holds it and a plain comparison would patch again at every pass of
    a restarted operator. `body` is updated to match. `if_unchanged`: only on the resourceVersion `body` has (the API
    server answers 409 Conflict to a stale one). Returns whether it patched."""
    current = body.get("status") or {}
    status = merge_patched(current, changes)
    if status == current:
        return False
    meta = body["metadata"]
    written = ctx.api.patch_status(plural, meta["namespace"], meta["name"], changes,
                                   meta.get("resourceVersion") if if_unchanged else None)
    body["status"] = status
    if written is not None:
        meta["resourceVersion"] = written["metadata"].get("resourceVersion")
    return True


def conditions_with(status: dict[str, Any], type_: str, ok: bool, reason: str, message: str = "") -> list[dict]:
    """The status's conditions with one of them set (transition time kept while its status is unchanged)."""
    current = [Condition.model_validate(c) for c in status.get("conditions") or []]
    new = Condition(type=type_, status=ConditionStatus.TRUE if ok else ConditionStatus.FALSE, reason=reason,
                    message=message)
    return [c.to_wire() for c in set_condition(current, new)]
