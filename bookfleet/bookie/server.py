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
A frame that breaks the format gets one error answer and closes that connection only; a field out of its range
(wire.InvalidField) gets BAD_REQUEST naming the field and the connection goes on.
With TLS (`tls`), a peer is authenticated by its certificate during the handshake, before any frame is read, and
every request is checked against its roles (`bookfleet.security.roles`). With `admission`, a ledger this bookie does
not hold is created only if ZooKeeper has its metadata (`bookfleet.bookie.admission`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, fields
from typing import Any

from bookfleet import wire
from bookfleet.bookie import errors
from bookfleet.bookie.admission import LedgerAdmission
from bookfleet.bookie.http import BookieMetrics
from bookfleet.security import roles
from bookfleet.security.tls import ReloadingContext, TlsConfigError
from bookfleet.wire import Op, Status

log = logging.getLogger(__name__)

MAX_READ_LAC_WAIT = 120.0
"""Longest READ_LAC long poll a client may ask for; longer requests are cut to this."""

READ_RANGE_MAX_BYTES = (wire.MAX_FRAME_SIZE - 1024) * 9 // 10
"""Entry bytes one READ_RANGE answer may carry: an entry is at least 36 bytes (header and CRC32C), so its 4-byte
size prefix adds at most a ninth, and the response header fits in the 1024 bytes kept aside."""
READ_RANGE_MAX_ENTRIES = 10_000
"""Entries one READ_RANGE answer may carry, whatever span it asked for: the answer stops early, as it does at
max_bytes, and the reader asks again from the entry after the last one it got."""


@dataclass(frozen=True)
class ServerLimits:
    """What one client, or all of them, may make the bookie hold (see the module docstring)."""

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

TLS_HANDSHAKE_TIMEOUT = 10.0
"""Seconds a peer has to finish the TLS handshake before its connection is dropped."""

_RECOVERY_ADD = int(wire.Flag.RECOVERY_ADD)  # plain ints: IntFlag arithmetic costs an enum lookup per request
_ADD_ENTRY = int(Op.ADD_ENTRY)
_FENCE = int(wire.Flag.FENCE)
_MIN_ADD_BODY = wire.ADD_PREFIX_SIZE + wire.ENTRY_HEADER.size
_ADD_HEAD = wire.ADD_REQUEST_HEAD
_ENTRY_OFFSET = wire.HEADER_SIZE + wire.ADD_PREFIX_SIZE
"""Where an add's entry starts in its frame (after the length prefix)."""
_VERSION = wire.PROTOCOL_VERSION
_encode_ack = wire.encode_add_response

_LEDGER_ID_OFFSET = {
    Op.ADD_ENTRY: wire.ADD_PREFIX_SIZE,
    Op.READ_ENTRY: 0,
    Op.READ_LAC: 0,
    Op.WRITE_LAC: wire.MASTER_KEY_SIZE,
    Op.FORCE_LEDGER: 0,
    Op.READ_RANGE: 0,
    Op.RAISE_EPOCH: wire.MASTER_KEY_SIZE,
}


class BookieServer:
    """Serves `storage` (a LedgerStorage) over TCP. `read_only` (why adds are refused; None: writable) is switched
    by the bookie's ReadOnlyState."""

    def __init__(
        self,
        storage,
        metrics: BookieMetrics,
        space: Callable[[], tuple[int, int]],
        limits: ServerLimits | None = None,
        tls: ReloadingContext | None = None,
        admission: LedgerAdmission | None = None,
    ):
        self.storage = storage
        self.metrics = metrics
        self.space = space
        self.limits = limits or ServerLimits()
        self.max_in_flight = self.limits.max_in_flight
        self.tls = tls
        self.admission = admission
        self.read_only: str | None = None
        self.stopping = False
        self._long_polls = 0
        self.connections: set[_Connection] = set()
        self.refused_connections = 0
        self.add_bytes = 0
        """Bytes of adds of all connections waiting for their commit (admission across connections)."""
        self._admission_waiters: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._idle_sweeper: asyncio.Task[None] | None = None
        self._handlers: dict[int, Callable[[wire.Frame, _Connection], Coroutine[Any, Any, bytes]]] = {
            Op.READ_ENTRY: self._read_entry,
            Op.READ_LAC: self._read_lac,
            Op.WRITE_LAC: self._write_lac,
            Op.GET_BOOKIE_INFO: self._bookie_info,
            Op.FORCE_LEDGER: self._force_ledger,
            Op.READ_RANGE: self._read_range,
            Op.RAISE_EPOCH: self._raise_epoch,
        }

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, reuse_address=True)
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

    def admit_adds(self, conn: _Connection, size: int) -> bool:
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
        if self._server is not None:
            self._server.close()
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

    # --- one handler per op: parse the body, call storage, return the response body -----------------------

    def _add_entry(self, buffer: bytearray, start: int, end: int, flags: int) -> tuple[int, int, asyncio.Future[None]]:
        """Apply the ADD_ENTRY body in buffer[start:end] at once: (ledger_id, entry_id, the future of its group
        commit). The entry is copied once, straight out of the receive buffer."""
        if end - start < _MIN_ADD_BODY:
            raise wire.ProtocolError(
                f"ADD_ENTRY body of {end - start} bytes is shorter than the master key, epoch and an entry header"
            )
        if self.read_only is not None:
            raise errors.ReadOnly(f"bookie is read-only: {self.read_only}")
        key_end = start + wire.MASTER_KEY_SIZE
        (epoch,) = wire.WRITER_EPOCH.unpack_from(buffer, key_end)
        with memoryview(buffer) as view:
            entry = bytes(view[start + wire.ADD_PREFIX_SIZE : end])
        return self.storage.add_entry_nowait(entry, buffer[start:key_end], bool(flags & _RECOVERY_ADD), epoch)

    def _add_needs_check(self, ledger_id: int, flags: int, principal: roles.Principal | None) -> bool:
        """Whether an add must wait for ZooKeeper: a ledger not admitted yet, or a client's recovery add (allowed
        only while the ledger is not closed)."""
        if self.admission is None:
            return False
        if not self.admission.admitted(ledger_id):
            return True
        return bool(flags & _RECOVERY_ADD) and principal is not None and not principal.has(*roles.CLOSED_LEDGER_WRITERS)

    async def _checked_add(self, frame: wire.Frame, principal: roles.Principal | None) -> bytes:
        """An add that waits for the admission lookup first; its body was copied out of the receive buffer."""
        (ledger_id,) = wire.LEDGER_ID.unpack_from(frame.body, wire.ADD_PREFIX_SIZE)
        await self.admission.admit(ledger_id)
        if frame.code & _RECOVERY_ADD and principal is not None and await self.admission.closed(ledger_id):
            try:
                roles.authorize_closed_ledger_add(principal, ledger_id)
            except roles.Forbidden as exc:
                raise errors.RoleForbidden(str(exc)) from None
        body = frame.body.obj
        ledger_id, entry_id, synced = self._add_entry(body, 0, len(body), frame.code)
        await synced
        return wire.LEDGER_ENTRY.pack(ledger_id, entry_id)

    async def _read_entry(self, frame: wire.Frame, conn: _Connection) -> bytes:
        ledger_id, entry_id = wire.unpack_body(wire.LEDGER_ENTRY, frame.body, "READ_ENTRY")
        wire.check_ledger_id(ledger_id)
        if entry_id != wire.INVALID_ENTRY_ID:
            wire.check_entry_id(entry_id)
        if frame.code & _FENCE:
            key = bytes(frame.body[wire.LEDGER_ENTRY.size :])
            if len(key) != wire.MASTER_KEY_SIZE:
                raise wire.ProtocolError(f"READ_ENTRY with FENCE needs a {wire.MASTER_KEY_SIZE}-byte master key")
            if self.admission is not None:
                await self.admission.admit(ledger_id)
            await self.storage.fence(ledger_id, key)
        if entry_id == wire.INVALID_ENTRY_ID:
            return wire.LAC_AND_LAST.pack(self.storage.lac(ledger_id), self.storage.last_entry_id(ledger_id))
        entry = await self.storage.read_entry(ledger_id, entry_id)
        self.metrics.observe_read(len(entry))
        return entry

    async def _read_lac(self, frame: wire.Frame, conn: _Connection) -> bytes:
        """A long poll beyond the connection's `max_long_polls` is answered at once, as if its timeout were 0."""
        ledger_id, previous, timeout_ms = wire.unpack_body(wire.READ_LAC_REQUEST, frame.body, "READ_LAC")
        wire.check_ledger_id(ledger_id)
        wire.check_lac(previous, "previous lac")
        timeout = min(timeout_ms / 1000, MAX_READ_LAC_WAIT)
        if timeout <= 0 or conn.long_polls >= self.limits.max_long_polls:
            return wire.LAC.pack(self.storage.lac(ledger_id))
        self._long_polls += 1
        conn.long_polls += 1
        self.metrics.long_polls.inc()
        try:
            return wire.LAC.pack(await self.storage.wait_for_lac(ledger_id, previous, timeout, conn.ended))
        finally:
            self._long_polls -= 1
            conn.long_polls -= 1
            self.metrics.long_polls.dec()

    async def _write_lac(self, frame: wire.Frame, conn: _Connection) -> bytes:
        key = bytes(frame.body[: wire.MASTER_KEY_SIZE])
        ledger_id, lac = wire.unpack_body(wire.WRITE_LAC_BODY, frame.body[wire.MASTER_KEY_SIZE :], "WRITE_LAC")
        if self.admission is not None:
            await self.admission.admit(ledger_id)
        await self.storage.set_explicit_lac(ledger_id, lac, key)
        return b""

    async def _raise_epoch(self, frame: wire.Frame, conn: _Connection) -> bytes:
        key = bytes(frame.body[: wire.MASTER_KEY_SIZE])
        ledger_id, epoch = wire.unpack_body(wire.RAISE_EPOCH_BODY, frame.body[wire.MASTER_KEY_SIZE :], "RAISE_EPOCH")
        wire.check_ledger_id(ledger_id)
        wire.check_writer_epoch(epoch)
        if self.admission is not None:
            await self.admission.admit(ledger_id)
        await self.storage.raise_writer_epoch(ledger_id, epoch, key)
        return wire.LAC_AND_LAST.pack(self.storage.lac(ledger_id), self.storage.last_entry_id(ledger_id))

    async def _bookie_info(self, frame: wire.Frame, conn: _Connection) -> bytes:
        free, total = self.space()
        state = wire.BookieState.READ_ONLY if self.read_only is not None else wire.BookieState.WRITABLE
        return wire.BOOKIE_INFO.pack(free, total, state)

    async def _force_ledger(self, frame: wire.Frame, conn: _Connection) -> bytes:
        (ledger_id,) = wire.unpack_body(wire.LEDGER_ID, frame.body, "FORCE_LEDGER")
        wire.check_ledger_id(ledger_id)
        await self.storage.force(ledger_id)
        return wire.LEDGER_ID.pack(ledger_id)

    async def _read_range(self, frame: wire.Frame, conn: _Connection) -> bytes:
        ledger_id, first, last, max_bytes = wire.unpack_body(wire.READ_RANGE_REQUEST, frame.body, "READ_RANGE")
        wire.check_ledger_id(ledger_id)
        wire.check_entry_id(first, "first entry id")
        if last < first:
            raise wire.InvalidField(f"last entry id {last} is before first entry id {first}")
        entries = await self.storage.read_range(
            ledger_id, first, last, min(max_bytes, READ_RANGE_MAX_BYTES), READ_RANGE_MAX_ENTRIES
        )
        body = wire.encode_entry_list(entries)
        self.metrics.observe_read(len(body), count=len(entries))
        return body


def _describe(frame: wire.Frame) -> str:
    """`ADD_ENTRY for ledger 5`, for error messages; only computed when something went wrong."""
    name = Op(frame.op).name
    offset = _LEDGER_ID_OFFSET.get(frame.op)
    if offset is None or len(frame.body) < offset + 8:
        return name
    (ledger_id,) = wire.LEDGER_ID.unpack_from(frame.body, offset)
    return f"{name} for ledger {ledger_id}"


class _WaitingAdds:
    """The adds of one connection waiting for one group commit."""

    __slots__ = ("acks", "size", "starts")

    def __init__(self) -> None:
        self.acks: list[bytes] = []
        """The OK answer of each add, packed when it arrived (wire.encode_add_response)."""
        self.starts: list[float] = []
        """When each add was received (perf_counter of the read that brought it)."""
        self.size = 0
        """Entry bytes of them all."""


class _Connection(asyncio.Protocol):
    """One client connection: frame splitting, requests started in order, bounded in-flight work and write buffer."""

    def __init__(self, server: BookieServer):
        self.server = server
        self.buffer = bytearray()
        self.in_flight = 0
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.long_polls = 0
        self.add_bytes = 0
        """Bytes of this connection's adds waiting for their commit."""
        self.principal: roles.Principal | None = None
        """The authenticated peer (TLS only); None on a plain connection."""
        self._outgoing: list[bytes] = []
        self._outgoing_bytes = 0
        self._adds: dict[asyncio.Future[None], _WaitingAdds] = {}
        """Adds waiting for each group commit."""
        self._reading_paused = False
        self._writing_paused = False
        self._admission_blocked = False
        self._rejected = False
        self._handshake: asyncio.Task[None] | None = None
        self._handshaking = False
        """Frames wait in the buffer until the peer is authenticated and its principal known."""
        self._eof = False
        self._processing = False
        self._received_at = 0.0
        """When the requests being started arrived (perf_counter of their read): the start of their latency."""
        self._loop = asyncio.get_running_loop()
        self.last_request = self._loop.time()
        self.ended: asyncio.Future[None] = self._loop.create_future()
        """Done once the client stops sending (EOF) or the connection is lost: its long polls answer at once."""

    # --- asyncio.Protocol -------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        host, port = (transport.get_extra_info("peername") or ("?", "?"))[:2]
        self.peer = f"{host}:{port}"
        server = self.server
        if len(server.connections) >= server.limits.max_connections:
            server.refused_connections += 1
            server.metrics.refused_connections.inc()
            if server.refused_connections & (server.refused_connections - 1) == 0:  # 1st, 2nd, 4th, 8th...
                log.warning(
                    "refused a connection from %s: %d connections is the limit (%d refused so far)",
                    self.peer, server.limits.max_connections, server.refused_connections,
                )
            self._rejected = True
            transport.abort()
            return
        server.connections.add(self)
        server.metrics.connections.inc()
        if self.server.tls is None:
            transport.set_write_buffer_limits(high=self.server.limits.max_pending_response_bytes)
            return
        # Nothing is read as a frame before the handshake authenticated the peer (start_tls resumes reading).
        self._handshaking = True
        transport.pause_reading()
        self._handshake = self._loop.create_task(self._start_tls(transport))

    async def _start_tls(self, transport: asyncio.Transport) -> None:
        """Mutual TLS handshake on the accepted socket; a refused peer is logged with the reason and dropped."""
        try:
            secure = await self._loop.start_tls(
                transport, self, self.server.tls_context(), server_side=True,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT,
            )
        except (OSError, TimeoutError) as exc:
            log.warning("refused connection from %s: TLS handshake failed: %s", self.peer, exc)
            self.server.metrics.count_error(0, Status.UNAUTHORIZED)
            transport.close()
            self.connection_lost(exc)
            return
        self.transport = secure
        self.principal = roles.Principal.from_peercert(secure.get_extra_info("peercert") or {})
        self.peer += f" ({self.principal.subject})"
        secure.set_write_buffer_limits(high=self.server.limits.max_pending_response_bytes)
        self._handshaking = False
        self._process()  # requests the peer sent right after its handshake finished

    def connection_lost(self, exc: Exception | None) -> None:
        if self not in self.server.connections:
            return
        self.server.connections.discard(self)
        self.server.metrics.connections.dec()
        self.buffer.clear()
        self._outgoing.clear()
        self._end()

    def _end(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)

    def data_received(self, data: bytes) -> None:
        if not self._rejected:
            self.last_request = self._loop.time()
            self.buffer += data
            if not self._handshaking:
                self._process()

    def eof_received(self) -> bool:
        # The client finished sending: answer what it asked, then close; a partial frame left over is reported.
        self._eof = True
        self._end()
        if not self._handshaking:
            self._process()
        return True

    def _process(self) -> None:
        """Start the buffered requests while there is room (in flight, answers pending, adds admitted); the rest
        wait in the buffer."""
        if self._processing:  # a request that completed at once, from inside the loop below
            return
        self._processing = True
        buffer = self.buffer
        pos, end = 0, len(buffer)
        unpack_length, server, limits = wire.LENGTH_PREFIX.unpack_from, self.server, self.server.limits
        max_in_flight, max_pending = server.max_in_flight, limits.max_pending_response_bytes
        connection_room = limits.max_connection_add_bytes - self.add_bytes
        partial = False
        self._admission_blocked = False  # decided again below
        self._received_at = time.perf_counter()
        try:
            while pos < end:
                if self.in_flight >= max_in_flight or self._writing_paused or self._outgoing_bytes >= max_pending:
                    break  # the bound is reached, or answers wait for the client to take them
                if end - pos < wire.LENGTH_PREFIX.size:
                    partial = True
                    break
                (length,) = unpack_length(buffer, pos)
                if not wire.HEADER_SIZE <= length <= wire.MAX_FRAME_SIZE:
                    try:
                        wire.check_frame_length(length)
                    except wire.ProtocolError as exc:
                        self._reject_prefix(length, buffer[pos + wire.LENGTH_PREFIX.size :], exc)
                        return
                start = pos + wire.LENGTH_PREFIX.size
                if end - start < length:
                    partial = True
                    break
                if buffer[start + 1] == _ADD_ENTRY:  # the common case (room on both counts) costs no call
                    short_of_room = length > connection_room or length > limits.max_add_bytes - server.add_bytes
                    if short_of_room and not server.admit_adds(self, length):
                        self._admission_blocked = True
                        break
                    connection_room -= length
                    pos = start + length
                    self._add(buffer, start, pos)
                else:
                    pos = start + length
                    self._dispatch(buffer, start, pos)
                if self._rejected:
                    return
            del buffer[:pos]
        finally:
            self._processing = False
        self._update_reading()
        if self._eof:
            if partial:
                self._reject(0, 0, Status.BAD_REQUEST, f"connection ended inside a frame ({len(buffer)} bytes)")
            elif not buffer and not self.in_flight:
                self._loop.call_soon(self.close_after_flush)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.resume()

    def resume(self) -> None:
        """Go on with buffered requests after a wait for room (answers taken, adds admitted)."""
        self._admission_blocked = False
        if self.transport is not None and not self.transport.is_closing():
            self._process()

    # --- requests ---------------------------------------------------------------------------------------------

    def _dispatch(self, buffer: bytearray, start: int, end: int) -> None:
        """Start the request framed in buffer[start:end] (checked to hold at least a header)."""
        try:
            op, flags, request_id = wire.decode_header(buffer, start)
        except wire.ProtocolError as exc:
            _, op, _, request_id = wire.REQUEST_HEADER.unpack_from(buffer, start)
            self._reject(op, request_id, Status.BAD_REQUEST, str(exc))
            return
        handler = self.server._handlers.get(op)
        if handler is None and op != Op.ADD_ENTRY:
            self._reject(op, request_id, Status.BAD_REQUEST, f"unknown op {op}")
            return
        if self.server.stopping:
            self._send(wire.encode_error(op, request_id, Status.SHUTTING_DOWN, "bookie is shutting down"))
            return
        start += wire.HEADER_SIZE
        if self.principal is not None:
            try:
                roles.authorize(self.principal, op, flags)
            except roles.Forbidden as exc:
                self._failed(wire.Frame(op, flags, request_id, memoryview(b"")), errors.RoleForbidden(str(exc)))
                return
        if handler is None and end - start >= _MIN_ADD_BODY:
            (ledger_id,) = wire.LEDGER_ID.unpack_from(buffer, start + wire.ADD_PREFIX_SIZE)
            if self.server._add_needs_check(ledger_id, flags, self.principal):
                frame = wire.Frame(op, flags, request_id, memoryview(buffer[start:end]))
                self.in_flight += 1
                self._step(self._holding_add_bytes(self.server._checked_add(frame, self.principal), end - start), frame)
                return
        if handler is not None:
            frame = wire.Frame(op, flags, request_id, memoryview(buffer[start:end]))
            self.in_flight += 1
            self._step(handler(frame, self), frame)
            return
        self._add(buffer, start - wire.HEADER_SIZE, end, checked=True)

    def _add(self, buffer: bytearray, start: int, end: int, checked: bool = False) -> None:
        """Apply the ADD_ENTRY request framed in buffer[start:end] at once and answer it with its group commit (the
        adds of one commit together). Every field comes from one unpack and the entry is copied once, straight out
        of the receive buffer. Unless `checked` (by _dispatch), a request that needs more than that (another
        protocol version, TLS roles, an admission lookup, a bookie shutting down, too short) goes to _dispatch."""
        server = self.server
        if end - start < _ENTRY_OFFSET + wire.ENTRY_HEADER.size:
            if not checked:
                self._dispatch(buffer, start, end)
                return
            _, op, flags, request_id = wire.REQUEST_HEADER.unpack_from(buffer, start)
            size = end - start - wire.HEADER_SIZE
            message = f"ADD_ENTRY body of {size} bytes is shorter than the master key, epoch and an entry header"
            self._failed(wire.Frame(op, flags, request_id, memoryview(b"")), wire.ProtocolError(message))
            return
        version, _, flags, request_id, key, epoch, ledger_id, entry_id, lac, _ = _ADD_HEAD.unpack_from(buffer, start)
        if not checked and (
            version != _VERSION
            or self.principal is not None
            or server.stopping
            or (server.admission is not None and not server.admission.admitted(ledger_id))
        ):
            self._dispatch(buffer, start, end)
            return
        try:
            if server.read_only is not None:
                raise errors.ReadOnly(f"bookie is read-only: {server.read_only}")
            with memoryview(buffer) as view:
                entry = bytes(view[start + _ENTRY_OFFSET : end])
            synced = server.storage.add_unpacked(
                ledger_id, entry_id, lac, entry, key, flags & _RECOVERY_ADD != 0, epoch
            )
        except (Exception, asyncio.CancelledError) as exc:
            body = memoryview(buffer[start + wire.HEADER_SIZE : end])
            self._failed(wire.Frame(_ADD_ENTRY, flags, request_id, body), exc)
            return
        self.in_flight += 1
        waiting = self._adds.get(synced)
        if waiting is None:
            waiting = self._adds[synced] = _WaitingAdds()
            synced.add_done_callback(self._adds_synced)
        waiting.acks.append(_encode_ack(request_id, ledger_id, entry_id))
        waiting.starts.append(self._received_at)
        size = len(entry)
        waiting.size += size
        self.add_bytes += size
        server.add_bytes += size

    async def _holding_add_bytes(self, add: Coroutine[Any, Any, bytes], size: int) -> bytes:
        """An add that waits for its ledger's admission lookup counts, all the while, toward the same add-byte
        limits as one waiting for its commit: it holds its body just the same."""
        self.add_bytes += size
        self.server.add_bytes += size
        try:
            return await add
        finally:
            self.add_bytes -= size
            self.server.release_adds(size)

    def _adds_synced(self, synced: asyncio.Future[None]) -> None:
        """Answer every add of this connection that waited for this group commit."""
        adds = self._adds.pop(synced)
        error = synced.exception() if not synced.cancelled() else errors.ShuttingDown("cancelled while shutting down")
        if error is None:
            self._send(b"".join(adds.acks))
            self.server.metrics.observe_adds(adds.size, time.perf_counter(), adds.starts)
        else:
            status = error.status if isinstance(error, errors.StatusError) else Status.INTERNAL_ERROR
            log.error("%d adds from %s failed: %s", len(adds.acks), self.peer, error)
            for ack in adds.acks:
                request_id, ledger_id = wire.ADD_RESPONSE.unpack(ack)[4:6]
                self.server.metrics.count_error(Op.ADD_ENTRY, status)
                message = f"ADD_ENTRY for ledger {ledger_id}: {error}"
                self._send(wire.encode_error(Op.ADD_ENTRY, request_id, status, message))
        self.add_bytes -= adds.size
        self.server.release_adds(adds.size)
        self._finished(len(adds.acks))

    def _step(self, request: Coroutine[Any, Any, bytes], frame: wire.Frame, _: object = None) -> None:
        """Drive one request's coroutine without a Task.

        A Task per request costs several event-loop callbacks; here a request that needs no I/O (most reads) is
        answered before data_received returns, and an add resumes straight from its journal future's callback.
        Requests must therefore only await futures (never need asyncio.current_task()), which storage honours.
        """
        try:
            waiting = request.send(None)
        except StopIteration as finished:
            self._send(wire.encode_response(frame.op, frame.request_id, Status.OK, finished.value))
        except (Exception, asyncio.CancelledError) as exc:
            self._failed(frame, exc)
        else:
            if waiting is None:  # a bare yield (asyncio.sleep(0)): just run again on the next turn
                self._loop.call_soon(self._step, request, frame)
            else:
                waiting._asyncio_future_blocking = False
                waiting.add_done_callback(functools.partial(self._step, request, frame))
            return
        self._finished()

    def _failed(self, frame: wire.Frame, exc: BaseException) -> None:
        """Answer a request that raised; a malformed body closes the connection."""
        if isinstance(exc, wire.ProtocolError):
            self._reject(frame.op, frame.request_id, Status.BAD_REQUEST, f"{Op(frame.op).name}: {exc}")
        elif isinstance(exc, wire.InvalidField):
            self._answer_error(frame, Status.BAD_REQUEST, exc)
        elif isinstance(exc, errors.StatusError):
            if exc.status == Status.INTERNAL_ERROR:
                log.error("%s from %s failed: %s", _describe(frame), self.peer, exc)
            self._answer_error(frame, exc.status, exc)
        elif isinstance(exc, asyncio.CancelledError):
            self._answer_error(frame, Status.SHUTTING_DOWN, "cancelled while the bookie shuts down")
        else:
            log.error("%s from %s failed", _describe(frame), self.peer, exc_info=exc)
            self._answer_error(frame, Status.INTERNAL_ERROR, exc)

    def _answer_error(self, frame: wire.Frame, status: Status, exc: Exception | str) -> None:
        self.server.metrics.count_error(frame.op, status)
        self._send(wire.encode_error(frame.op, frame.request_id, status, f"{_describe(frame)}: {exc}"))

    def _finished(self, count: int = 1) -> None:
        self.in_flight -= count
        if self.buffer or self._eof:
            self._process()  # requests that waited for room (in flight, add bytes), or the end of the stream
        elif self._reading_paused:
            self._update_reading()
        if not self.in_flight and self.server.stopping:
            self._loop.call_soon(self.close_after_flush)

    def _update_reading(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        should_pause = (
            self._writing_paused
            or self._admission_blocked
            or self.in_flight >= self.server.max_in_flight
            or self._outgoing_bytes >= self.server.limits.max_pending_response_bytes
        )
        if should_pause and not self._reading_paused:
            self.transport.pause_reading()
        elif not should_pause and self._reading_paused:
            self.transport.resume_reading()
        self._reading_paused = should_pause

    # --- answers ----------------------------------------------------------------------------------------------

    def _send(self, response: bytes) -> None:
        if not self._outgoing:
            self._loop.call_soon(self._flush)
        self._outgoing.append(response)
        self._outgoing_bytes += len(response)

    def _flush(self) -> None:
        """One write per event-loop turn for every response completed in it; then go on with requests that
        waited for these answers to leave (unless the socket's buffer is full: resume_writing goes on then)."""
        if not self._outgoing:
            return
        outgoing, self._outgoing = self._outgoing, []
        self._outgoing_bytes = 0
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(outgoing))
            if self._processing:
                return
            if self.buffer:
                self._process()
            elif self._reading_paused:
                self._update_reading()  # paused while these answers waited: read on

    def _reject_prefix(self, length: int, rest: bytearray, exc: wire.ProtocolError) -> None:
        """A length prefix that cannot start a frame: too large (TOO_LARGE) or shorter than a header."""
        status = Status.TOO_LARGE if length > wire.MAX_FRAME_SIZE else Status.BAD_REQUEST
        op, request_id = 0, 0
        if length >= wire.HEADER_SIZE and len(rest) >= wire.HEADER_SIZE:
            _, op, _, request_id = wire.REQUEST_HEADER.unpack_from(rest)
        self._reject(op, request_id, status, str(exc))

    def _reject(self, op: int, request_id: int, status: Status, message: str) -> None:
        """Answer a broken frame once and close this connection; other connections never notice."""
        if self._rejected:
            return
        self._rejected = True
        log.warning("closing connection from %s: %s", self.peer, message)
        self.server.metrics.count_error(op, status)
        self._send(wire.encode_error(op, request_id, status, message))
        self.buffer.clear()
        self._loop.call_soon(self.close_after_flush)

    def close_after_flush(self) -> None:
        if self._outgoing:
            self._flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
