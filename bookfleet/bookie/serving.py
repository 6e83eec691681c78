"""What a connection and its protocol sessions see of the bookie's server: the limits it holds them to
(`ServerLimits`) and `Server`, the one interface the server hands each connection (BookieServer is one).

Its own module so that server.py, connection.py and bkprocessors.py each import it and none of them imports the
others back: the server makes connections, a connection makes BookKeeper sessions, and both reach the server only
through these names. A Protocol costs nothing at run time: the hot add path calls the server's methods as before.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from bookfleet.bookie.admission import LedgerAdmission
    from bookfleet.bookie.http import BookieMetrics
    from bookfleet.bookie.storage import LedgerStorage
    from bookfleet.security import roles
    from bookfleet.security.tls import ReloadingContext
    from bookfleet.wire import Status

TLS_HANDSHAKE_TIMEOUT = 10.0
"""Seconds a peer has to send its first byte, and as many to finish a TLS handshake, before it is dropped."""


@dataclass(frozen=True)
class ServerLimits:
    """What one client, or all of them, may make the bookie hold (see bookie/server.py's docstring)."""

    max_in_flight: int = 2000
    max_pending_response_bytes: int = 16 * 1024 * 1024
    max_long_polls: int = 256
    max_connection_add_bytes: int = 64 * 1024 * 1024
    max_add_bytes: int = 512 * 1024 * 1024
    max_connections: int = 1024
    idle_timeout: float = 600.0
    """Seconds without a request and with nothing in flight before a connection is closed."""

    def __post_init__(self) -> None:
        for limit in fields(self):
            if getattr(self, limit.name) <= 0:
                raise ValueError(f"server limit {limit.name} must be positive, got {getattr(self, limit.name)}")


class AddRun:
    """Consecutive adds of one read from one writer (ledger, master key, recovery flag, writer epoch), each read and
    checked in place: applied together (`AddPath.add_run`) and answered together with their group commit."""

    __slots__ = ("answers", "entries", "entry_ids", "lacs", "received_at", "size", "txns", "writer")

    def __init__(self, writer: AddWriter, answers: AddAnswers, received_at: float) -> None:
        self.writer = writer
        self.answers = answers
        """The protocol session the adds came in (a START_TLS may choose another before they are answered)."""
        self.received_at = received_at
        """When the read that brought them arrived (perf_counter): the start of their latency."""
        self.txns: list[bytes] = []
        """Each add's txnId as its varint's bytes (V3; empty bytes for V2, whose answers name ledger and entry)."""
        self.entry_ids: list[int] = []
        self.lacs: list[int] = []
        self.entries: list[bytes] = []
        self.size = 0
        """Entry bytes of them all, held toward the add-byte limits until they are answered."""


class AddWriter(Protocol):
    """The fields every add of one writer repeats (bkwire's InPlaceWriter of adds read in place, WriterFields of the
    others)."""

    ledger_id: int
    master_key: bytes
    recovery: bool
    writer_epoch: int


class WriterFields(NamedTuple):
    """An `AddWriter` of adds decoded by protobuf (another client's layout than bkwire's in-place readers read)."""

    ledger_id: int
    master_key: bytes
    recovery: bool
    writer_epoch: int


class AddAnswers(Protocol):
    """How a protocol answers the adds of a run."""

    def add_acks(self, run: AddRun) -> bytes: ...

    def add_refusal(self, run: AddRun, index: int, status: Status, message: str) -> bytes: ...


class Peer(Protocol):
    """A connection as its server sees it: resumed once adds make room, its long polls counted and ended with it."""

    long_polls: int
    ended: asyncio.Future[None]

    def resume(self) -> None: ...


class AddPath(Protocol):
    """The add path's admission, apply and release, the same for every protocol a connection speaks."""

    add_bytes: int
    """Bytes of adds of all connections waiting for their commit."""

    def admit_adds(self, conn: Peer, size: int) -> bool:
        """Whether `conn` may start an add of `size` bytes now; if not, it is resumed once adds complete."""

    def release_adds(self, size: int) -> None:
        """Adds of `size` bytes completed: connections waiting for room go on."""

    def add_needs_check(self, ledger_id: int, recovery: bool, principal: roles.Principal | None) -> bool:
        """Whether an add must wait for ZooKeeper before it is applied."""

    async def admit_add(
        self, ledger_id: int, entry_id: int, entry_size: int, recovery: bool, principal: roles.Principal | None
    ) -> bool:
        """The lookups of an add of any protocol that needs them; whether it was granted reserve room."""

    def add_entry(
        self, entry: bytes, master_key: bytes, recovery: bool, ledger_id: int, entry_id: int, lac: int,
        reserved: bool = False, writer_epoch: int = 0,
    ) -> asyncio.Future[None]:
        """An add applied at once; the future of its group commit."""

    def add_run(self, run: AddRun) -> asyncio.Future[None]:
        """A run of adds applied at once, all or none (what would refuse one raises and applies none: the caller
        adds them one by one with `add_entry` then); the future of their group commit."""


class Server(AddPath, Protocol):
    """The bookie's server as its connections use it: the add path, the other requests' handlers and storage
    calls, the limits, and the state that decides whether a request is taken at all."""

    limits: ServerLimits
    max_in_flight: int
    metrics: BookieMetrics
    storage: LedgerStorage
    admission: LedgerAdmission | None
    read_only: str | None
    stopping: bool
    tls: ReloadingContext | None
    connections: set[Any]
    refused_connections: int
    space: Callable[[], tuple[int, int]]
    """The disk's free and total bytes."""

    def tls_context(self) -> ssl.SSLContext: ...

    async def fence(self, ledger_id: int, master_key: bytes) -> None: ...

    async def write_lac(self, ledger_id: int, lac: int, master_key: bytes, body: bytes = b"") -> None: ...

    async def wait_for_lac(self, conn: Peer, ledger_id: int, previous: int, timeout: float) -> int: ...

    async def raise_writer_epoch(self, ledger_id: int, writer_epoch: int, master_key: bytes) -> tuple[int, int]: ...

    async def read_range(self, ledger_id: int, first: int, last: int, max_bytes: int) -> list[bytes]: ...
