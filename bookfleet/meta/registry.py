"""Which bookies are up: their ephemeral registrations under /ledgers/available (read-only ones under readonly/).

A bookie registers `BookieInfo(...).to_json()` at zkpaths.available(id) while writable and at zkpaths.readonly(id)
while read-only; the session's death removes it, which is how clients and the auditor notice a lost bookie.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from pydantic import BaseModel, ValidationError

from bookfleet.meta import zkpaths
from bookfleet.meta.zk import pipelined, read_many


class BookieMode(enum.StrEnum):
    WRITABLE = "writable"
    READ_ONLY = "read_only"


class UnknownBookie(LookupError):
    def __init__(self, bookie_id: str):
        super().__init__(f"bookie {bookie_id} is not registered (neither writable nor read-only)")
        self.bookie_id = bookie_id


class BookieInfo(BaseModel):
    """A bookie's registration: `address` is HOST:PORT of its wire protocol, `zone` drives placement."""

    bookie_id: str
    address: str
    zone: str = ""
    state: BookieMode = BookieMode.WRITABLE
    free_bytes: int = 0
    tls: bool = False
    """The bookie speaks mutual TLS: a client needs a certificate (`--tls-dir`)."""

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


class BookieRegistry:
    """Reads the registrations; every call asks ZooKeeper afresh (cheap, and never stale after a failure)."""

    def __init__(self, zk: KazooClient):
        self.zk = zk

    def writable(self) -> list[BookieInfo]:
        return self._read(zkpaths.AVAILABLE, zkpaths.available, skip={zkpaths.READONLY.rsplit("/", 1)[1]})

    def read_only(self) -> list[BookieInfo]:
        return self._read(zkpaths.READONLY, zkpaths.readonly)

    def all(self) -> list[BookieInfo]:
        """Writable and read-only bookies, by id (a bookie caught mid-switch appears once, as read-only)."""
        merged = {info.bookie_id: info for info in self.writable()}
        merged.update((info.bookie_id, info) for info in self.read_only())
        return sorted(merged.values(), key=lambda info: info.bookie_id)

    def ids(self) -> set[str]:
        """The registered bookies' ids, writable and read-only, from two listings (no registration is read: a pass
        over a 1,000-bookie cluster read each one, 100 ZooKeeper requests a second at a 10 s interval)."""
        found: set[str] = set()
        for parent in (zkpaths.AVAILABLE, zkpaths.READONLY):
            with contextlib.suppress(NoNodeError):
                found.update(self.zk.get_children(parent))
        return found - {zkpaths.READONLY.rsplit("/", 1)[1]}

    def info(self, bookie_id: str) -> BookieInfo:
        for path in (zkpaths.available(bookie_id), zkpaths.readonly(bookie_id)):
            try:
                data, _ = self.zk.get(path)
            except NoNodeError:
                continue
            if info := self._parse(bookie_id, data, read_only=path == zkpaths.readonly(bookie_id)):
                return info
        raise UnknownBookie(bookie_id)

    def address(self, bookie_id: str) -> str:
        """HOST:PORT of a registered bookie."""
        return self.info(bookie_id).address

    def record_address(self, bookie_id: str, address: str) -> None:
        """Keep the address a bookie serves on in a persistent node, so that once its registration is gone (a
        frozen or partitioned bookie, a session expired) repair can still ask it before calling anything lost."""
        path, data = zkpaths.last_address(bookie_id), address.encode()
        try:
            self.zk.set(path, data)
        except NoNodeError:
            try:
                self.zk.create(path, data, makepath=True)
            except NodeExistsError:
                self.zk.set(path, data)

    def last_known_addresses(self, bookie_ids: Iterable[str]) -> dict[str, str]:
        """bookie id -> HOST:PORT: its registration if it has one, else the address it last registered with
        (bookies with neither are left out); read in one pipeline of asynchronous gets."""
        addresses = {info.bookie_id: info.address for info in self.all()}
        reads = pipelined(set(bookie_ids) - addresses.keys(), lambda b: self.zk.get_async(zkpaths.last_address(b)))
        for bookie_id, read in reads:
            try:
                data, _ = read.get()
            except NoNodeError:
                continue
            if data:
                addresses[bookie_id] = data.decode()
        return addresses

    def _read(self, parent: str, path_of, skip: frozenset[str] | set[str] = frozenset()) -> list[BookieInfo]:
        try:
            names = self.zk.get_children(parent)
        except NoNodeError:
            return []
        infos = []
        for name, read in read_many(self.zk, sorted(set(names) - skip), path_of):
            if read is None:
                continue  # went away while we listed
            if info := self._parse(name, read[0], read_only=parent == zkpaths.READONLY):
                infos.append(info)
        return infos

    @staticmethod
    def _parse(bookie_id: str, data: bytes, read_only: bool) -> BookieInfo | None:
        """A registration, or None while the znode is still empty (created before its data was set)."""
        if not data:
            return None
        try:
            info = BookieInfo.model_validate_json(data)
        except ValidationError as exc:
            raise ValueError(f"registration of bookie {bookie_id} is not valid BookieInfo JSON: {exc}") from None
        return info.model_copy(update={"state": BookieMode.READ_ONLY}) if read_only else info
