"""Which bookies are up: their ephemeral registrations under /ledgers/available (read-only ones under readonly/).

A bookie registers `BookieInfo(...).encode()` at zkpaths.available(id) while writable and at zkpaths.readonly(id)
while read-only; the session's death removes it, which is how clients and the auditor notice a lost bookie.
The payload is BookKeeper's BookieServiceInfoFormat, so a Java client finds the bookie too: one endpoint
{"bookie", host, port, "bookie-rpc", extensions ["tls"] when it takes TLS}, and bookfleet's facts (zone, http port,
free and total bytes) as `bookfleet.` properties, which BookKeeper carries without reading them.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterable

from google.protobuf.message import DecodeError
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from pydantic import BaseModel

from bookfleet.meta import zkpaths
from bookfleet.meta.formats import BookieServiceInfoFormat
from bookfleet.meta.zk import pipelined, put, read_many

BOOKIE_ENDPOINT, BOOKIE_PROTOCOL, TLS_EXTENSION = "bookie", "bookie-rpc", "tls"
ZONE_PROPERTY = "bookfleet.zone"
HTTP_PORT_PROPERTY = "bookfleet.httpPort"
FREE_BYTES_PROPERTY = "bookfleet.freeBytes"
TOTAL_BYTES_PROPERTY = "bookfleet.totalBytes"


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
    http_port: int = 0
    total_bytes: int = 0

    def encode(self) -> bytes:
        """The registration's bytes: a BookieServiceInfoFormat."""
        record = BookieServiceInfoFormat()
        host, _, port = self.address.rpartition(":")
        record.endpoints.add(
            id=BOOKIE_ENDPOINT, host=host.strip("[]"), port=int(port), protocol=BOOKIE_PROTOCOL,
            extensions=[TLS_EXTENSION] if self.tls else [],
        )
        record.properties.update({
            ZONE_PROPERTY: self.zone,
            HTTP_PORT_PROPERTY: str(self.http_port),
            FREE_BYTES_PROPERTY: str(self.free_bytes),
            TOTAL_BYTES_PROPERTY: str(self.total_bytes),
        })
        return record.SerializeToString(deterministic=True)

    @classmethod
    def decode(cls, bookie_id: str, data: bytes, read_only: bool = False) -> BookieInfo:
        """A registration as a bookfleet or a Java bookie wrote it; ValueError names a payload that is not one."""
        record = BookieServiceInfoFormat()
        try:
            record.ParseFromString(data)
        except DecodeError as exc:
            raise ValueError(f"registration of bookie {bookie_id} is not a BookieServiceInfoFormat: {exc}") from None
        endpoint = next((e for e in record.endpoints if e.id == BOOKIE_ENDPOINT), None)
        if endpoint is None:
            raise ValueError(f"registration of bookie {bookie_id} has no {BOOKIE_ENDPOINT!r} endpoint")
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        properties = record.properties
        return cls(
            bookie_id=bookie_id,
            address=f"{host}:{endpoint.port}",
            zone=properties.get(ZONE_PROPERTY, ""),
            state=BookieMode.READ_ONLY if read_only else BookieMode.WRITABLE,
            free_bytes=int(properties.get(FREE_BYTES_PROPERTY, "0")),
            tls=TLS_EXTENSION in endpoint.extensions,
            http_port=int(properties.get(HTTP_PORT_PROPERTY, "0")),
            total_bytes=int(properties.get(TOTAL_BYTES_PROPERTY, "0")),
        )


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
        put(self.zk, zkpaths.last_address(bookie_id), address.encode())

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
        return BookieInfo.decode(bookie_id, data, read_only) if data else None
