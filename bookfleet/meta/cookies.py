"""The ZooKeeper half of a bookie's cookie: which bookie a set of disks belongs to, as ZooKeeper remembers it.

The bookie checks it against the copy on its disks at start (bookfleet.bookie.cookie); the operator and the CLI only
ask whether a bookie has one, and forget it when the bookie may start again on new, empty disks.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from bookfleet.meta import zkpaths


class CookieMismatch(RuntimeError):
    """The disks and ZooKeeper disagree about this bookie's identity; the message says how."""


@dataclass(frozen=True)
class Cookie:
    bookieId: str
    journalDir: str
    ledgerDir: str
    instanceId: str

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Cookie:
        try:
            fields = json.loads(data)
            return cls(**{name: str(fields[name]) for name in cls.__dataclass_fields__})
        except (ValueError, KeyError, TypeError) as exc:
            raise CookieMismatch(f"cookie in {where} is not valid cookie JSON ({exc!r})") from None


def read(zk: KazooClient, bookie_id: str) -> Cookie | None:
    """The cookie ZooKeeper holds for `bookie_id`, or None when it has none."""
    try:
        data, _ = zk.get(zkpaths.cookie(bookie_id))
    except NoNodeError:
        return None
    return Cookie.from_json(data, f"ZooKeeper {zkpaths.cookie(bookie_id)}")


def exists(zk: KazooClient, bookie_id: str) -> bool:
    return zk.exists(zkpaths.cookie(bookie_id)) is not None


def create(zk: KazooClient, cookie: Cookie) -> None:
    """Register a new bookie's cookie; CookieMismatch if another process registered one first."""
    try:
        zk.create(zkpaths.cookie(cookie.bookieId), cookie.to_json(), makepath=True)
    except NodeExistsError:
        raise CookieMismatch(
            f"another process registered a cookie for bookie {cookie.bookieId} while this one was starting"
        ) from None


def forget(zk: KazooClient, bookie_id: str) -> None:
    """The bookie's identity with its old disks; removed so that it can start again on new, empty ones."""
    with contextlib.suppress(NoNodeError):
        zk.delete(zkpaths.cookie(bookie_id), recursive=True)
