"""The bookie's wire-protocol server: frames in, storage calls, responses out in completion order.

Each connection pipelines: every request is started as soon as its frame is read and answers when it completes.
An add is applied at once and waits for its journal group commit; the adds of one connection that share a commit
are answered together, from one callback, with one write.
Memory stays bounded (ServerLimits): per connection, at most `max_in_flight` requests run at once, answers not yet
taken by the client stay under `max_pending_response_bytes` (reads complete inside the receive loop, so the loop
stops starting requests while that much is waiting: a client that never reads gets no more work done), adds waiting
for their commit or for their ledger's admission lookup stay under `max_connection_add_bytes`, and at most
`max_long_polls` READ_LAC long polls wait (more are answered at once). Across connections: `max_connections`, and
`max_add_bytes` of adds waiting in all. A connection idle for `idle_timeout` is closed. Long polls answer at once
when their client stops sending (EOF) or goes away, as if their timeout had ended.
A frame that breaks the format closes that connection only, unanswered (BookKeeper's protocols have nothing to match
an answer with); a field out of its range (wire.InvalidField) gets BAD_REQUEST naming the field and the connection
goes on.
With TLS (`tls`), a peer is authenticated by its certificate during the handshake, before any frame is read, and
every request is checked against its roles (`bookfleet.security.roles`); a connection that opens in plain (as
BookKeeper's clients do, told apart by bookie/accepting.py before it is a connection) has no role until its V3
START_TLS handshake. With `admission`, a ledger this bookie does
not hold is created only if ZooKeeper has its metadata (`bookfleet.bookie.admission`).
A read-only bookie refuses adds, but a recovery add (RECOVERY_ADD) of an entry whose stored ensemble names it goes into
the disk's reserve while there is room (`reserve`) and the kind of read-only allows it (`takes_recovery_adds`: not a
failed storage; bookie/readonly.py): such an add waits for that lookup like one waiting for admission.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from bookfleet import wire
from bookfleet.bookie import errors
from bookfleet.bookie.accepting import Acceptor
from bookfleet.bookie.admission import LedgerAdmission
from bookfleet.bookie.connection import Connection
from bookfleet.bookie.http import BookieMetrics
from bookfleet.bookie.serving import AddRun, ServerLimits
from bookfleet.security import roles
from bookfleet.security.tls import ReloadingContext, TlsConfigError

log = logging.getLogger(__name__)

MAX_READ_LAC_WAIT = 120.0
"""Longest READ_LAC long poll a client may ask for; longer requests are cut to this."""

READ_RANGE_MAX_BYTES = (wire.MAX_FRAME_SIZE - 1024) * 9 // 10
"""Entry bytes one READ_RANGE answer may carry: an entry is at least 36 bytes (header and CRC32C), so its protobuf tag
and length (2 bytes below 128 bytes, 4 below 2 MiB) add at most a ninth, and the response's envelope fits in the 1024
bytes kept aside."""
READ_RANGE_MAX_ENTRIES = 10_000
"""Entries one READ_RANGE answer may carry, whatever span it asked for: the answer stops early, as it does at
max_bytes, and the reader asks again from the entry after the last one it got."""


class BookieServer:
    """Serves `storage` (a LedgerStorage) over TCP. `read_only` (why adds are refused; None: writable) is switched
    by the bookie's ReadOnlyState. Each connection gets this server as a `serving.Server`, its only view of it."""

    def __init__(
        self,
        storage,
        metrics: BookieMetrics,
        space: Callable[[], tuple[int, int]],
        limits: ServerLimits | None = None,
        tls: ReloadingContext | None = None,
        admission: LedgerAdmission | None = None,
        reserve: Callable[[int], bool] | None = None,
    ):
        self.storage = storage
        self.metrics = metrics
        self.space = space
        self.limits = limits or ServerLimits()
        self.max_in_flight = self.limits.max_in_flight
        self.tls = tls
        self.admission = admission
        self.read_only: str | None = None
        self.takes_recovery_adds = True
        """While read-only, whether recovery adds may use the disk's reserve (ReadOnlyState.takes_recovery_adds)."""
        self.reserve = reserve
        """`reserve(entry_bytes)`: whether a recovery add fits the disk's reserve, taking its room (DiskMonitor's
        take_reserve); None: a read-only bookie takes no recovery add."""
        self.stopping = False
        self._long_polls = 0
        self.connections: set[Connection] = set()
        self.refused_connections = 0
        self.add_bytes = 0
        """Bytes of adds of all connections waiting for their commit (admission across connections)."""
        self._admission_waiters: set[Connection] = set()
        self._acceptor: Acceptor | None = None
        self._idle_sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._acceptor = Acceptor(self, lambda: Connection(self))
        await self._acceptor.start(host, port)
        self._idle_sweeper = loop.create_task(self._close_idle_connections(), name="idle-connection-sweeper")

    async def _close_idle_connections(self) -> None:
        timeout = self.limits.idle_timeout
        while True:
            await asyncio.sleep(timeout / 4)
            idle_since = asyncio.get_running_loop().time() - timeout
            for conn in list(self.connections):
                if not conn.in_flight and conn.last_request < idle_since:
                    log.info("closing connection from %s: idle for more than %.0f s", conn.peer, timeout)
                    conn.close_after_flush()

    def admit_adds(self, conn: Connection, size: int) -> bool:
        """Whether `conn` may start an add of `size` bytes now; if not, it is resumed once adds complete."""
        limits = self.limits
        connection_full = conn.add_bytes and conn.add_bytes + size > limits.max_connection_add_bytes
        if not connection_full and (not self.add_bytes or self.add_bytes + size <= limits.max_add_bytes):
            return True
        if not connection_full:
            self._admission_waiters.add(conn)
        return False

    def release_adds(self, size: int) -> None:
        """Adds of `size` bytes completed: connections waiting for room across connections go on."""
        self.add_bytes -= size
        if self._admission_waiters:
            waiters, self._admission_waiters = self._admission_waiters, set()
            for conn in waiters:
                conn.resume()

    def tls_context(self) -> ssl.SSLContext:
        """The context for a new connection, with the newest certificate files loaded."""
        try:
            self.tls.refresh()
        except TlsConfigError as exc:
            log.error("serving with the previous TLS certificate: %s", exc)
        return self.tls.context

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, answer new requests SHUTTING_DOWN, and wait for in-flight requests to finish."""
        self.stopping = True
        if self._acceptor is not None:
            self._acceptor.close()
        if self._idle_sweeper is not None:
            self._idle_sweeper.cancel()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # Long polls are not work in progress: they are answered when storage closes and wakes them.
        while sum(conn.in_flight for conn in self.connections) > self._long_polls and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.close_after_flush()
        await asyncio.sleep(0)

    # --- what every session calls: the add path, fencing, LACs, epochs and ranges --------------------------

    def add_entry(
        self, entry: bytes, master_key: bytes, recovery: bool, ledger_id: int, entry_id: int, lac: int,
        reserved: bool = False, writer_epoch: int = 0,
    ) -> asyncio.Future[None]:
        """The one way an add reaches storage, applied at once: the read-only check (unless `reserved`: a recovery
        add granted room in the disk's reserve, `_reserve_room`), then storage; returns the future of its group
        commit."""
        if self.read_only is not None and not reserved:
            raise errors.ReadOnly(f"bookie is read-only: {self.read_only}")
        return self.storage.add_unpacked(ledger_id, entry_id, lac, entry, master_key, recovery, writer_epoch)

    def add_run(self, run: AddRun) -> asyncio.Future[None]:
        """The adds of one writer from one read, applied at once by one storage call (`add_entry`'s checks, made
        once for them all)."""
        if self.read_only is not None:
            raise errors.ReadOnly(f"bookie is read-only: {self.read_only}")
        writer = run.writer
        return self.storage.add_run(
            writer.ledger_id, writer.master_key, writer.recovery, writer.writer_epoch, run.entry_ids, run.lacs,
            run.entries,
        )

    def add_needs_check(self, ledger_id: int, recovery: bool, principal: roles.Principal | None) -> bool:
        """Whether an add must wait for ZooKeeper: a ledger not admitted yet, a client's recovery add (allowed
        only while the ledger is not closed), or a recovery add to a read-only bookie (allowed only to the ensemble's
        own bookies)."""
        if self.admission is None:
            return False
        if not self.admission.admitted(ledger_id):
            return True
        if not recovery:
            return False
        return self.read_only is not None or (
            principal is not None and not principal.has(*roles.CLOSED_LEDGER_WRITERS)
        )

    async def admit_add(
        self, ledger_id: int, entry_id: int, entry_size: int, recovery: bool, principal: roles.Principal | None
    ) -> bool:
        """The lookups of an add that needs them (`add_needs_check`), of any protocol: the ledger's metadata must
        exist, a client's recovery add on a closed ledger needs a role that may write closed ledgers, and a read-only
        bookie takes a recovery add only into its reserve. Returns whether the add was granted reserve room."""
        await self.admission.admit(ledger_id)
        if recovery and principal is not None and await self.admission.closed(ledger_id):
            try:
                roles.authorize_closed_ledger_add(principal, ledger_id)
            except roles.Forbidden as exc:
                raise errors.RoleForbidden(str(exc)) from None
        return self.read_only is not None and await self._reserve_room(recovery, ledger_id, entry_id, entry_size)

    async def _reserve_room(self, recovery: bool, ledger_id: int, entry_id: int, entry_size: int) -> bool:
        """Room in the disk's reserve for a recovery add to this read-only bookie, or ReadOnly saying why not: not a
        recovery add, failed storage, an entry whose stored ensemble does not name this bookie (a new home must be
        writable), or the reserve used up (its hard limit keeps the disk from filling up)."""
        refused = f"bookie is read-only: {self.read_only}"
        if not recovery or not self.takes_recovery_adds or self.reserve is None:
            raise errors.ReadOnly(refused)
        if not await self.admission.in_ensemble(ledger_id, entry_id):
            raise errors.ReadOnly(
                f"{refused}; it takes recovery adds only of entries whose stored ensemble names it, and ledger "
                f"{ledger_id}'s does not name it for entry {entry_id}"
            )
        if not self.reserve(entry_size):
            raise errors.ReadOnly(f"{refused}; its disk reserve for recovery adds is used up")
        return True

    async def fence(self, ledger_id: int, master_key: bytes) -> None:
        """Fence a ledger for a fencing read, of any protocol: a ledger this bookie does not hold needs its
        metadata in ZooKeeper first."""
        if self.admission is not None:
            await self.admission.admit(ledger_id)
        await self.storage.fence(ledger_id, master_key)

    async def write_lac(self, ledger_id: int, lac: int, master_key: bytes, body: bytes = b"") -> None:
        if self.admission is not None:
            await self.admission.admit(ledger_id)
        await self.storage.set_explicit_lac(ledger_id, lac, master_key, body)

    async def wait_for_lac(self, conn: Connection, ledger_id: int, previous: int, timeout: float) -> int:
        """The ledger's LAC once above `previous`, or at the end of `timeout` seconds (cut to MAX_READ_LAC_WAIT); a
        long poll beyond the connection's `max_long_polls` is answered at once, as if its timeout were 0."""
        timeout = min(timeout, MAX_READ_LAC_WAIT)
        if timeout <= 0 or conn.long_polls >= self.limits.max_long_polls:
            return self.storage.lac(ledger_id)
        self._long_polls += 1
        conn.long_polls += 1
        self.metrics.long_polls.inc()
        try:
            return await self.storage.wait_for_lac(ledger_id, previous, timeout, conn.ended)
        finally:
            self._long_polls -= 1
            conn.long_polls -= 1
            self.metrics.long_polls.dec()

    async def raise_writer_epoch(self, ledger_id: int, writer_epoch: int, master_key: bytes) -> tuple[int, int]:
        """A reopening writer's fence (RAISE_EPOCH), durable before it returns the bookie's (lac, last entry id)."""
        if self.admission is not None:
            await self.admission.admit(ledger_id)
        await self.storage.raise_writer_epoch(ledger_id, writer_epoch, master_key)
        return self.storage.lac(ledger_id), self.storage.last_entry_id(ledger_id)

    async def read_range(self, ledger_id: int, first: int, last: int, max_bytes: int) -> list[bytes]:
        """The present entries of [first, last] (READ_RANGE), cut to this server's caps on bytes and entries."""
        entries = await self.storage.read_range(
            ledger_id, first, last, min(max_bytes, READ_RANGE_MAX_BYTES), READ_RANGE_MAX_ENTRIES
        )
        self.metrics.observe_read(sum(map(len, entries)), count=len(entries))
        return entries
