"""The ZooKeeper half of a bookie's cookie: which bookie a set of disks belongs to, as ZooKeeper remembers it.

The bookie checks it against the copy on its disks at start (bookfleet.bookie.cookie); the operator and the CLI only
ask whether a bookie has one, and forget it when the bookie may start again on new, empty disks.

Both copies are Apache BookKeeper's cookie: the line `5`, then a CookieFormat in protobuf text (bookieHost,
journalDir, ledgerDirs as `<count>\t<dir>...`, instanceId: the cluster's INSTANCEID).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

from google.protobuf import text_format
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from bookfleet.meta import zkpaths
from bookfleet.meta.formats import CookieFormat
from bookfleet.meta.metadata import OLD_FORMAT_ADVICE

COOKIE_VERSION = b"5"


class CookieMismatch(RuntimeError):
    """The disks and ZooKeeper disagree about this bookie's identity; the message says how."""


@dataclass(frozen=True)
class Cookie:
    bookieId: str
    journalDir: str
    ledgerDir: str
    instanceId: str
    incarnation: int = 0
    """The creation (czxid) of the ZooKeeper cookie: each registration of the bookie has its own, so disks of an
    earlier one are told apart. Not in BookKeeper's format (whose instanceId is the cluster's): the bookie keeps it
    on its disks beside the cookie; 0 where unknown."""

    def encode(self) -> bytes:
        record = CookieFormat(
            bookieHost=self.bookieId, journalDir=self.journalDir, ledgerDirs=f"1\t{self.ledgerDir}",
            instanceId=self.instanceId,
        )
        return COOKIE_VERSION + b"\n" + text_format.MessageToString(record).encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> Cookie:
        if data.startswith(b"{"):
            raise CookieMismatch(f"cookie in {where} is bookfleet's old JSON cookie; {OLD_FORMAT_ADVICE}")
        version, _, text = data.partition(b"\n")
        record = CookieFormat()
        try:
            if not version.strip().isdigit() or int(version) < 4:
                raise ValueError(f"cookie version {version[:10]!r}, expected 4 or above")
            text_format.Parse(text.decode(), record)
        except (ValueError, text_format.ParseError) as exc:
            raise CookieMismatch(f"cookie in {where} is not a BookKeeper cookie ({exc})") from None
        _, _, ledger_dirs = record.ledgerDirs.partition("\t")
        return cls(record.bookieHost, record.journalDir, ledger_dirs, record.instanceId)


def read(zk: KazooClient, bookie_id: str) -> Cookie | None:
    """The cookie ZooKeeper holds for `bookie_id`, or None when it has none."""
    try:
        data, stat = zk.get(zkpaths.cookie(bookie_id))
    except NoNodeError:
        return None
    return replace(Cookie.decode(data, f"ZooKeeper {zkpaths.cookie(bookie_id)}"), incarnation=stat.czxid)


def exists(zk: KazooClient, bookie_id: str) -> bool:
    return zk.exists(zkpaths.cookie(bookie_id)) is not None


def create(zk: KazooClient, cookie: Cookie) -> Cookie:
    """Register a new bookie's cookie, returned with its incarnation; CookieMismatch if another process registered
    one first."""
    try:
        _, stat = zk.create(zkpaths.cookie(cookie.bookieId), cookie.encode(), makepath=True, include_data=True)
        return replace(cookie, incarnation=stat.czxid)
    except NodeExistsError:
        raise CookieMismatch(
            f"another process registered a cookie for bookie {cookie.bookieId} while this one was starting"
        ) from None


def forget(zk: KazooClient, bookie_id: str) -> None:
    """The bookie's identity with its old disks; removed so that it can start again on new, empty ones."""
    with contextlib.suppress(NoNodeError):
        zk.delete(zkpaths.cookie(bookie_id), recursive=True)
