"""The ledger writer: quorum adds, completions in entry order, ensemble change on a bookie failure, close.

Every add goes to its write set at once (many adds are in flight); it is acknowledged after Qa bookies of that set
answered and all earlier adds were acknowledged, so the last-add-confirmed (LAC) only ever covers a contiguous
prefix. While an ensemble change is under way completions wait, so the new segment's first entry (LAC + 1) cannot
move under the metadata update.

Per add the hot path builds one ADD_ENTRY body (master key + encoded entry) shared by the whole write set; each
bookie answers through a plain callback (no future, no task), acks and owed answers are bitmasks of ensemble
positions, and only the heads of the queues are ever looked at. Recovery open uses the same writer (`recovery=True`)
to add the ledger's tail again, so a dead bookie is replaced there by the very same ensemble-change rule (its new
segments are stored only with the close).

A bookie is failed and replaced when it has not answered an add for `add_timeout`, whether or not the add already
completed on the others (an add is kept, like BookKeeper's PendingAddOp, until every bookie it was sent to answered).
Memory held for bookies that lag behind is bounded: the acknowledged adds some bookie still owes an answer for stay
under `max_lagging_bytes` (past it the bookie owing the oldest one is failed at once), and a socket that is backed up
(more than connection.WRITE_BUFFER_HIGH queued) is sent nothing more: its adds wait in the writer, counted in that
bound once acknowledged. A failed silent bookie's connection is aborted, so what it was sent is released too.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial, reduce

from bookfleet import bkwire, wire
from bookfleet.client.connection import WRITE_BUFFER_HIGH, BookieClient, FencedError, next_txn
from bookfleet.client.ensemblechange import EnsembleChange
from bookfleet.client.errors import (
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerWriteError,
)
from bookfleet.client.placement import PlacementPolicy
from bookfleet.client.pool import BookiePool
from bookfleet.client.writeset import write_set
from bookfleet.meta.lease import WriterLease
from bookfleet.meta.metadata import LedgerMetadata, LedgerState, MetadataStore, MetadataVersionConflict
from bookfleet.meta.underreplication import UnderReplication

log = logging.getLogger(__name__)


AddCallback = Callable[[int, BaseException | None], None]
"""`on_done(entry_id, error)` of `append_callback`: error is None once Qa bookies have the entry durably."""


_Add = bkwire.PendingAdd
"""One add, until every bookie it was sent to answered: its frame (`body`, shared by the whole write set), `acks` and
`owed` as bitmasks of ensemble positions (see bkwire.PendingAdd)."""


def _settle_future(future: asyncio.Future[int], entry_id: int, error: BaseException | None) -> None:
    """The AddCallback behind `append`'s future."""
    if future.done():
        return
    if error is None:
        future.set_result(entry_id)
    else:
        future.set_exception(error)


@dataclass(frozen=True, slots=True)
class WriterSettings:
    add_timeout: float = 10.0
    """A bookie that has not answered an add for this long is replaced like a failed one."""
    idle_lac_delay: float = 0.05
    """After this long without adds, the LAC is written explicitly so readers can see the last entry."""
    placement: PlacementPolicy = PlacementPolicy.ZONE_AWARE
    replacement_retry: float = 1.0
    """While a failed bookie has no replacement (and Qa of every write set still answer), look again this often."""
    max_lagging_bytes: int = 64 * 1024 * 1024
    """Bytes of acknowledged adds kept because some bookie has not answered them yet; past this the bookie owing the
    oldest is failed and replaced (with the socket backlog bound, what a slow or silent bookie can make the writer
    hold: see the module docstring)."""


class LedgerWriter(EnsembleChange):
    """Appends to one open ledger. Create through `BookKeeper.create_ledger`; use `add` or pipelined `append`."""

    def __init__(
        self,
        ledger_id: int,
        metadata: LedgerMetadata,
        version: int,
        password: bytes,
        store: MetadataStore,
        pool: BookiePool,
        settings: WriterSettings = WriterSettings(),
        last_add_confirmed: int = wire.INVALID_ENTRY_ID,
        length: int = 0,
        recovery: bool = False,
        lease: WriterLease | None = None,
    ):
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.version = version
        self.settings = settings
        self._store = store
        self._pool = pool
        self._master_key = wire.master_key(password)
        self.writer_epoch = metadata.writer_epoch
        """Carried by every add: bookies refuse it once a later writer has reopened the ledger (a higher epoch)."""
        self._digester = wire.Digester(metadata.digest_type, password)
        self._ensemble: list[str] = []
        self._answer_handlers: list[Callable[[_Add, BaseException | None], None]] = []
        """Per ensemble position, the answer callback of its bookie: an add sent there allocates nothing for it."""
        self._senders: list[BookieClient | None] = []
        """Per ensemble position, the connection `_send` last found open there (None: ask the pool): while it is not
        closed it is the pool's connection to that bookie, so the per-add send asks the pool nothing."""
        self._set_ensemble(list(metadata.segments[-1].bookies))
        self._write_sets = [
            write_set(e, metadata.ensemble_size, metadata.write_quorum) for e in range(len(self._ensemble))
        ]
        """Write sets repeat every E entries: computed once, indexed by entry_id mod E on the hot path."""
        self._pending: collections.deque[_Add] = collections.deque()
        self._lagging: collections.deque[_Add] = collections.deque()
        """Acknowledged adds, in entry order, that a bookie still owes an answer for (released from the head)."""
        self._lagging_bytes = 0
        self._backlogs: dict[int, collections.deque[_Add]] = {}
        """Per ensemble position whose socket was backed up, the adds waiting to be sent there, in entry order."""
        self._next_entry_id = last_add_confirmed + 1
        self._pushed_length = length
        self.last_add_confirmed = last_add_confirmed
        self.length = length
        self._explicit_lac = last_add_confirmed
        self._failed: dict[int, str] = {}  # ensemble position -> bookie that failed there, not yet replaced
        self._ever_failed: set[str] = set()
        self._probes: dict[str, str] = {}  # failed bookie -> its last answer to "do you take adds again?"
        self._unmarked: set[str] = set()
        """Failed bookies not yet recorded in the ledger's under-replication marker."""
        self._under_replication = UnderReplication(store.zk)
        self._replacer: asyncio.Task | None = None
        self._wake_replacer = asyncio.Event()
        self._attempt: asyncio.Future[None] | None = None
        """Pending while the replacer marks and looks for replacements."""
        self._next_attempt_at = 0.0
        """After an attempt that replaced nothing, the next one waits until then (QUORUM_LOST_RETRY)."""
        self._quorum_lost: tuple[float, int | None] | None = None
        """(since when, first pending entry then) while a write set lacks Qa bookies: kept across replacer tasks and
        reinstatements, and restarted only once that entry completed or a bookie was replaced."""
        self._lac_writer: asyncio.Task | None = None
        self._changing: asyncio.Future[None] | None = None
        """Set while the metadata gets a new segment: completions wait, so its first entry (LAC + 1) stays put."""
        self._error: LedgerWriteError | None = None
        self._drained: asyncio.Future[None] | None = None
        """Set by a waiting drain: resolved once no add is pending (or the writer failed)."""
        self._closing = False
        self._housekeeper: asyncio.Task | None = None
        self.max_payload = bkwire.max_payload_size(metadata.digest_type)
        self._recovery = recovery
        """Recovery open's writer: adds with RECOVERY_ADD (the ledger is fenced), changes the ensemble of a ledger
        that is IN_RECOVERY but stores the new segments only with the close, and writes no explicit LAC (closing
        makes the tail visible)."""
        self._add_frames = bkwire.AddFrameEncoder(
            ledger_id, self._master_key, self.writer_epoch, recovery, self._digester
        )
        """Each add's whole frame: ledger, master key, writer epoch and recovery flag laid out once."""
        self._ack_quorum = metadata.ack_quorum
        """Qa, read per answer (fixed for the ledger's life)."""
        self._lease = lease
        """This writer's lease on the ledger (see lease.py): watched while writing, released by close and detach."""
        self._unstored_changes: list[Callable[[LedgerMetadata], LedgerMetadata]] = []
        """Recovery's ensemble changes, in order: `metadata` stays as stored, `close` stores them onto it."""

    async def start(self) -> LedgerWriter:
        """Connect to the ensemble (a bookie that cannot be reached is replaced at once)."""
        for position, bookie in enumerate(self._ensemble):
            try:
                await self._pool.get(bookie)
            except ConnectionError as exc:
                self._bookie_failed(position, bookie, exc)
        loop = asyncio.get_running_loop()
        if self._lease is not None:
            self._lease.watch(lambda: loop.call_soon_threadsafe(self._lease_lost))
        self._housekeeper = loop.create_task(self._housekeeping())
        return self

    def _lease_lost(self) -> None:
        self._fail(
            LedgerWriteError(
                f"the writer of ledger {self.ledger_id} lost its lease (ZooKeeper session expired): another writer "
                f"may own the ledger now"
            )
        )

    @property
    def lagging_bytes(self) -> int:
        """Bytes of acknowledged adds kept because a bookie has not answered them yet (at most max_lagging_bytes
        after each completion)."""
        return self._lagging_bytes

    @property
    def next_entry_id(self) -> int:
        """The id the next `append` takes."""
        return self._next_entry_id

    # --- adding ---------------------------------------------------------------------------------------------

    def append(self, payload: bytes) -> asyncio.Future[int]:
        """Send an entry to its write set now; the future gives its entry id once Qa bookies have it durably. A
        payload above `max_payload` fails with EntryTooLargeError and takes no entry id."""
        future = asyncio.get_running_loop().create_future()
        self.append_callback(payload, partial(_settle_future, future))
        return future

    def append_callback(self, payload: bytes, on_done: AddCallback) -> None:
        """`append` without a future: `on_done(entry_id, None)` once Qa bookies have the entry durably, in entry order,
        or `on_done(entry_id, error)` (entry id -1 for a payload above `max_payload`, which takes none). Called
        straight from the answer that completes it (no event-loop turn); it must not raise."""
        size = len(payload)
        if size > self.max_payload:
            on_done(
                wire.INVALID_ENTRY_ID,
                EntryTooLargeError(
                    f"entry of {size} bytes for ledger {self.ledger_id} exceeds the {self.max_payload}-byte "
                    f"limit (bookie frames are at most {wire.MAX_FRAME_SIZE} bytes)"
                ),
            )
            return
        self._push(self._next_entry_id, self._pushed_length + size, payload, self.last_add_confirmed, on_done)

    def recovery_add(self, entry: wire.Entry) -> asyncio.Future[int]:
        """Recovery open: add a recovered entry again, as its writer encoded it (its own LAC and length), to its
        full write set; it must be the next entry of this writer."""
        if entry.entry_id != self._next_entry_id:
            raise ValueError(f"recovered entry {entry.entry_id} of ledger {self.ledger_id} is not the next one")
        future = asyncio.get_running_loop().create_future()
        self._push(entry.entry_id, entry.length, entry.payload, entry.lac, partial(_settle_future, future))
        return future

    def _push(self, entry_id: int, length: int, payload: bytes, lac: int, on_done: AddCallback) -> None:
        if self._error is not None or self._closing:
            on_done(entry_id, self._error or LedgerClosedError(f"ledger {self.ledger_id} is being closed"))
            return
        self._next_entry_id = entry_id + 1
        self._pushed_length = length
        txn = next_txn()
        add = self._add_frames.pending_add(txn, entry_id, lac, length, payload, on_done)
        self._pending.append(add)
        senders = self._senders
        for position in self._write_sets[entry_id % len(self._write_sets)]:
            client = senders[position]
            if client is None or client.closed or client.backed_up or self._backlogs or position in self._failed:
                self._send(add, position)
            else:  # _send's usual case, inline: a connection known to be open, nothing waiting before this add
                add.owed |= 1 << position
                client.enqueue(add.body, txn, (self._answer_handlers[position], add))

    async def add(self, payload: bytes) -> int:
        """Append one entry and wait for it: returns its entry id."""
        return await self.append(payload)

    def _send(self, add: _Add, position: int) -> None:
        if position in self._failed:
            return  # resent to the replacement once the ensemble change is done
        bookie = self._ensemble[position]
        client = self._senders[position] = self._pool.connected(bookie)
        if client is None:
            self._bookie_failed(position, bookie, ConnectionError(f"no connection to bookie {bookie}"))
            return
        add.owed |= 1 << position
        backlog = self._backlogs.get(position)
        if backlog is not None:
            backlog.append(add)
        elif client.backed_up:
            self._backlogs[position] = collections.deque((add,))
            client.when_writable(partial(self._send_backlog, position, bookie))
        else:
            client.enqueue(add.body, add.txn, (self._answer_handlers[position], add))

    def _send_backlog(self, position: int, bookie: str) -> None:
        """The socket to `bookie` drained: send it the adds that waited, up to WRITE_BUFFER_HIGH bytes per turn."""
        backlog = self._backlogs.get(position)
        if backlog is None or self._ensemble[position] != bookie:
            return  # the bookie failed meanwhile: its backlog went with it
        client = self._pool.connected(bookie)
        if client is None:
            self._bookie_failed(position, bookie, ConnectionError(f"no connection to bookie {bookie}"))
            return
        bit, handler, budget = 1 << position, self._answer_handlers[position], WRITE_BUFFER_HIGH
        while backlog and budget > 0 and not client.backed_up:
            add = backlog.popleft()
            if add.owed & bit:
                client.add_entry_callback(add.body, add.txn, handler, add)
                budget -= len(add.body)
        if backlog:
            client.when_writable(partial(self._send_backlog, position, bookie))
        else:
            del self._backlogs[position]

    def _set_ensemble(self, ensemble: list[str]) -> None:
        self._ensemble = ensemble
        self._senders = [None] * len(ensemble)
        self._answer_handlers = [partial(self._on_answer, position, bookie) for position, bookie in enumerate(ensemble)]

    def _on_answer(self, position: int, bookie: str, add: _Add, error: BaseException | None) -> None:
        if self._ensemble[position] != bookie:
            return  # the answer of a bookie already replaced: its copy is not in the metadata
        bit = 1 << position
        add.owed &= ~bit
        if error is None:
            add.acks |= bit
            if self._pending and self._pending[0] is add and add.acks.bit_count() >= self._ack_quorum:
                self._complete_ready()
            elif not add.owed and self._lagging and self._lagging[0] is add:
                self._release_answered()
        elif isinstance(error, FencedError):
            why = f"ledger {self.ledger_id} was fenced (recovered, or reopened by another writer): {error.message}"
            self._fail(LedgerFencedError(why))
        else:
            self._bookie_failed(position, bookie, error)

    def _complete_ready(self) -> None:
        """Acknowledge the contiguous prefix of adds that reached Qa (not while the ensemble is changing)."""
        if self._changing is not None:
            return
        quorum = self._ack_quorum
        pending, lagging = self._pending, self._lagging
        while pending and pending[0].acks.bit_count() >= quorum:
            add = pending.popleft()
            self.last_add_confirmed = add.entry_id
            self.length = add.length
            if add.owed:
                lagging.append(add)
                self._lagging_bytes += len(add.body)
            try:  # _call inline: one Python call less per add
                add.on_done(add.entry_id, None)
            except Exception:
                log.exception("the completion callback of entry %d raised", add.entry_id)
        if self._lagging_bytes > self.settings.max_lagging_bytes:
            self._shed_laggards()
        if not pending and self._drained is not None:
            self._drained.set_result(None)
            self._drained = None

    def _release_answered(self) -> None:
        """Let go of the acknowledged adds at the head that every bookie has answered."""
        lagging = self._lagging
        while lagging and not lagging[0].owed:
            self._lagging_bytes -= len(lagging.popleft().body)

    def _shed_laggards(self) -> None:
        """Past `max_lagging_bytes`: fail the bookies that owe the oldest acknowledged adds until under it."""
        self._release_answered()
        while self._lagging_bytes > self.settings.max_lagging_bytes and self._lagging and self._error is None:
            self._give_up_on(
                self._lagging[0],
                f"it owes answers for {self._lagging_bytes} bytes of acknowledged adds (max_lagging_bytes "
                f"{self.settings.max_lagging_bytes})",
            )
            self._release_answered()

    def _give_up_on(self, add: _Add, why: str) -> None:
        """Fail every bookie that owes `add` an answer, as if its connection had broken, and abort that connection:
        whatever was sent to it is let go."""
        for position, bookie in enumerate(self._ensemble):
            if add.owed >> position & 1:
                self._abandon(position, bookie, f"no answer to entry {add.entry_id} of ledger {self.ledger_id}: {why}")
        add.owed = 0  # a bookie failed before (now out of the ensemble's sends) owes nothing either

    def _abandon(self, position: int, bookie: str, why: str) -> None:
        """Fail a bookie that does not answer and abort its connection, releasing what was sent to it."""
        self._bookie_failed(position, bookie, TimeoutError(why))
        self._pool.drop(bookie, why)

    async def _update_metadata(self, change: Callable[[LedgerMetadata], LedgerMetadata]) -> None:
        """Compare-and-set `change(metadata)`, re-reading after a conflict; fails if recovery or close got there."""
        metadata, version = self.metadata, self.version
        while True:
            if metadata.state == LedgerState.IN_RECOVERY and not self._recovery:
                raise LedgerFencedError(f"ledger {self.ledger_id} is being recovered by another client")
            if metadata.state == LedgerState.CLOSED:
                raise LedgerClosedError(f"ledger {self.ledger_id} is closed")
            if metadata.writer_epoch != self.writer_epoch:
                raise LedgerFencedError(
                    f"ledger {self.ledger_id} was reopened by another writer (writer epoch {metadata.writer_epoch}, "
                    f"this writer's {self.writer_epoch})"
                )
            updated = change(metadata)
            try:
                self.version = await asyncio.to_thread(self._store.update, self.ledger_id, updated, version)
            except MetadataVersionConflict:
                metadata, version = await asyncio.to_thread(self._store.read, self.ledger_id)
                continue
            self.metadata = updated
            return

    def _fail(self, error: LedgerWriteError) -> None:
        """Fail every pending and future add with `error` (the first failure wins)."""
        if self._error is None:
            log.warning("%s", error)
            self._error = error
        pending, self._pending = self._pending, collections.deque()
        for add in pending:
            _call(add, self._error)
        pending.clear()  # a completion loop under way on this queue (a callback failed the writer) stops here
        self._lagging.clear()
        self._lagging_bytes = 0
        self._backlogs.clear()
        if self._drained is not None:
            self._drained.set_result(None)
            self._drained = None

    # --- background: explicit LAC and add timeouts ----------------------------------------------------------

    async def _housekeeping(self) -> None:
        while self._error is None:
            await asyncio.sleep(self.settings.idle_lac_delay)
            if self._changing is not None:
                continue
            self._time_out_silent_bookies()
            if (
                not self._pending
                and self.last_add_confirmed > self._explicit_lac
                and not self._recovery
                and self._lac_writer is None
            ):
                # Its own task: a bookie that never answers cannot hold up the add timeouts above.
                self._lac_writer = asyncio.get_running_loop().create_task(self._write_lac(self.last_add_confirmed))
                self._lac_writer.add_done_callback(self._lac_written)

    def _lac_written(self, task: asyncio.Task) -> None:
        self._lac_writer = None
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning("ledger %d: writing the LAC failed: %r", self.ledger_id, error)

    def _time_out_silent_bookies(self) -> None:
        """Fail the bookies that owe the oldest pending or acknowledged add an answer for more than `add_timeout`
        (adds are sent in entry order, so the heads are the oldest)."""
        deadline = time.monotonic() - self.settings.add_timeout
        self._release_answered()
        for queue in (self._lagging, self._pending):
            if queue and queue[0].owed and queue[0].sent_at < deadline:
                self._give_up_on(queue[0], f"none for {self.settings.add_timeout} s (add_timeout)")
                self._release_answered()

    async def _write_lac(self, lac: int) -> None:
        """Tell the whole ensemble the LAC (best effort); a bookie that does not answer within `add_timeout` is
        failed like one that does not answer an add."""
        ensemble = list(self._ensemble)
        body = self._digester.lac_body(self.ledger_id, lac)
        calls = {}
        for position, bookie in enumerate(ensemble):
            client = self._pool.connected(bookie)
            if client is not None and position not in self._failed:
                calls[position] = asyncio.ensure_future(client.write_lac(self._master_key, self.ledger_id, lac, body))
        try:
            if calls:
                await asyncio.wait(calls.values(), timeout=self.settings.add_timeout)
        except asyncio.CancelledError:  # the writer stops: nobody will look at these answers
            for call in calls.values():
                _let_go(call)
            raise
        for position, call in calls.items():
            if not call.done():
                call.cancel()
                if self._ensemble[position] == ensemble[position] and self._error is None:
                    why = f"no answer to WRITE_LAC {lac} of ledger {self.ledger_id} for {self.settings.add_timeout} s"
                    self._abandon(position, ensemble[position], why)
            elif isinstance(call.exception(), FencedError):
                self._fail(LedgerFencedError(f"ledger {self.ledger_id} was fenced by a recovery open"))
        self._explicit_lac = lac

    async def flush(self) -> int:
        """Wait for every pending add and tell the ensemble the LAC, so readers see the last entry too."""
        await self._drain()
        if self.last_add_confirmed > self._explicit_lac:
            await self._write_lac(self.last_add_confirmed)
        if self._error is not None:
            raise self._error
        return self.last_add_confirmed

    async def _drain(self) -> None:
        while self._pending and self._error is None:
            if self._drained is None:
                self._drained = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drained)
        if self._attempt is not None and not self._attempt.done():
            await asyncio.shield(self._attempt)  # a replacement under way lands before close (or detach) goes on
        if self._error is None:
            await self._mark_failed()  # a ledger closed with entries missing a replica is always marked

    # --- closing --------------------------------------------------------------------------------------------

    async def close(self) -> LedgerMetadata:
        """Wait for pending adds, then record lastEntryId and length with state CLOSED; returns that metadata."""
        self._closing = True
        try:
            await self._drain()
            if self._error is not None:
                raise self._error
            lac, length = self.last_add_confirmed, self.length
            changes = self._unstored_changes
            await self._update_metadata(lambda meta: reduce(_apply, changes, meta).with_closed(lac, length))
            return self.metadata
        finally:
            self._error = self._error or LedgerClosedError(f"ledger {self.ledger_id} is closed")
            await self._stop()

    async def detach(self) -> None:
        """Stop this writer but leave the ledger open, for `BookKeeper.reopen_ledger` in another process; call
        `flush()` first so the next writer starts after a confirmed and visible last entry."""
        try:
            await self._drain()
        finally:
            self._error = self._error or LedgerClosedError(f"the writer of ledger {self.ledger_id} was detached")
            await self._stop()

    async def _stop(self) -> None:
        for task in (self._housekeeper, self._replacer, self._lac_writer):
            if task is not None:
                task.cancel()
        if self._lease is not None:
            await asyncio.to_thread(self._lease.release)

    async def __aenter__(self) -> LedgerWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not isinstance(self._error, LedgerClosedError):
            await self.close()


def _call(add: _Add, error: BaseException | None) -> None:
    """An add's callback; one that raises is logged, never let into the writer's bookkeeping or the connection."""
    try:
        add.on_done(add.entry_id, error)
    except Exception:
        log.exception("the completion callback of entry %d raised", add.entry_id)


def _let_go(call: asyncio.Future) -> None:
    """Cancel a call whose answer nobody waits for any more, or mark its failure seen if it already has one: else
    asyncio logs 'Task exception was never retrieved' once the connection closes under it."""
    if not call.cancel() and not call.cancelled():
        call.exception()


def _apply(metadata: LedgerMetadata, change: Callable[[LedgerMetadata], LedgerMetadata]) -> LedgerMetadata:
    return change(metadata)
