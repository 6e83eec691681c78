"""What every reconciliation needs: the Kubernetes API, ZooKeeper sessions per cluster, and status helpers."""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient

from bookfleet.kube.api import KubeApi
from bookfleet.kube.models import Condition, ConditionStatus, set_condition
from bookfleet.meta import zk as zkclient


@dataclass
class OperatorContext:
    """Shared by all handlers; ZooKeeper sessions are opened once per connect string and reused."""

    api: KubeApi
    zk_override: str | None = None
    _sessions: dict[str, KazooClient] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def zk(self, connect: str) -> KazooClient:
        """A live session to a cluster's ZooKeeper (`--zk` replaces every cluster's own string when given)."""
        connect = self.zk_override or connect
        with self._lock:
            client = self._sessions.get(connect)
            if client is None:
                client = self._sessions[connect] = zkclient.connect(connect)
            return client

    def close(self) -> None:
        with self._lock:
            for client in self._sessions.values():
                client.stop()
                client.close()
            self._sessions.clear()


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def rounded_up(moment: dt.datetime) -> dt.datetime:
    """To the next whole second: a loss time stored in status must never make a delay end early."""
    return moment.replace(microsecond=0) + dt.timedelta(seconds=1 if moment.microsecond else 0)


def now_rounded_up() -> dt.datetime:
    return rounded_up(now())


def timestamp(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def patch_status(ctx: OperatorContext, plural: str, body: dict[str, Any], changes: dict[str, Any]) -> bool:
    """The one status write of every reconciler: patch `changes` only if one of them differs from the object's status
    (no API call otherwise); `body` is updated to match. Returns whether it patched."""
    current = body.get("status") or {}
    if all(current.get(key) == value for key, value in changes.items()):
        return False
    ctx.api.patch_status(plural, body["metadata"]["namespace"], body["metadata"]["name"], changes)
    body["status"] = {**current, **changes}
    return True


def conditions_with(status: dict[str, Any], type_: str, ok: bool, reason: str, message: str = "") -> list[dict]:
    """The status's conditions with one of them set (transition time kept while its status is unchanged)."""
    current = [Condition.model_validate(c) for c in status.get("conditions") or []]
    new = Condition(type=type_, status=ConditionStatus.TRUE if ok else ConditionStatus.FALSE, reason=reason,
                    message=message)
    return [c.to_wire() for c in set_condition(current, new)]
