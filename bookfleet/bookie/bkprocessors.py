"""Apache BookKeeper's protocol served by the bookie: one processor per V2 and V3 operation, as BookKeeper has.

A connection that opens with a V2 or V3 frame (`bkwire.frame_protocol`) gets a session of that protocol
(`V2Session`, `V3Session`); the `Connection` keeps doing what is common to every protocol (framing, limits,
backpressure, answers in completion order), the session decodes each frame, checks every field
(`bkwire.check_v2_request` / `check_v3_request`) and starts the operation's processor, which calls the storage
calls every protocol shares (`serving.Server.add_entry`, `fence`, `write_lac`, `wait_for_lac`, the storage's reads).
A processor raises the bookie's own errors; the session turns them into the protocol's status (`bkwire.status_codes`),
answered with the request's ids (V2) or txnId (V3). A frame that cannot be read closes the connection, as a
BookKeeper bookie's decoder does.

What differs from a BookKeeper bookie, on purpose: adds are always synced before they are answered (a V3 add's
DEFERRED_SYNC write flag is ignored), high priority (V2 flag, V3 header priority) changes nothing, a read-only
bookie refuses every other add (BookKeeper lets high-priority adds through when it has room), and a WRITE_LAC's
digest-signed body, which READ_LAC hands back beside the last entry, is kept in memory only (BookKeeper journals it).
A read-only bookie takes a recovery add into its disk's reserve under bookfleet's rule (the entry's stored ensemble
names it).

bookfleet's own client speaks V3 with bookfleet's extensions (bkprotocol.py, numbers from 1000): an add's writer
epoch (absent, 0, from a stock client, which fences by recovery alone), RAISE_EPOCH and READ_RANGE, the error
message of a refusal and a read-only bookie's state in GET_BOOKIE_INFO. The V3 add has a fast path
(bookie/connection.py) that applies it at once and answers it with its group commit; these processors take the adds
that need more (roles, an admission lookup, a read-only bookie's reserve).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from bookfleet import bkwire, wire
from bookfleet.bkprotocol import AddFlag, BookieInfoWanted, OperationType, ReadFlag, StatusCode
from bookfleet.bkprotocol import OperationType as Op
from bookfleet.bkwire import V2Flag, V2Op, V2Request, V2Status, V3Request
from bookfleet.bookie import errors
from bookfleet.bookie.serving import AddRun, Peer, Server
from bookfleet.security import roles
from bookfleet.wire import Status

log = logging.getLogger(__name__)

V2_BATCH_MAX_FRAME = 5 * 1024 * 1024
"""The largest BATCH_READ answer: BookKeeper's default frame limit (nettyMaxFrameSizeBytes), what a stock client
accepts."""
BATCH_READ_MAX_ENTRIES = 10_000
"""Entries one BATCH_READ answer may carry, whatever count it asked for (0 asks for no limit)."""
_V2_ANSWER_HEAD = bkwire.V2_RESPONSE.size + 8
"""A BATCH_READ answer's frame before its entries: length prefix, header, rc, ids, request id."""


class SessionConnection(Peer, Protocol):
    """What a session uses of its connection (bookie/connection.py's Connection, which makes the session): its
    server, its peer, and the running, holding and answering of requests common to every protocol."""

    server: Server
    principal: roles.Principal | None
    peer: str
    in_flight: int

    def holding_add_bytes(self, add: Coroutine[Any, Any, bytes], size: int) -> Coroutine[Any, Any, bytes]: ...

    def step(self, request: Coroutine[Any, Any, bytes], answer: Callable[[BaseException | None, bytes], None]) -> None:
        ...

    def send(self, response: bytes) -> None: ...

    def close_unreadable(self, message: str) -> None: ...

    def start_tls_after_answer(self) -> None: ...


def status_of(exc: BaseException) -> Status:
    """The bookie's status for what a processor raised (an unexpected error is INTERNAL_ERROR)."""
    if isinstance(exc, errors.StatusError):
        return exc.status
    if isinstance(exc, wire.InvalidField):
        return Status.BAD_REQUEST
    if isinstance(exc, asyncio.CancelledError):
        return Status.SHUTTING_DOWN
    return Status.INTERNAL_ERROR


def _authorize(conn: SessionConnection, op: Op, special: bool = False) -> None:
    """The role check of a TLS peer, with bookfleet's permission table (the same rights, whatever the protocol)."""
    if conn.principal is not None:
        try:
            roles.authorize(conn.principal, op, special)
        except roles.Forbidden as exc:
            raise errors.RoleForbidden(str(exc)) from None


async def _add(
    conn: SessionConnection, entry: bytes, master_key: bytes, recovery: bool, ledger_id: int, entry_id: int,
    writer_epoch: int = 0,
) -> None:
    """An add of either protocol: roles, the admission lookups when it needs them (a read-only bookie's reserve for
    a recovery add among them), then the shared add path; returns once the entry is durable."""
    _authorize(conn, Op.ADD_ENTRY, recovery)
    server = conn.server
    reserved = False
    if server.add_needs_check(ledger_id, recovery, conn.principal):
        reserved = await server.admit_add(ledger_id, entry_id, len(entry), recovery, conn.principal)
    lac = wire.entry_ids(entry)[2]
    await server.add_entry(entry, master_key, recovery, ledger_id, entry_id, lac, reserved, writer_epoch)


async def _read(conn: SessionConnection, ledger_id: int, entry_id: int, fence_key: bytes | None) -> bytes:
    """A read of either protocol, fencing first with `fence_key`; entry -1 is the last entry stored here."""
    _authorize(conn, Op.READ_ENTRY, fence_key is not None)
    server = conn.server
    if fence_key is not None:
        await server.fence(ledger_id, fence_key)
    if entry_id == wire.INVALID_ENTRY_ID:
        entry_id = server.storage.last_entry_id(ledger_id)
        if entry_id == wire.INVALID_ENTRY_ID:
            raise errors.NoSuchEntry(ledger_id, wire.INVALID_ENTRY_ID)
    entry = await server.storage.read_entry(ledger_id, entry_id)
    server.metrics.observe_read(len(entry))
    return entry


class _Session:
    """What both protocols' sessions share: starting a processor on the connection and answering what it raised."""

    _OPERATION: dict[int, Op]
    """Each operation's V3 equivalent, for the error metrics."""

    def __init__(self, conn: SessionConnection):
        self.conn = conn

    def _start(self, processor: Coroutine[Any, Any, bytes], answer: Callable[[Status, str], bytes], op: int,
               add_size: int = 0) -> None:
        """Run `processor` (whose result is the whole answer frame); `answer(status, message)` frames its refusal."""
        conn = self.conn
        if conn.server.stopping:
            processor.close()
            processor = self._refuse(errors.ShuttingDown("bookie is shutting down"))
        elif add_size:
            processor = conn.holding_add_bytes(processor, add_size)
        conn.in_flight += 1
        conn.step(processor, functools.partial(self._answered, answer, op))

    @staticmethod
    async def _refuse(exc: Exception) -> bytes:
        raise exc

    def _answered(
        self, answer: Callable[[Status, str], bytes], op: int, exc: BaseException | None, frame: bytes
    ) -> None:
        conn = self.conn
        if exc is None:
            conn.send(frame)
            return
        if isinstance(exc, wire.ProtocolError):
            conn.close_unreadable(str(exc))
            return
        status = status_of(exc)
        if status == Status.INTERNAL_ERROR and not isinstance(exc, errors.StatusError):
            log.error("BookKeeper request from %s failed", conn.peer, exc_info=exc)
        elif status == Status.INTERNAL_ERROR:
            log.error("BookKeeper request from %s failed: %s", conn.peer, exc)
        conn.server.metrics.count_error(self._OPERATION.get(op, 0), status)
        conn.send(answer(status, str(exc)))


class V2Session(_Session):
    """A V2 connection: requests matched by (ledger, entry, op), answers repeating them."""

    _OPERATION = {V2Op.ADD: Op.ADD_ENTRY, V2Op.READ: Op.READ_ENTRY, V2Op.BATCH_READ: Op.READ_RANGE}
    min_frame = bkwire.V2_MIN_FRAME
    decode = staticmethod(bkwire.decode_v2_request)

    def __init__(self, conn: SessionConnection):
        super().__init__(conn)
        self.add_reader = bkwire.AddReader(bkwire.Protocol.V2)
        """Reads this connection's adds in place (the connection's fast path)."""

    @staticmethod
    def checked_add(request: V2Request) -> None:
        """None: the reader reads every V2 add the checks accept; what it does not read goes the generic way."""

    @staticmethod
    def add_acks(run: AddRun) -> bytes:
        return bkwire.encode_v2_add_acks(run.writer.ledger_id, run.entry_ids)

    @staticmethod
    def add_refusal(run: AddRun, index: int, status: Status, message: str) -> bytes:
        """V2 has no field for the message: the rc alone."""
        rc = bkwire.status_codes(status)[0]
        return bkwire.encode_v2_response(V2Op.ADD, rc, run.writer.ledger_id, run.entry_ids[index])

    @staticmethod
    def is_add(request: V2Request) -> bool:
        return request.op == V2Op.ADD

    def start(self, request: V2Request, size: int) -> None:
        if request.op == V2Op.AUTH:
            self.conn.send(bkwire.encode_v2_auth_response(bkwire.auth_disabled_answer()))
            return
        processor = {V2Op.ADD: self._add, V2Op.READ: self._read, V2Op.BATCH_READ: self._batch_read}[request.op]
        self._start(
            self._checked(processor, request), functools.partial(self._refusal, request), request.op,
            size if request.op == V2Op.ADD else 0,
        )

    @staticmethod
    async def _checked(processor, request: V2Request) -> bytes:
        bkwire.check_v2_request(request)
        return await processor(request)

    @staticmethod
    def _refusal(request: V2Request, status: Status, message: str) -> bytes:
        """V2 has no field for the message: the rc alone."""
        rc = bkwire.status_codes(status)[0]
        if request.op == V2Op.BATCH_READ:
            return bkwire.encode_v2_batch_response(rc, request.ledger_id, request.entry_id, request.request_id, [])
        return bkwire.encode_v2_response(request.op, rc, request.ledger_id, request.entry_id)

    async def _add(self, request: V2Request) -> bytes:
        recovery = bool(request.flags & V2Flag.RECOVERY_ADD)
        await _add(self.conn, request.entry, request.master_key, recovery, request.ledger_id, request.entry_id)
        return bkwire.encode_v2_response(V2Op.ADD, V2Status.EOK, request.ledger_id, request.entry_id)

    async def _read(self, request: V2Request) -> bytes:
        entry = await _read(self.conn, request.ledger_id, request.entry_id, request.master_key)
        return bkwire.encode_v2_response(V2Op.READ, V2Status.EOK, request.ledger_id, request.entry_id, entry)

    async def _batch_read(self, request: V2Request) -> bytes:
        """Consecutive entries from entry_id on, as many as max_count (0 or less: no limit) and max_size allow (the
        answer's whole frame, BookKeeper's accounting), always at least the first; a missing first entry is the
        error, a later gap ends the batch."""
        first = await _read(self.conn, request.ledger_id, request.entry_id, request.master_key)
        count = request.max_count if 0 < request.max_count <= BATCH_READ_MAX_ENTRIES else BATCH_READ_MAX_ENTRIES
        max_size = min(request.max_size, V2_BATCH_MAX_FRAME)
        entries, size = [first], _V2_ANSWER_HEAD + 4 + len(first)
        if count > 1 and size < max_size:
            rest = await self.conn.server.storage.read_range(
                request.ledger_id, request.entry_id + 1, request.entry_id + count - 1, max_size - size, count - 1
            )
            for expected, entry in enumerate(rest, request.entry_id + 1):
                size += 4 + len(entry)
                if size > max_size or wire.entry_ids(entry)[1] != expected:
                    break
                entries.append(entry)
        self.conn.server.metrics.observe_read(size, count=len(entries))
        return bkwire.encode_v2_batch_response(
            V2Status.EOK, request.ledger_id, request.entry_id, request.request_id, entries
        )


_OPERATIONS = frozenset(OperationType)


class V3Session(_Session):
    """A V3 connection: protobuf requests, answered with their txnId."""

    _OPERATION = {operation: operation for operation in OperationType}
    min_frame = 1
    decode = staticmethod(bkwire.decode_v3_request)

    def __init__(self, conn: SessionConnection):
        super().__init__(conn)
        self.add_reader = bkwire.AddReader(bkwire.Protocol.V3)
        """Reads this connection's adds in place when laid out as bookfleet's client writes them."""
        self._processors = {
            OperationType.ADD_ENTRY: self._add,
            OperationType.READ_ENTRY: self._read,
            OperationType.READ_LAC: self._read_lac,
            OperationType.WRITE_LAC: self._write_lac,
            OperationType.FORCE_LEDGER: self._force_ledger,
            OperationType.GET_BOOKIE_INFO: self._bookie_info,
            OperationType.AUTH: self._auth,
            OperationType.START_TLS: self._start_tls,
            OperationType.RAISE_EPOCH: self._raise_epoch,
            OperationType.READ_RANGE: self._read_range,
        }

    @staticmethod
    def is_add(request: V3Request) -> bool:
        return request.operation == OperationType.ADD_ENTRY

    def start(self, request: V3Request, size: int) -> None:
        self._start(
            self._answer(request), functools.partial(self.refusal, request), request.operation,
            size if self.is_add(request) else 0,
        )

    async def _answer(self, request: V3Request) -> bytes:
        bkwire.check_v3_request(request)
        response = bkwire.v3_response(request.operation, request.txn_id, StatusCode.EOK)
        await self._processors[request.operation](request.fields, response)
        return bkwire.encode_v3(response)

    checked_add = staticmethod(bkwire.checked_add_fields)

    @staticmethod
    def add_acks(run: AddRun) -> bytes:
        return bkwire.encode_v3_add_acks(run.writer.ledger_id, run.txns, run.entry_ids)

    def add_refusal(self, run: AddRun, index: int, status: Status, message: str) -> bytes:
        request = bkwire.add_request_of(run.txns[index], run.writer.ledger_id, run.entry_ids[index])
        return self.refusal(request, status, message)

    @staticmethod
    def refusal(request: V3Request, status: Status, message: str) -> bytes:
        """The answer refusing `request`; its message names the operation and ledger (`ADD_ENTRY for ledger 5: ...`)."""
        name = OperationType(request.operation).name if request.operation in _OPERATIONS else str(request.operation)
        ledger_id = getattr(request.fields, "ledgerId", None) if request.fields is not None else None
        about = name if ledger_id is None else f"{name} for ledger {ledger_id}"
        return bkwire.encode_v3(bkwire.v3_refusal(request, bkwire.status_codes(status)[1], f"{about}: {message}"))

    async def _add(self, fields, response) -> None:
        recovery = fields.flag == AddFlag.RECOVERY_ADD
        await _add(
            self.conn, fields.body, fields.masterKey, recovery, fields.ledgerId, fields.entryId, fields.writerEpoch
        )
        response.addResponse.SetInParent()
        answer = response.addResponse
        answer.status, answer.ledgerId, answer.entryId = StatusCode.EOK, fields.ledgerId, fields.entryId

    async def _read(self, fields, response) -> None:
        """A read, a fencing read, or a long poll (previousLAC without fencing): wait up to timeOut for the LAC to
        pass previousLAC, then read the entry asked for, or with ENTRY_PIGGYBACK (entry -1) the entry after
        previousLAC if the LAC passed it. The answer carries the LAC this bookie knows (maxLAC)."""
        conn, ledger_id, entry_id = self.conn, fields.ledgerId, fields.entryId
        storage = conn.server.storage
        answer = response.readResponse
        answer.status, answer.ledgerId, answer.entryId = StatusCode.EOK, ledger_id, entry_id
        fencing = fields.flag == ReadFlag.FENCE_LEDGER
        if not fencing and fields.HasField("previousLAC"):
            previous = fields.previousLAC
            if fields.HasField("timeOut"):
                await conn.server.wait_for_lac(conn, ledger_id, previous, fields.timeOut / 1000)
            if fields.flag == ReadFlag.ENTRY_PIGGYBACK:
                if entry_id != wire.INVALID_ENTRY_ID:
                    raise wire.InvalidField(f"ENTRY_PIGGYBACK reads entry -1, not {entry_id}")
                answer.maxLAC = known = storage.lac(ledger_id)
                if known > previous:
                    try:
                        answer.body = await _read(conn, ledger_id, previous + 1, None)
                    except errors.NoSuchEntry:
                        return
                    answer.entryId = previous + 1
                return
        answer.body = await _read(conn, ledger_id, entry_id, fields.masterKey if fencing else None)
        if not fencing:
            answer.maxLAC = storage.lac(ledger_id)

    async def _read_lac(self, fields, response) -> None:
        _authorize(self.conn, Op.READ_LAC)
        answer = response.readLacResponse
        answer.status, answer.ledgerId = StatusCode.EOK, fields.ledgerId
        if lac_body := self.conn.server.storage.explicit_lac_body(fields.ledgerId):
            answer.lacBody = lac_body
        answer.lastEntryBody = await _read(self.conn, fields.ledgerId, wire.INVALID_ENTRY_ID, None)

    async def _write_lac(self, fields, response) -> None:
        _authorize(self.conn, Op.WRITE_LAC)
        server = self.conn.server
        if server.read_only is not None:
            raise errors.ReadOnly(f"bookie is read-only: {server.read_only}")
        await server.write_lac(fields.ledgerId, fields.lac, fields.masterKey, fields.body)
        answer = response.writeLacResponse
        answer.status, answer.ledgerId = StatusCode.EOK, fields.ledgerId

    async def _force_ledger(self, fields, response) -> None:
        _authorize(self.conn, Op.FORCE_LEDGER)
        await self.conn.server.storage.force(fields.ledgerId)
        answer = response.forceLedgerResponse
        answer.status, answer.ledgerId = StatusCode.EOK, fields.ledgerId

    async def _bookie_info(self, fields, response) -> None:
        _authorize(self.conn, Op.GET_BOOKIE_INFO)
        free, total = self.conn.server.space()
        answer = response.getBookieInfoResponse
        answer.status = StatusCode.EOK
        if fields.requested & BookieInfoWanted.FREE_DISK_SPACE:
            answer.freeDiskSpace = free
        if fields.requested & BookieInfoWanted.TOTAL_DISK_CAPACITY:
            answer.totalDiskCapacity = total
        answer.readOnly = self.conn.server.read_only is not None  # always set: a client tells bookfleet's bookies by it

    async def _raise_epoch(self, fields, response) -> None:
        """bookfleet's RAISE_EPOCH: answered with the bookie's LAC and last entry once the epoch is durable."""
        _authorize(self.conn, Op.RAISE_EPOCH)
        lac, last = await self.conn.server.raise_writer_epoch(fields.ledgerId, fields.writerEpoch, fields.masterKey)
        answer = response.raiseEpochResponse
        answer.status, answer.ledgerId, answer.lac, answer.lastEntryId = StatusCode.EOK, fields.ledgerId, lac, last

    async def _read_range(self, fields, response) -> None:
        """bookfleet's READ_RANGE: the present entries of the span, within the server's caps."""
        _authorize(self.conn, Op.READ_RANGE)
        entries = await self.conn.server.read_range(
            fields.ledgerId, fields.firstEntryId, fields.lastEntryId, fields.maxBytes
        )
        answer = response.readRangeResponse
        answer.status, answer.ledgerId = StatusCode.EOK, fields.ledgerId
        answer.entries.extend(entries)

    async def _auth(self, fields, response) -> None:
        """Authentication is off (BookKeeper's default provider): any AUTH is answered so, and the client goes on."""
        response.authResponse.ParseFromString(bkwire.auth_disabled_answer())

    async def _start_tls(self, fields, response) -> None:
        """START_TLS on a plain connection: the answer, then the handshake (the certificate's roles apply from
        then on); refused by a bookie without TLS, as by a BookKeeper bookie, and on a connection already TLS."""
        conn = self.conn
        if conn.server.tls is None:
            raise errors.BadRequest("START_TLS: this bookie serves no TLS")
        if conn.principal is not roles.BEFORE_TLS:
            raise errors.BadRequest("START_TLS: this connection speaks TLS already")
        response.startTLSResponse.SetInParent()
        conn.start_tls_after_answer()
