"""One pipelined TCP connection to one bookie: request ids, futures, typed calls per op.

Requests are written as soon as they are made and answered in whatever order the bookie completes them; a reader
(the protocol's `data_received`) resolves the matching future. There is no per-request lock: the event loop is the
only writer, so the connection is as cheap as the wire format allows.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bookfleet import wire
from bookfleet.security import tls as tlsconfig
from bookfleet.security.roles import Principal, Role
from bookfleet.wire import Op, Status


class BookieError(Exception):
    """A bookie answered with a status other than OK; `message` is the bookie's own explanation."""

    status: Status = Status.INTERNAL_ERROR

    def __init__(self, status: Status, message: str):
        super().__init__(f"{status.name}: {message}")
        self.status = status
        self.message = message

    @staticmethod
    def from_status(status: int, message: str) -> BookieError:
        try:
            status = Status(status)
        except ValueError:
            return BookieError(Status.INTERNAL_ERROR, f"unknown status {status}: {message}")
        return _ERROR_CLASSES.get(status, BookieError)(status, message)


class NoSuchLedgerOnBookieError(BookieError):
    pass


class NoSuchEntryError(BookieError):
    pass


class FencedError(BookieError):
    pass


class UnauthorizedError(BookieError):
    pass


class ReadOnlyError(BookieError):
    pass


class BadRequestError(BookieError):
    pass


class TooLargeError(BookieError):
    pass


class ShuttingDownError(BookieError):
    pass


_ERROR_CLASSES: dict[Status, type[BookieError]] = {
    Status.NO_SUCH_LEDGER: NoSuchLedgerOnBookieError,
    Status.NO_SUCH_ENTRY: NoSuchEntryError,
    Status.FENCED: FencedError,
    Status.UNAUTHORIZED: UnauthorizedError,
    Status.READ_ONLY: ReadOnlyError,
    Status.BAD_REQUEST: BadRequestError,
    Status.TOO_LARGE: TooLargeError,
    Status.SHUTTING_DOWN: ShuttingDownError,
}


@dataclass(frozen=True, slots=True)
class BookieSpace:
    """What GET_BOOKIE_INFO answers: free and total bytes of the bookie's ledger storage, and its state."""

    free_bytes: int
    total_bytes: int
    state: wire.BookieState


def parse_address(address: str) -> tuple[str, int]:
    """HOST:PORT -> (host, port), with an error that names the bad address."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bookie address {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


WRITE_BUFFER_HIGH = 4 * 1024 * 1024
"""Callers wait while more than this is queued for the socket, so a slow bookie cannot grow memory unbounded."""

FLUSH_BYTES = 64 * 1024
"""Requests made in one event-loop turn are written together, but never more than about this much at once: a turn
that answers a whole group commit's acks makes one new add per ack, and the bookie should start on the first of
them while the client is still making the rest (written all at the end, client and bookie took turns idling)."""


class _ClientProtocol(asyncio.Protocol):
    """Splits incoming frames and hands each to the client; pauses writers while the socket buffer is full."""

    def __init__(self, address: str, tls: bool = False):
        self.address = address
        self.tls = tls
        self.answered = False
        self.client: BookieClient | None = None
        self.buffer = bytearray()
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.on_writable: list[Callable[[], None]] = []
        """Called once when the socket's buffer drains (or the connection is lost): see `when_writable`."""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.answered = True
        if self.client is None:  # nothing was asked yet; keep the bytes until the client is bound
            return
        try:
            wire.take_frames(self.buffer, self.client._answer)  # response and request heads share a layout
        except wire.ProtocolError as exc:
            self.client._fail(ConnectionError(f"bookie {self.address} sent a bad frame: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc else ""
        if self.tls and not self.answered:
            reason += (
                " before any answer; a bookie refuses a client certificate this way (not signed by the cluster CA, "
                "or expired): its log names the reason"
            )
        if self.client is not None:
            self.client._fail(ConnectionError(f"connection to bookie {self.address} lost{reason}"))
        self.resume_writing()

    def pause_writing(self) -> None:
        self.can_write.clear()
        if self.client is not None:
            self.client.backed_up = True

    def resume_writing(self) -> None:
        self.can_write.set()
        if self.client is not None:
            self.client.backed_up = False
        waiting, self.on_writable = self.on_writable, []
        for callback in waiting:
            callback()


AnswerCallback = Callable[[Any, BaseException | None], None]
"""`on_answer(arg, error)` of an add sent with `add_entry_callback`: error is None once the entry is durable."""
_Waiter = asyncio.Future | tuple[AnswerCallback, Any]
"""What waits for a request's answer: a future of the response body, or (on_answer, arg) of a callback add."""


_OK, _ADD_ENTRY, _RECOVERY_ADD = int(Status.OK), int(Op.ADD_ENTRY), int(wire.Flag.RECOVERY_ADD)
"""Plain ints for the per-add work (an enum attribute costs a lookup each time)."""
_ACK_BODY_SIZE = wire.LEDGER_ENTRY.size
_pack_frame_head, _HEADER_SIZE, _VERSION = wire.FRAME_HEAD.pack, wire.HEADER_SIZE, wire.PROTOCOL_VERSION
"""wire.encode_request_head without its Python call, for every request."""
_MAX_BODY_SIZE = wire.MAX_FRAME_SIZE - wire.HEADER_SIZE


def _settle(waiter: _Waiter, error: BaseException) -> None:
    """Fail a request's waiter with `error` (a future its caller gave up on is left alone)."""
    if type(waiter) is tuple:
        waiter[0](waiter[1], error)
    elif not waiter.done():
        waiter.set_exception(error)


class BookieClient:
    """A pipelined connection to one bookie. Create with `await BookieClient.connect("host:port")`."""

    def __init__(self, address: str, transport: asyncio.Transport, protocol: _ClientProtocol):
        self.address = address
        self._transport = transport
        self._protocol = protocol
        self._pending: dict[int, _Waiter] = {}
        self._ids = itertools.count(1)
        self._error: ConnectionError | None = None
        self.closed = False
        """Whether the connection failed or was closed. This and `backed_up` are plain attributes, not properties:
        the ledger writer reads them for every add it sends."""
        self.backed_up = not protocol.can_write.is_set()
        """Whether more than WRITE_BUFFER_HIGH waits for the socket: a sender that respects backpressure waits."""
        self._outgoing: list[bytes] = []
        self._outgoing_bytes = 0
        self._loop = asyncio.get_running_loop()

    @classmethod
    async def connect(
        cls,
        address: str,
        timeout: float = 10.0,
        tls: tlsconfig.ReloadingContext | None = None,
        bookie_id: str | None = None,
    ) -> BookieClient:
        """Connect over mutual TLS with `tls`, or with the process's identity from `$BOOKFLEET_TLS_DIR`; plain TCP
        when there is neither. Over TLS the peer must be a bookie: its certificate carries the `bookie` role and
        names `bookie_id`'s host (its stable DNS id, whatever address it registered), or the dialled host."""
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        tls = tls or tlsconfig.client_context()
        ssl_options = {}
        if tls is not None:
            tls.refresh()
            server_name = tlsconfig.bookie_host(bookie_id) if bookie_id else host
            ssl_options = {"ssl": tls.context, "server_hostname": server_name}
        try:
            transport, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _ClientProtocol(address, tls is not None), host, port, **ssl_options),
                timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise ConnectionError(f"cannot connect to bookie {address}: {exc or 'timed out'}") from None
        if tls is not None:
            peer = Principal.from_peercert(transport.get_extra_info("peercert") or {})
            if not peer.has(Role.BOOKIE):
                transport.close()
                raise ConnectionError(f"{address} presented {peer.subject}, which is not a bookie certificate")
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        client = cls(address, transport, protocol)
        protocol.client = client
        return client

    def when_writable(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once the socket's buffer has drained or the connection is lost (on the next turn of the
        event loop if it is not backed up now, so the requests queued in this turn are written first)."""
        if self.backed_up:
            self._protocol.on_writable.append(callback)
        else:
            self._loop.call_soon(callback)

    def abort(self, reason: str) -> None:
        """Drop the connection at once, unsent bytes included (a graceful close would wait for a silent bookie to
        take them): every request waiting for an answer fails with ConnectionError and is let go."""
        self._transport.abort()
        self._fail(ConnectionError(f"connection to bookie {self.address} dropped: {reason}"))

    # --- typed operations -------------------------------------------------------------------------------------

    async def add_entry(
        self, master_key: bytes, entry: bytes, recovery: bool = False, writer_epoch: int = 0
    ) -> tuple[int, int]:
        """Store an encoded entry (see wire.encode_entry); returns (ledger_id, entry_id) once it is durable. A bookie
        that knows a newer writer epoch of the ledger refuses it with FencedError (unless `recovery`)."""
        flags = wire.Flag.RECOVERY_ADD if recovery else 0
        body = await self._call(Op.ADD_ENTRY, wire.add_prefix(master_key, writer_epoch) + entry, flags)
        return wire.LEDGER_ENTRY.unpack(body)

    def add_entry_callback(self, body: bytes, on_answer: AnswerCallback, arg: Any, recovery: bool = False) -> None:
        """ADD_ENTRY of `body` = wire.add_prefix (master key, writer epoch) + encoded entry (built once, shared by a
        whole write set, never copied here); `on_answer(arg, None)` once durable or `on_answer(arg, error)`, called
        straight from the reader: no future, no callback object, no event-loop turn. The ledger writer's hot path;
        ignores write backpressure."""
        self._enqueue(_ADD_ENTRY, body, _RECOVERY_ADD if recovery else 0, (on_answer, arg))

    async def read_entry(self, ledger_id: int, entry_id: int, fence_key: bytes | None = None) -> bytes:
        """The encoded entry; with `fence_key` (the ledger's master key) the bookie fences the ledger before it
        answers, so a NoSuchEntry is a promise that it will never accept that entry from the old writer."""
        body = wire.LEDGER_ENTRY.pack(ledger_id, entry_id)
        if fence_key is None:
            return await self._call(Op.READ_ENTRY, body)
        return await self._call(Op.READ_ENTRY, body + fence_key, wire.Flag.FENCE)

    async def read_lac_and_last(
        self, ledger_id: int, fence: bool = False, master_key: bytes | None = None
    ) -> tuple[int, int]:
        """The bookie's (lac, last_entry_id) of a ledger; with `fence`, fences it first (needs the master key)."""
        body = wire.LEDGER_ENTRY.pack(ledger_id, wire.INVALID_ENTRY_ID)
        if fence:
            if master_key is None:
                raise ValueError(f"fencing ledger {ledger_id} needs its master key")
            body += master_key
        answer = await self._call(Op.READ_ENTRY, body, wire.Flag.FENCE if fence else 0)
        return wire.unpack_body(wire.LAC_AND_LAST, answer, "READ_ENTRY -1 response")

    async def read_lac(self, ledger_id: int, previous: int = wire.INVALID_ENTRY_ID, timeout: float = 0.0) -> int:
        """The ledger's LAC; waits up to `timeout` seconds for it to move past `previous` (long poll)."""
        body = wire.READ_LAC_REQUEST.pack(ledger_id, previous, max(0, int(timeout * 1000)))
        (lac,) = wire.unpack_body(wire.LAC, await self._call(Op.READ_LAC, body), "READ_LAC response")
        return lac

    async def raise_writer_epoch(self, master_key: bytes, ledger_id: int, writer_epoch: int) -> tuple[int, int]:
        """Make the bookie refuse adds of writer epochs below `writer_epoch` (durably); returns its (lac,
        last_entry_id) of the ledger as of then. FencedError if it knows a newer epoch or the ledger is fenced."""
        answer = await self._call(
            Op.RAISE_EPOCH, master_key + wire.RAISE_EPOCH_BODY.pack(ledger_id, writer_epoch)
        )
        return wire.unpack_body(wire.LAC_AND_LAST, answer, "RAISE_EPOCH response")

    async def write_lac(self, master_key: bytes, ledger_id: int, lac: int) -> None:
        await self._call(Op.WRITE_LAC, master_key + wire.WRITE_LAC_BODY.pack(ledger_id, lac))

    async def bookie_info(self) -> BookieSpace:
        body = await self._call(Op.GET_BOOKIE_INFO, b"")
        free, total, state = wire.unpack_body(wire.BOOKIE_INFO, body, "GET_BOOKIE_INFO response")
        return BookieSpace(free, total, wire.BookieState(state))

    async def force_ledger(self, ledger_id: int) -> None:
        """Returns once everything added to the ledger before this call is durable."""
        await self._call(Op.FORCE_LEDGER, wire.LEDGER_ID.pack(ledger_id))

    async def read_range(
        self, ledger_id: int, first: int, last: int, max_bytes: int = wire.MAX_FRAME_SIZE // 2
    ) -> list[bytes]:
        """The present entries of [first, last] in order, up to about `max_bytes` (at least one entry)."""
        body = await self._call(Op.READ_RANGE, wire.READ_RANGE_REQUEST.pack(ledger_id, first, last, max_bytes))
        return wire.decode_entry_list(body)

    async def close(self) -> None:
        if not self._transport.is_closing():
            self._transport.close()
        self._fail(ConnectionError(f"connection to bookie {self.address} was closed by this client"))
        await asyncio.sleep(0)

    async def __aenter__(self) -> BookieClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- plumbing ---------------------------------------------------------------------------------------------

    def _request(self, op: Op, body: bytes, flags: int = 0) -> asyncio.Future[bytes]:
        """Queue one request; its future resolves with the response body or fails with BookieError or
        ConnectionError. A caller that gives up just drops the future: the late answer is ignored."""
        future = self._loop.create_future()
        self._enqueue(op, body, flags, future)
        return future

    def _enqueue(self, op: int, body: bytes, flags: int, waiter: _Waiter) -> None:
        if self._error is not None:
            _settle(waiter, self._error)
            return
        if len(body) > _MAX_BODY_SIZE:  # the bookie would close the shared connection
            size = wire.HEADER_SIZE + len(body)
            message = f"{Op(op).name} frame of {size} bytes exceeds the {wire.MAX_FRAME_SIZE}-byte limit; not sent"
            _settle(waiter, TooLargeError(Status.TOO_LARGE, message))
            return
        request_id = next(self._ids)
        self._pending[request_id] = waiter
        if not self._outgoing:
            self._loop.call_soon(self._flush)
        self._outgoing += (_pack_frame_head(_HEADER_SIZE + len(body), _VERSION, op, flags, request_id), body)
        self._outgoing_bytes += len(body)
        if self._outgoing_bytes >= FLUSH_BYTES:
            self._flush()

    async def _call(self, op: Op, body: bytes, flags: int = 0) -> bytes:
        future = self._request(op, body, flags)
        if not self._protocol.can_write.is_set():
            await self._protocol.can_write.wait()
        return await future

    def _flush(self) -> None:
        """Write the requests made in this turn of the event loop (up to FLUSH_BYTES) with one system call (uvloop's
        writelines hands the pieces to writev; asyncio's joins them)."""
        if not self._outgoing:
            return  # written already, when they reached FLUSH_BYTES
        outgoing, self._outgoing, self._outgoing_bytes = self._outgoing, [], 0
        if not self._transport.is_closing():
            self._transport.writelines(outgoing)

    def _answer(self, op: int, status: int, request_id: int, start: int, end: int) -> None:
        """One answer, its body in the protocol's buffer[start:end]: an OK ack of a callback add is passed on without
        reading its body; any other body is copied out for its future or decoded as the bookie's error message."""
        waiter = self._pending.pop(request_id, None)
        if type(waiter) is tuple:
            if status == _OK and op == _ADD_ENTRY and end - start == _ACK_BODY_SIZE:
                waiter[0](waiter[1], None)
                return
            body = self._protocol.buffer[start:end]
            if status == _OK:
                message = f"answered ADD_ENTRY request {request_id} with op {op} and a {len(body)}-byte body"
                _settle(waiter, ConnectionError(f"bookie {self.address} {message}"))
                self._fail(ConnectionError(f"bookie {self.address} {message}"))
            else:
                _settle(waiter, BookieError.from_status(status, body.decode(errors="replace")))
            return
        body = bytes(self._protocol.buffer[start:end])
        if waiter is None:
            if request_id == 0:  # ids start at 1: this is about the connection itself, which the bookie closes
                self._fail(ConnectionError(f"bookie {self.address}: {body.decode(errors='replace')}"))
            return
        if waiter.done():  # the answer to a request its caller gave up on (cancelled or timed out)
            return
        if status == Status.OK:
            waiter.set_result(body)
        else:
            waiter.set_exception(BookieError.from_status(status, body.decode(errors="replace")))

    def _fail(self, error: ConnectionError) -> None:
        if self._error is None:
            self._error = error
            self.closed = True
        if not self._transport.is_closing():
            self._transport.close()
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            _settle(waiter, self._error)
