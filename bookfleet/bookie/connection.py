"""One client connection of the bookie's server (`bookfleet.bookie.server`, which holds the limits and the
protocol rules): frames split out of the byte stream, requests started in order within the server's limits, adds
applied at once and answered together per group commit, answers written in completion order. The connection knows
its server only as a `serving.Server` (the add path's admission, apply and release among it). Its first frame
chooses the protocol, BookKeeper's V2 or V3 (a connection that opens with neither is closed); the protocol's session
(bookie/bkprocessors.py) decodes and answers each request through `step`, `send` and `holding_add_bytes`. An add
that needs nothing but its fields (no TLS roles, a writable bookie), V2 or V3, takes the fast path here: read in place
by the session's reader (in C, every whole add of one writer lying in the buffer in one call) into a run of that
writer's adds of the read (`AddRun`), applied with one storage call before anything else of the read starts (a run
of a ledger not held yet, once its one admission lookup answers), and answered with its group commit's other adds,
in one write."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from bookfleet import bkwire, wire
from bookfleet.bkprotocol import OperationType
from bookfleet.bookie import errors
from bookfleet.bookie.bkprocessors import V2Session, V3Session, status_of
from bookfleet.bookie.serving import TLS_HANDSHAKE_TIMEOUT, AddRun, WriterFields
from bookfleet.security import roles
from bookfleet.wire import Status

if TYPE_CHECKING:
    from bookfleet.bookie.serving import AddWriter, Server

log = logging.getLogger(__name__)

_LENGTH_SIZE, _MAX_FRAME_SIZE = wire.LENGTH_PREFIX.size, wire.MAX_FRAME_SIZE


class Connection(asyncio.Protocol):
    """One client connection: frame splitting, requests started in order, bounded in-flight work and write buffer."""

    def __init__(self, server: Server):
        self.server = server
        self.buffer = bytearray()
        self.in_flight = 0
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.long_polls = 0
        self.add_bytes = 0
        """Bytes of this connection's adds waiting for their commit."""
        self.principal: roles.Principal | None = None
        """The authenticated peer (TLS only; roles.BEFORE_TLS until START_TLS); None on a bookie without TLS."""
        self._session: V2Session | V3Session | None = None
        """The protocol's session, chosen by the first frame; None until it arrives."""
        self._outgoing: list[bytes] = []
        self._outgoing_bytes = 0
        self._adds: dict[asyncio.Future[None], list[AddRun]] = {}
        """Adds waiting for each group commit."""
        self._run: AddRun | None = None
        """The adds of one writer read so far from this read, applied together before anything else starts."""
        self._held_runs: dict[int, list[AddRun]] = {}
        """Runs of ledgers this bookie does not hold yet, waiting in order for their ledger's one admission lookup."""
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
        server.connections.add(self)
        server.metrics.connections.inc()
        transport.set_write_buffer_limits(high=server.limits.max_pending_response_bytes)
        if server.tls is not None:
            self._authenticate(transport)

    def _authenticate(self, transport: asyncio.Transport) -> None:
        """The peer's roles: its certificate's on a TLS transport (from the first byte, bookie/accepting.py, or
        after START_TLS), none on a plain one (BookKeeper's clients before their START_TLS)."""
        if transport.get_extra_info("ssl_object") is None:
            self.principal = roles.BEFORE_TLS
            return
        self.principal = roles.Principal.from_peercert(transport.get_extra_info("peercert") or {})
        self.peer += f" ({self.principal.subject})"

    def start_tls_after_answer(self) -> None:
        """START_TLS was accepted: its answer goes out in plain, then the handshake; nothing more is read in plain,
        and the next frame chooses the connection's protocol again (BookKeeper's V2 clients ask START_TLS in V3)."""
        self._handshaking = True
        self._session = None
        self._loop.call_soon(self._upgrade)

    def _upgrade(self) -> None:
        self._flush()
        if self.transport.is_closing():
            return
        if self.buffer:
            self.close_unreadable("data sent after START_TLS before its handshake")
            return
        self.transport.pause_reading()
        self._handshake = self._loop.create_task(self._start_tls(self.transport))

    async def _start_tls(self, transport: asyncio.Transport) -> None:
        """The mutual TLS handshake of a START_TLS; a refused peer is logged with the reason and dropped."""
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
        self._authenticate(secure)
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
        wait in the buffer. The adds of one writer read here in place, as many at once as lie whole in the buffer
        (`_read_run`), are applied together (`_apply_run`), before any other request starts and at the end."""
        if self._processing:  # a request that completed at once, from inside the loop below
            return
        self._processing = True
        buffer = self.buffer
        pos, end = 0, len(buffer)
        unpack_length, server = wire.LENGTH_PREFIX.unpack_from, self.server
        limits = server.limits
        max_in_flight, max_pending = server.max_in_flight, limits.max_pending_response_bytes
        max_connection_add_bytes, max_add_bytes = limits.max_connection_add_bytes, limits.max_add_bytes
        session = self._session
        fast = session is not None and self._fast_adds_allowed()
        reader = session.add_reader if fast else None
        partial = False
        self._admission_blocked = False  # decided again below
        self._received_at = time.perf_counter()
        try:
            while pos < end:
                if self.in_flight >= max_in_flight or self._writing_paused or self._outgoing_bytes >= max_pending:
                    break  # the bound is reached, or answers wait for the client to take them
                if end - pos < _LENGTH_SIZE:
                    partial = True
                    break
                (length,) = unpack_length(buffer, pos)
                if self._session is None:
                    if not self._choose_protocol(buffer, pos, end):
                        partial = not self._rejected
                        break
                    fast = self._fast_adds_allowed()
                    reader = self._session.add_reader if fast else None
                frame_end = pos + _LENGTH_SIZE + length
                if (  # the common case: whole adds laid out as the reader reads them, joining (or starting) a run
                    fast and frame_end <= end and length <= _MAX_FRAME_SIZE
                    and (writer := reader.writer_of(buffer, pos, frame_end)) is not None
                ):
                    if self._run is None or self._run.writer is not writer:
                        self._start_run(writer)
                    room = min(max_connection_add_bytes - self.add_bytes, max_add_bytes - server.add_bytes)
                    if length > room and not self._wait_for_room(length):
                        break
                    pos = self._read_run(reader, buffer, pos, end, room)
                    continue
                if not self._take(buffer, pos, end, length, fast):
                    partial = not self._rejected and not self._admission_blocked
                    break
                pos = frame_end
            self._apply_run()
            if self._rejected:
                return
            del buffer[:pos]
        finally:
            self._processing = False
        self._update_reading()
        if self._eof:
            if partial:
                self.close_unreadable(f"connection ended inside a frame ({len(buffer)} bytes)")
            elif not buffer and not self.in_flight:
                self._loop.call_soon(self.close_after_flush)

    def _choose_protocol(self, buffer: bytearray, pos: int, end: int) -> bool:
        """Choose the connection's session from the byte after its first length prefix (False: not here yet, or
        neither V2 nor V3, and the connection is being closed; or START_TLS was taken, and the next frame comes over
        TLS)."""
        if self._handshaking:
            return False
        if end - pos <= wire.LENGTH_PREFIX.size:
            return False
        first_byte = buffer[pos + wire.LENGTH_PREFIX.size]
        protocol = bkwire.frame_protocol(first_byte)
        if protocol is None:
            self.close_unreadable(f"first frame starts with byte {first_byte:#04x}: neither BookKeeper V2 nor V3")
            return False
        self._session = V2Session(self) if protocol == bkwire.Protocol.V2 else V3Session(self)
        return True

    def _take(self, buffer: bytearray, pos: int, end: int, length: int, fast: bool) -> bool:
        """Decode and start the frame at buffer[pos:] (False: it is not whole yet, it waits for room for its add, or
        it cannot be read and the connection is closed), unless `_process` took it as an add its session's reader
        reads in place. An add counts toward the add-byte limits from the moment it is taken until it is answered.
        With `fast`, an add in another layout joins the run too when its fields pass (the session's `checked_add`)."""
        session = self._session
        if not session.min_frame <= length <= wire.MAX_FRAME_SIZE:
            self.close_unreadable(f"frame of {length} bytes is outside [{session.min_frame}, {wire.MAX_FRAME_SIZE}]")
            return False
        start = pos + wire.LENGTH_PREFIX.size
        if end - start < length:
            return False
        try:
            request = session.decode(bytes(buffer[start : start + length]))  # a copy: the buffer is never pinned
        except wire.ProtocolError as exc:
            self.close_unreadable(str(exc))
            return False
        if session.is_add(request):
            if not self._room_for_add(length):
                return False
            if fast and (add := session.checked_add(request)) is not None and self._joins_run(add):
                self._join_run(add)
                return True
        self._apply_run()  # the adds before it are applied before it starts
        session.start(request, length)
        return True

    def _fast_adds_allowed(self) -> bool:
        """Whether an add may take the fast path, if its fields pass: not when it needs more than its fields (TLS
        roles, a bookie shutting down or read-only)."""
        server = self.server
        return self.principal is None and not server.stopping and server.read_only is None

    def _start_run(self, writer: AddWriter) -> None:
        """Apply the run so far and start one of `writer`'s adds.

        A ledger this bookie does not hold yet (a new ledger's first adds, every copy a repair makes to a replacement)
        is looked up once: its runs wait together, in order, behind that lookup, then are applied as any other run or
        refused with the lookup's error. Taken the generic way instead, each add would be decoded by protobuf and
        answered on its own, and a repair's whole fragment arrives before its lookup answers."""
        self._apply_run()
        admission, ledger_id = self.server.admission, writer.ledger_id
        if admission is not None and ledger_id not in self._held_runs and not admission.admitted(ledger_id):
            self._held_runs[ledger_id] = []
            lookup = self._loop.create_task(admission.admit(ledger_id))
            lookup.add_done_callback(functools.partial(self._admission_answered, ledger_id))
        self._run = AddRun(writer, self._session, self._received_at)

    def _joins_run(self, add: bkwire.AddFields) -> bool:
        """Whether a checked add decoded by protobuf joins the run (same writer's fields) or starts one."""
        _, ledger_id, _, key, _, recovery, writer_epoch, _ = add
        run = self._run
        if run is not None:
            writer = run.writer
            if (writer.ledger_id, writer.master_key, writer.recovery, writer.writer_epoch) == (
                ledger_id, key, recovery, writer_epoch
            ):
                return True
        self._start_run(WriterFields(ledger_id, key, recovery, writer_epoch))
        return True

    def _read_run(self, reader: bkwire.AddReader, buffer: bytearray, pos: int, end: int, room: int) -> int:
        """The run's writer's adds read in place from buffer[pos:] (the first one's room decided already), as many
        as the in-flight and add-byte limits take, held toward them from now on: the position after them."""
        run, server = self._run, self.server
        pos, count, size = reader.read_run(buffer, pos, end, run, server.max_in_flight - self.in_flight, room)
        run.size += size
        self.add_bytes += size
        server.add_bytes += size
        self.in_flight += count
        return pos

    def _join_run(self, add: bkwire.AddFields) -> None:
        """One more add of the run's writer, held toward the add-byte limits and in flight from now on."""
        run, entry = self._run, add[4]
        run.txns.append(add[0])
        run.entry_ids.append(add[2])
        run.lacs.append(add[7])
        run.entries.append(entry)
        size = len(entry)
        run.size += size
        self.add_bytes += size
        self.server.add_bytes += size
        self.in_flight += 1

    def _apply_run(self) -> None:
        """Apply the run read so far (or hold it behind its ledger's admission lookup)."""
        run, self._run = self._run, None
        if run is None or not run.entries:  # none, or its first add waits for room
            return
        held = self._held_runs.get(run.writer.ledger_id)
        if held is not None:  # its ledger's lookup has not answered yet
            held.append(run)
            return
        self._apply(run)

    def _admission_answered(self, ledger_id: int, lookup: asyncio.Task[None]) -> None:
        """Apply the runs held for a ledger's admission lookup, in order, or refuse their adds with its error."""
        error = lookup.exception() if not lookup.cancelled() else errors.ShuttingDown("cancelled while shutting down")
        for run in self._held_runs.pop(ledger_id):
            if error is None:
                self._apply(run)
                continue
            for index in range(len(run.entry_ids)):
                self._refuse_add(run, index, error)
            self._release(run.size, len(run.entry_ids))

    def _apply(self, run: AddRun) -> None:
        """Apply a run's adds together, answered with their group commit; if storage refuses them, one by one."""
        try:
            synced = self.server.add_run(run)
        except (Exception, asyncio.CancelledError):
            self._apply_one_by_one(run)
            return
        self._answer_when_synced(run, synced)

    def _apply_one_by_one(self, run: AddRun) -> None:
        """The adds of a refused run applied in turn, as their own runs: exactly the adds storage takes are taken."""
        server, writer = self.server, run.writer
        adds = zip(run.txns, run.entry_ids, run.lacs, run.entries, strict=True)
        for index, (txn, entry_id, lac, entry) in enumerate(adds):
            try:
                synced = server.add_entry(
                    entry, writer.master_key, writer.recovery, writer.ledger_id, entry_id, lac, False,
                    writer.writer_epoch,
                )
            except (Exception, asyncio.CancelledError) as exc:
                self._refuse_add(run, index, exc)
                self._release(len(entry), 1)
                continue
            single = AddRun(writer, run.answers, run.received_at)
            single.txns.append(txn)
            single.entry_ids.append(entry_id)
            single.lacs.append(lac)
            single.entries.append(entry)
            single.size = len(entry)
            self._answer_when_synced(single, synced)

    def _answer_when_synced(self, run: AddRun, synced: asyncio.Future[None]) -> None:
        waiting = self._adds.get(synced)
        if waiting is None:
            waiting = self._adds[synced] = []
            synced.add_done_callback(self._adds_synced)
        waiting.append(run)

    def _room_for_add(self, size: int) -> bool:
        """Whether an add of `size` bytes fits the add-byte limits (else the connection waits for room to be
        admitted)."""
        server, limits = self.server, self.server.limits
        short_of_room = (
            size > limits.max_connection_add_bytes - self.add_bytes or size > limits.max_add_bytes - server.add_bytes
        )
        return not short_of_room or self._wait_for_room(size)

    def _wait_for_room(self, size: int) -> bool:
        """An add of `size` bytes does not fit the limits as they stand: whether the server admits it anyway (the
        first add of a connection or of all), else the connection waits to be resumed."""
        if self.server.admit_adds(self, size):
            return True
        self._admission_blocked = True
        return False

    def _refuse_add(self, run: AddRun, index: int, error: BaseException) -> None:
        """Answer an add of a run that storage refused (or whose commit failed) with the bookie's status."""
        status = status_of(error)
        if status == Status.INTERNAL_ERROR:
            log.error("ADD_ENTRY for ledger %d from %s failed: %s", run.writer.ledger_id, self.peer, error)
        self.server.metrics.count_error(OperationType.ADD_ENTRY, status)
        self.send(run.answers.add_refusal(run, index, status, str(error)))

    def _release(self, size: int, count: int) -> None:
        """Adds of `size` bytes left the connection's hands (answered or refused)."""
        self.add_bytes -= size
        self.server.release_adds(size)
        self._finished(count)

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

    async def holding_add_bytes(self, add: Coroutine[Any, Any, bytes], size: int) -> bytes:
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
        """Answer every add of this connection that waited for this group commit, written at once: the client makes
        its next adds from these answers (a turn of the loop later is a receive of up to 256 KiB later)."""
        runs = self._adds.pop(synced)
        error = synced.exception() if not synced.cancelled() else errors.ShuttingDown("cancelled while shutting down")
        size = sum(run.size for run in runs)
        count = sum(len(run.entry_ids) for run in runs)
        if error is None:
            self.send(b"".join([run.answers.add_acks(run) for run in runs]))
            received = [(run.received_at, len(run.entry_ids)) for run in runs]
            self.server.metrics.observe_adds(size, time.perf_counter(), received)
        else:
            log.error("%d adds from %s failed: %s", count, self.peer, error)
            for run in runs:
                for index in range(len(run.entry_ids)):
                    self._refuse_add(run, index, error)
        self._release(size, count)
        self._flush()

    def step(
        self, request: Coroutine[Any, Any, bytes], answer: Callable[[BaseException | None, bytes], None],
        _: object = None,
    ) -> None:
        """Drive one request's coroutine without a Task, then `answer(error, result)`.

        A Task per request costs several event-loop callbacks; here a request that needs no I/O (most reads) is
        answered before data_received returns, and an add resumes straight from its journal future's callback.
        Requests must therefore only await futures (never need asyncio.current_task()), which storage honours.
        """
        try:
            waiting = request.send(None)
        except StopIteration as finished:
            answer(None, finished.value)
        except (Exception, asyncio.CancelledError) as exc:
            answer(exc, b"")
        else:
            if waiting is None:  # a bare yield (asyncio.sleep(0)): just run again on the next turn
                self._loop.call_soon(self.step, request, answer)
            else:
                waiting._asyncio_future_blocking = False
                waiting.add_done_callback(functools.partial(self.step, request, answer))
            return
        self._finished()

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

    def send(self, response: bytes) -> None:
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

    def close_unreadable(self, message: str) -> None:
        """Close a connection whose frame cannot be read, after the answers already due; nothing answers the frame
        itself (a BookKeeper client has no answer to match it with), as a BookKeeper bookie's decoder does."""
        if self._rejected:
            return
        self._rejected = True
        log.warning("closing connection from %s: %s", self.peer, message)
        self.server.metrics.count_error(0, Status.BAD_REQUEST)
        self.buffer.clear()
        self._loop.call_soon(self.close_after_flush)

    def close_after_flush(self) -> None:
        if self._outgoing:
            self._flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
