"""One pipelined TCP connection to one bookie, in Apache BookKeeper's protocol V3: txnIds, futures, typed calls
per op.

Requests are written as soon as they are made and answered in whatever order the bookie completes them; a reader
(the protocol's `data_received`) resolves the matching future. There is no per-request lock: the event loop is the
only writer, so the connection is as cheap as the wire format allows. What BookKeeper lacks rides where a stock
bookie ignores it (bkprotocol.py's fields from 1000 on): an add's writer epoch, the bookie's error message, its
read-only state; RAISE_EPOCH and READ_RANGE are bookfleet operations, sent only to bookfleet bookies: a stock
BookKeeper bookie cannot parse an operation it does not know and closes the connection, failing every request on it.
`speaks_bookfleet` tells them apart by the GET_BOOKIE_INFO answer (a bookfleet bookie's always carries its readOnly
field), asked once per connection, so it holds for every caller, with or without a ZooKeeper session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bookfleet import bkprotocol, bkwire, wire
from bookfleet.bkprotocol import BookieInfoWanted, ReadFlag, StatusCode
from bookfleet.bkprotocol import OperationType as Op
from bookfleet.security import tls as tlsconfig
from bookfleet.security.roles import Principal, Role
from bookfleet.wire import Status


class BookieError(Exception):
    """A bookie answered with a status other than OK; `message` is the bookie's own explanation."""

    status: Status = Status.INTERNAL_ERROR

    def __init__(self, status: Status, message: str):
        super().__init__(f"{status.name}: {message}")
        self.status = status
        self.message = message

    @staticmethod
    def from_status(status: Status, message: str) -> BookieError:
        return _ERROR_CLASSES.get(status, BookieError)(status, message)

    @staticmethod
    def from_answer(response) -> BookieError:
        """The error of a V3 answer whose status is not EOK: its class from the status (bkwire.client_status), its
        message the bookie's own (bookfleet's field) or the status code's name (a stock bookie sends none)."""
        code = response.status
        name = StatusCode(code).name if code in StatusCode._value2member_map_ else f"status {code}"
        message = response.errorMessage or f"{name} from a bookie that gave no message"
        return BookieError.from_status(bkwire.client_status(code), message)


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


class StockBookieError(Exception):
    """A bookfleet operation asked of a stock BookKeeper bookie: refused here, never sent."""


class TooLargeError(BookieError):
    """A request larger than a bookie's frame limit: refused here, never sent (the bookie would close the shared
    connection)."""


_ERROR_CLASSES: dict[Status, type[BookieError]] = {
    Status.NO_SUCH_LEDGER: NoSuchLedgerOnBookieError,
    Status.NO_SUCH_ENTRY: NoSuchEntryError,
    Status.FENCED: FencedError,
    Status.UNAUTHORIZED: UnauthorizedError,
    Status.READ_ONLY: ReadOnlyError,
    Status.BAD_REQUEST: BadRequestError,
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
            self.client._take_answers(self.buffer)
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


_ADD_ENTRY = int(Op.ADD_ENTRY)
"""A plain int for the per-add work (an enum attribute costs a lookup each time)."""
_request_head, _take_ok_add_answers, _varint = bkwire.v3_request_head, bkwire.take_ok_add_answers, bkwire.varint
next_txn: Callable[[], bytes] = bkwire.txn_ids().__next__
"""The next txnId, as its varint's bytes (as the wire carries it): one sequence for every connection of the process,
so a txnId is unique on each, and one encoded add frame, its txnId inside, serves a whole write set. Waiters are
keyed by these bytes, so an ack is matched without decoding its txnId."""
_unpack_length, _LENGTH_SIZE = wire.LENGTH_PREFIX.unpack_from, wire.LENGTH_PREFIX.size
_MAX_FRAME = wire.MAX_FRAME_SIZE
_MAX_FRAME_WITH_LENGTH = _MAX_FRAME + _LENGTH_SIZE
"""The largest request sent, its length prefix included: a bookie's frame limit."""


def _resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
    """The callback behind `add_entry`'s future (a caller that gave up on it is left alone)."""
    if not future.done():
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


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
        self._pending: dict[bytes, _Waiter] = {}
        """Waiters by their request's txnId varint (`next_txn`)."""
        self._error: ConnectionError | None = None
        self.closed = False
        """Whether the connection failed or was closed. This and `backed_up` are plain attributes, not properties:
        the ledger writer reads them for every add it sends."""
        self.backed_up = not protocol.can_write.is_set()
        """Whether more than WRITE_BUFFER_HIGH waits for the socket: a sender that respects backpressure waits."""
        self._outgoing: list[bytes] = []
        self._outgoing_bytes = 0
        self._loop = asyncio.get_running_loop()
        self._bookfleet: bool | None = None
        """Whether the peer is a bookfleet bookie, once `speaks_bookfleet` asked."""

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
            async with asyncio.timeout(timeout):  # not wait_for, which on 3.11 can drop a cancel (design.md)
                transport, protocol = await loop.create_connection(
                    lambda: _ClientProtocol(address, tls is not None), host, port, **ssl_options
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
        ledger_id, entry_id, _ = wire.entry_ids(entry)
        encoder = bkwire.AddRequestEncoder(ledger_id, master_key, writer_epoch, recovery)
        txn = next_txn()
        future = self._loop.create_future()
        self.add_entry_callback(encoder.frame(txn, entry), txn, _resolve, future)
        await self._answered(future)
        return ledger_id, entry_id

    def add_entry_callback(self, frame: bytes, txn: bytes, on_answer: AnswerCallback, arg: Any) -> None:
        """ADD_ENTRY of `frame`, a whole request frame whose header carries `txn` (`next_txn`'s): a
        bkwire.AddRequestEncoder's frame head + the encoded entry, built once and shared by a whole write set, never
        copied here; `on_answer(arg, None)` once durable or `on_answer(arg, error)`, called straight from the reader:
        no future, no callback object, no event-loop turn. Ignores write backpressure."""
        self.enqueue(frame, txn, (on_answer, arg))

    async def read_entry(self, ledger_id: int, entry_id: int, fence_key: bytes | None = None) -> bytes:
        """The encoded entry; with `fence_key` (the ledger's master key) the bookie fences the ledger before it
        answers, so a NoSuchEntry is a promise that it will never accept that entry from the old writer."""
        return (await self._read(ledger_id, entry_id, fence_key)).body

    async def read_lac_and_last(
        self, ledger_id: int, fence: bool = False, master_key: bytes | None = None
    ) -> tuple[int, int]:
        """The bookie's (lac, last_entry_id) of a ledger; with `fence`, fences it first (needs the master key). A
        read of entry -1, answered with the last entry the bookie holds and the LAC it knows (maxLAC, or the entry's
        own without one: a fencing read's answer has none); (-1, -1) when it holds no entry of the ledger."""
        if fence and master_key is None:
            raise ValueError(f"fencing ledger {ledger_id} needs its master key")
        try:
            answer = await self._read(ledger_id, wire.INVALID_ENTRY_ID, master_key if fence else None)
        except NoSuchEntryError:
            return wire.INVALID_ENTRY_ID, wire.INVALID_ENTRY_ID
        _, last, entry_lac = wire.entry_ids(answer.body)
        return (answer.maxLAC if answer.HasField("maxLAC") else entry_lac), last

    async def read_lac(self, ledger_id: int, previous: int = wire.INVALID_ENTRY_ID, timeout: float = 0.0) -> int:
        """The ledger's LAC; waits up to `timeout` seconds for it to move past `previous` (a V3 long poll: a read of
        entry -1 with previousLAC and timeOut, the next entry piggybacked)."""
        request = bkprotocol.ReadRequest(
            ledgerId=ledger_id, entryId=wire.INVALID_ENTRY_ID, previousLAC=previous,
            timeOut=max(0, int(timeout * 1000)), flag=ReadFlag.ENTRY_PIGGYBACK,
        )
        answer = (await self._call(Op.READ_ENTRY, request.SerializeToString())).readResponse
        return answer.maxLAC if answer.HasField("maxLAC") else previous

    async def raise_writer_epoch(self, master_key: bytes, ledger_id: int, writer_epoch: int) -> tuple[int, int]:
        """Make the bookie refuse adds of writer epochs below `writer_epoch` (durably); returns its (lac,
        last_entry_id) of the ledger as of then. FencedError if it knows a newer epoch or the ledger is fenced.
        bookfleet's own operation: StockBookieError from a stock bookie, which is never sent it."""
        await self._require_bookfleet(Op.RAISE_EPOCH)
        request = bkprotocol.RaiseEpochRequest(ledgerId=ledger_id, masterKey=master_key, writerEpoch=writer_epoch)
        answer = (await self._call(Op.RAISE_EPOCH, request.SerializeToString())).raiseEpochResponse
        return answer.lac, answer.lastEntryId

    async def write_lac(self, master_key: bytes, ledger_id: int, lac: int, body: bytes = b"") -> None:
        """The explicit LAC, with `body` its digest-signed copy (wire.Digester.lac_body) for BookKeeper's readers; a
        stock bookie fails a WRITE_LAC without one (bookfleet's readers take the LAC from the bookie's answer)."""
        request = bkprotocol.WriteLacRequest(ledgerId=ledger_id, lac=lac, masterKey=master_key, body=body)
        await self._call(Op.WRITE_LAC, request.SerializeToString())

    async def bookie_info(self) -> BookieSpace:
        wanted = BookieInfoWanted.FREE_DISK_SPACE | BookieInfoWanted.TOTAL_DISK_CAPACITY
        request = bkprotocol.GetBookieInfoRequest(requested=wanted)
        answer = (await self._call(Op.GET_BOOKIE_INFO, request.SerializeToString())).getBookieInfoResponse
        state = wire.BookieState.READ_ONLY if answer.readOnly else wire.BookieState.WRITABLE
        return BookieSpace(answer.freeDiskSpace, answer.totalDiskCapacity, state)

    async def force_ledger(self, ledger_id: int) -> None:
        """Returns once everything added to the ledger before this call is durable."""
        await self._call(Op.FORCE_LEDGER, bkprotocol.ForceLedgerRequest(ledgerId=ledger_id).SerializeToString())

    async def read_range(
        self, ledger_id: int, first: int, last: int, max_bytes: int = wire.MAX_FRAME_SIZE // 2
    ) -> list[bytes]:
        """The present entries of [first, last] in order, up to about `max_bytes` (at least one entry). bookfleet's
        own operation: StockBookieError from a stock bookie, which is never sent it."""
        await self._require_bookfleet(Op.READ_RANGE)
        request = bkprotocol.ReadRangeRequest(
            ledgerId=ledger_id, firstEntryId=first, lastEntryId=last, maxBytes=max_bytes
        )
        return list((await self._call(Op.READ_RANGE, request.SerializeToString())).readRangeResponse.entries)

    async def speaks_bookfleet(self) -> bool:
        """Whether the peer takes bookfleet's own operations: a bookfleet bookie's GET_BOOKIE_INFO answer always
        carries bookfleet's readOnly field, a stock bookie's never. Asked once per connection."""
        if self._bookfleet is None:
            request = bkprotocol.GetBookieInfoRequest(requested=0).SerializeToString()
            answer = (await self._call(Op.GET_BOOKIE_INFO, request)).getBookieInfoResponse
            self._bookfleet = answer.HasField("readOnly")
        return self._bookfleet

    async def _require_bookfleet(self, operation: Op) -> None:
        if not await self.speaks_bookfleet():
            raise StockBookieError(f"bookie {self.address} is a stock BookKeeper bookie: {operation.name} not sent")

    async def _read(self, ledger_id: int, entry_id: int, fence_key: bytes | None):
        request = bkprotocol.ReadRequest(ledgerId=ledger_id, entryId=entry_id)
        if fence_key is not None:
            request.masterKey, request.flag = fence_key, ReadFlag.FENCE_LEDGER
        return (await self._call(Op.READ_ENTRY, request.SerializeToString())).readResponse

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

    def enqueue(self, frame: bytes, txn: bytes, waiter: _Waiter) -> None:
        """Queue one request, `frame` (length prefix included) whose header carries `txn` (`next_txn`'s); `waiter`
        gets the Response or fails with BookieError or ConnectionError: a future, or `(on_answer, arg)` of an add
        (see `add_entry_callback`). A caller that gives up just drops its future: the late answer is ignored. The
        ledger writer's hot path (one call per add and bookie): ignores write backpressure."""
        pending, size = self._pending, len(frame)
        if txn in pending or self._error is not None or size > _MAX_FRAME_WITH_LENGTH:
            self._enqueue_checked(frame, txn, waiter)
            return
        pending[txn] = waiter
        outgoing = self._outgoing
        if not outgoing:
            self._loop.call_soon(self._flush)
        outgoing.append(frame)
        self._outgoing_bytes += size
        if self._outgoing_bytes >= FLUSH_BYTES:
            self._flush()

    def _enqueue_checked(self, frame: bytes, txn: bytes, waiter: _Waiter) -> None:
        """`enqueue`'s rare cases: a failed connection, a frame above the bookie's limit, an add sent again on this
        connection before its first send was answered (a new txnId: only add frames are ever sent twice)."""
        if self._error is not None:
            _settle(waiter, self._error)
        elif len(frame) > _MAX_FRAME_WITH_LENGTH:  # the bookie would close the shared connection
            text = f"request of {len(frame) - _LENGTH_SIZE} bytes exceeds the {wire.MAX_FRAME_SIZE}-byte frame limit"
            _settle(waiter, TooLargeError(Status.TOO_LARGE, text + "; not sent"))
        else:
            txn = next_txn()
            self.enqueue(bkwire.with_txn(frame, txn), txn, waiter)

    async def _call(self, operation: int, message: bytes):
        """The Response to one request, once its status is EOK."""
        future = self._loop.create_future()
        txn = next_txn()
        self.enqueue(_request_head(operation, txn, len(message)) + message, txn, future)
        return await self._answered(future)

    async def _answered(self, future: asyncio.Future):
        """A request's answer, once the socket's buffer is below its limit (callers respect backpressure)."""
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

    def _take_answers(self, buffer: bytearray) -> None:
        """Hand every whole answer at the front of `buffer` to its waiter and take them off (a partial one stays).
        The OK add answers of callback adds are read and answered in C (bkwire.take_ok_add_answers), a socket read's
        run of them in one call; any other answer is parsed whole. ProtocolError on a frame that cannot be an
        answer; those before it were handed over and are taken off, and so is it."""
        while True:
            _take_ok_add_answers(buffer, self._pending)
            if len(buffer) < _LENGTH_SIZE:
                return
            (length,) = _unpack_length(buffer, 0)
            if length > _MAX_FRAME:
                raise wire.ProtocolError(f"answer of {length} bytes exceeds the {_MAX_FRAME}-byte limit")
            if _LENGTH_SIZE + length > len(buffer):
                return
            frame = bytes(buffer[_LENGTH_SIZE : _LENGTH_SIZE + length])
            del buffer[: _LENGTH_SIZE + length]
            self._answer(bkwire.decode_v3_response(frame))

    def _answer(self, response) -> None:
        """Resolve the waiter of one parsed answer: the Response, or the bookie's error."""
        waiter = self._pending.pop(_varint(response.header.txnId), None)
        if waiter is None:
            return  # the answer to a request its caller gave up on, or a stray txnId: nothing waits for it
        if response.status != StatusCode.EOK:
            _settle(waiter, BookieError.from_answer(response))
        elif type(waiter) is tuple:
            if response.header.operation != _ADD_ENTRY:
                message = f"answered ADD_ENTRY request {response.header.txnId} as operation {response.header.operation}"
                self._fail(ConnectionError(f"bookie {self.address} {message}"))
                _settle(waiter, ConnectionError(f"bookie {self.address} {message}"))
            else:
                waiter[0](waiter[1], None)
        elif not waiter.done():  # not cancelled or timed out by its caller
            waiter.set_result(response)

    def _fail(self, error: ConnectionError) -> None:
        """Close the connection and settle every waiter with its error. The waiters leave the very dict the reader
        holds: an answer's callback can fail its own connection (the writer drops a bookie owing too many answers),
        and the answers after it in the same read must find no waiter, not answer one a second time, as durable."""
        if self._error is None:
            self._error = error
            self.closed = True
        if not self._transport.is_closing():
            self._transport.close()
        waiters = list(self._pending.values())
        self._pending.clear()
        for waiter in waiters:
            _settle(waiter, self._error)
