"""Ensemble change, the ledger writer's answer to a failed bookie (BookKeeper's delayed ensemble change): adds keep
completing on the rest of their write sets while Qa of each can answer; the ledger is marked under-replicated naming
the failed bookie; a writable bookie takes its position in a new segment stored by compare-and-set (recovery keeps its
segments until the close); while no replacement exists, a failed bookie that says it is writable again takes its own
position back; the writer gives up once a write set has lacked Qa for `add_timeout`. A ZooKeeper connection that
drops mid-change is not a reason to give up: the session (and with it the writer's lease) outlives it, so the change is
tried again like one that found no replacement yet (only an expired session ends the writer).

`EnsembleChange` is the part of `LedgerWriter` that does this: it works on the writer's own state (failed positions,
pending adds, ensemble, metadata), so it is a base class of the writer rather than an object of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from kazoo.exceptions import ConnectionLoss

from bookfleet import wire
from bookfleet.client.connection import BookieError
from bookfleet.client.errors import LedgerWriteError
from bookfleet.client.placement import NotEnoughBookies, choose_replacement
from bookfleet.meta.metadata import LedgerMetadata

log = logging.getLogger(__name__)

QUORUM_LOST_RETRY = 0.1
"""How often a writer whose write set lacks Qa bookies looks for a replacement or a returning bookie: also the least
time between two attempts that changed nothing, so a bookie that keeps refusing costs a bounded number of
ZooKeeper reads (one registry listing per attempt)."""
PROBE_TIMEOUT = 1.0
"""How long a failed bookie has to answer GET_BOOKIE_INFO before it may take its position back."""


class EnsembleChange:
    """The ensemble-change steps of `LedgerWriter` (see the module's docstring)."""

    def _bookie_failed(self, position: int, bookie: str, error: BaseException) -> None:
        """Stop sending to `bookie` and let the replacer take over. Adds keep completing on the rest of their write
        sets while Qa of each can still answer (BookKeeper's delayed ensemble change)."""
        if self._error is not None or self._failed.get(position) == bookie:
            return
        log.warning("ledger %d: bookie %s at position %d failed: %s", self.ledger_id, bookie, position, error)
        self._failed[position] = bookie
        self._backlogs.pop(position, None)
        kept = ~(1 << position)
        for queue in (self._pending, self._lagging):
            for add in queue:
                add.owed &= kept
        self._release_answered()
        self._unmarked.add(bookie)
        self._ever_failed.add(bookie)
        self._wake_replacer.set()
        if self._replacer is None:
            self._replacer = asyncio.get_running_loop().create_task(self._replace_failed_bookies())

    def _ack_quorum_reachable(self) -> bool:
        """Whether every write set still has Qa bookies that have not failed."""
        quorum = self.metadata.ack_quorum
        return all(sum(p not in self._failed for p in positions) >= quorum for positions in self._write_sets)

    async def _replace_failed_bookies(self) -> None:
        """Mark the ledger under-replicated naming each failed bookie (the entries acknowledged without it lack a
        replica), then put a writable bookie in its place as soon as there is one. While some write set cannot
        reach Qa and no replacement exists, a failed bookie that says it is writable again (restarted on its disk,
        no longer read-only) takes its own position back; the writer gives up once that has stayed impossible for
        `add_timeout` with the same first pending add (a bookie that keeps refusing does not restart the clock)."""
        try:
            while self._failed and self._error is None:
                if (delay := self._next_attempt_at - time.monotonic()) > 0:
                    await asyncio.sleep(delay)
                self._wake_replacer.clear()
                self._attempt = asyncio.get_running_loop().create_future()
                try:
                    try:
                        await self._mark_failed()
                        waiting = await self._replace_failed()
                    except ConnectionLoss:  # a request was in flight as the connection dropped: kazoo reconnects
                        waiting = "the ZooKeeper connection dropped (the session holds; trying again)"
                    if waiting is not None and not self._ack_quorum_reachable():
                        self._check_quorum_deadline(waiting)
                        await self._reinstate()
                finally:
                    self._attempt.set_result(None)
                if waiting is None:
                    continue
                self._next_attempt_at = time.monotonic() + QUORUM_LOST_RETRY
                if not self._failed:
                    break
                retry = self.settings.replacement_retry if self._ack_quorum_reachable() else QUORUM_LOST_RETRY
                with contextlib.suppress(TimeoutError):  # look again after a while, or at once when another fails
                    async with asyncio.timeout(retry):
                        await self._wake_replacer.wait()
        except LedgerWriteError as exc:
            self._fail(exc)
        except Exception as exc:
            self._fail(LedgerWriteError(f"ensemble change of ledger {self.ledger_id} failed: {exc!r}"))
        finally:
            self._replacer = None

    def _check_quorum_deadline(self, waiting: str) -> None:
        """Raise once a write set has lacked Qa bookies for `add_timeout` while the same add was first in line
        (checked before a failed bookie may come back: one that comes back only to refuse again gains no time)."""
        now, head = time.monotonic(), self._pending[0].entry_id if self._pending else None
        if self._quorum_lost is None or self._quorum_lost[1] != head:
            self._quorum_lost = (now, head)
        if now - self._quorum_lost[0] >= self.settings.add_timeout:
            probes = "; ".join(f"{bookie}: {self._probes.get(bookie, 'not asked')}"
                               for bookie in sorted(self._failed.values()))
            raise LedgerWriteError(
                f"cannot replace bookie {', '.join(sorted(self._failed.values()))} in ledger "
                f"{self.ledger_id} and fewer than Qa={self.metadata.ack_quorum} bookies of a write set "
                f"answer: {waiting} (asked whether they take adds again: {probes})"
            )

    async def _reinstate(self) -> None:
        """Give failed bookies that answer again and say they are writable their own positions back (no metadata
        change: the entries they missed are in the marker already). A connection alone is
        not enough: a read-only bookie (disk full, storage failure) is reachable and keeps refusing adds."""
        back = []
        for position, bookie in list(self._failed.items()):
            if await self._answers_writable(bookie) and self._failed.get(position) == bookie:
                del self._failed[position]
                back.append(position)
        now = time.monotonic()
        for add in self._pending:
            for position in self._write_sets[add.entry_id % len(self._write_sets)]:
                if position in back and not add.acks >> position & 1:
                    add.sent_at = now
                    self._send(add, position)
        if back:
            log.info("ledger %d: bookies at positions %s answer again and keep their places", self.ledger_id, back)

    async def _answers_writable(self, bookie: str) -> bool:
        """Whether `bookie` answers GET_BOOKIE_INFO within PROBE_TIMEOUT and says it takes adds (the last answer is
        kept for the give-up's message: why a bookie seen back did not take its place)."""
        try:
            client = await self._pool.get(bookie)
            async with asyncio.timeout(PROBE_TIMEOUT):
                space = await client.bookie_info()
        except (ConnectionError, BookieError, TimeoutError) as exc:
            self._probes[bookie] = f"{type(exc).__name__}: {exc}"[:120]
            return False
        self._probes[bookie] = space.state.name
        return space.state == wire.BookieState.WRITABLE

    def _choose(self, candidates: list, ensemble: list[str], position: int, excluded: set[str]) -> str:
        """A bookie for `position`. Bookies that failed this writer before are quarantined (BookKeeper's
        bookieQuarantineTime): passed over while another will do, chosen when none will, if registered writable
        again and not failed now. Kept out for good, they left a ledger on fewer than Qw replicas once every other
        bookie had failed once (a chaos run gave up on 12 such ledgers)."""
        place = lambda others: choose_replacement(  # noqa: E731
            candidates, ensemble, position, self.metadata.write_quorum, self.settings.placement, others)
        try:
            return place(excluded | self._ever_failed)
        except NotEnoughBookies:
            return place(excluded | set(self._failed.values()))

    async def _mark_failed(self) -> None:
        """Record the failed bookies in the ledger's under-replication marker, for the auditor and repair."""
        if self._unmarked:
            bookies = set(self._unmarked)
            await asyncio.to_thread(self._under_replication.mark, self.ledger_id, bookies, missed_entries=True)
            self._unmarked -= bookies

    async def _replace_failed(self) -> str | None:
        """Change the ensemble for every failed position a writable bookie can take; returns None when at least
        one was replaced, else why none could be."""
        failed = dict(self._failed)
        candidates = await asyncio.to_thread(self._pool.registry.writable)
        ensemble = list(self._ensemble)
        excluded: set[str] = set()  # refused a connection just now
        replaced: dict[int, str] = {}
        reasons = []
        for position in sorted(failed):
            while position not in replaced:
                try:
                    bookie = self._choose(candidates, ensemble, position, excluded)
                except NotEnoughBookies as exc:
                    reasons.append(str(exc))
                    break
                try:
                    await self._pool.get(bookie)
                    ensemble[position] = bookie
                    replaced[position] = failed[position]
                except ConnectionError:
                    excluded.add(bookie)
        if not replaced:
            return "; ".join(reasons)
        self._quorum_lost = None
        self._changing = asyncio.get_running_loop().create_future()
        try:
            first_entry_id = self.last_add_confirmed + 1
            await self._record_ensemble_change(lambda meta: _changed(meta, first_entry_id, replaced, ensemble))
            log.info("ledger %d: ensemble from entry %d is %s", self.ledger_id, first_entry_id, ensemble)
            self._set_ensemble(ensemble)
            for position in replaced:
                if self._failed.get(position) == replaced[position]:
                    del self._failed[position]
            kept = ~sum(1 << position for position in replaced)
            now = time.monotonic()
            for add in self._pending:
                add.acks &= kept
                add.sent_at = now
                for position in self._write_sets[add.entry_id % len(self._write_sets)]:
                    if position in replaced:
                        self._send(add, position)
        finally:
            changing, self._changing = self._changing, None
            changing.set_result(None)
        self._complete_ready()
        return None

    async def _record_ensemble_change(self, change: Callable[[LedgerMetadata], LedgerMetadata]) -> None:
        """A writer stores its new segment at once: readers and a later recovery must find its entries there.
        Recovery keeps its segments local until the close stores them with lastEntryId in one compare-and-set
        (BookKeeper's newEnsemblesFromRecovery): a recovery that fails leaves the segments the writer made, so a retry
        reads the tail from the bookies that hold the writer's copies, not from a segment only recovery wrote to."""
        if self._recovery:
            self._unstored_changes.append(change)
        else:
            await self._update_metadata(change)


def _changed(
    metadata: LedgerMetadata, first_entry_id: int, failed: dict[int, str], ensemble: list[str]
) -> LedgerMetadata:
    for position in sorted(failed):
        metadata = metadata.with_ensemble_change(first_entry_id, position, ensemble[position])
    return metadata
