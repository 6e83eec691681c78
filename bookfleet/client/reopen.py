"""`LedgerReopen`: a new writer continues an open ledger whose previous writer stopped (`bookfleet ledger write ID`).

Entry ids go on where the previous writer's confirmed ones end, which BookKeeper never does (a second writer
recovers and closes the ledger, then writes a new one). Three rules make it safe here:

- The writer epoch fences the old writer. The new writer stores the next epoch by compare-and-set (so every change
  the old writer tries on the metadata fails) and raises it on the last segment's bookies: from then on they refuse
  the old writer's adds, and once the bookies that confirmed cover every write quorum no such add can reach Qa.
- The view decides where to go on. Each bookie that confirmed reports its LAC and last entry; an entry past the LAC
  means an earlier writer left one only recovery may decide about (refused: recover instead).
- Silent bookies leave the segment before the first add. A bookie that did not confirm the raise (dead, paused, cut
  off) may hold an old writer's unacknowledged entry past the LAC. Left in the segment where the new writer's entries
  of the same ids go, its copy would be met first in some write set by a reader, by recovery (which re-adds it to
  every replica) and by repair, and taken for the acknowledged entry. So each silent bookie is replaced in a new
  segment starting at LAC + 1, stored before the writer starts; with no writable bookie to take its place the reopen
  is refused. An old writer's copies then lie only outside the segments that name their bookie, where nobody reads.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from bookfleet import wire
from bookfleet.client.connection import FencedError
from bookfleet.client.errors import LedgerClosedError, LedgerFencedError, LedgerWriteError
from bookfleet.client.placement import NotEnoughBookies, choose_replacement
from bookfleet.client.pool import BookiePool
from bookfleet.client.reader import READ_TIMEOUT, LedgerReader
from bookfleet.client.writer import LedgerWriter, WriterSettings
from bookfleet.client.writeset import quorum_covered
from bookfleet.meta.lease import WriterLease
from bookfleet.meta.metadata import LedgerMetadata, LedgerState, MetadataStore, MetadataVersionConflict


@dataclass(frozen=True, slots=True)
class EpochView:
    """What the last segment's bookies said to a raised writer epoch."""

    lac: int
    last: int
    silent: dict[int, str]
    """Ensemble position -> bookie that did not confirm the raise (it may hold an old writer's entry past `lac`)."""


class LedgerReopen:
    """One reopen of one ledger (see the module's docstring); `BookKeeper.reopen_ledger` runs it."""

    def __init__(
        self,
        ledger_id: int,
        password: bytes,
        store: MetadataStore,
        pool: BookiePool,
        settings: WriterSettings,
        timeout: float = READ_TIMEOUT,
    ):
        self.ledger_id = ledger_id
        self._password = password
        self._store = store
        self._pool = pool
        self._settings = settings
        self._master_key = wire.master_key(password)
        self._writer_epoch = -1
        """The epoch this reopen stored (set by `_take_writer_epoch`)."""
        self.timeout = timeout
        """How long a bookie of the last segment may stay silent before the reopen replaces it."""

    async def run(self, lease: WriterLease) -> LedgerWriter:
        """The started writer, holding `lease`."""
        metadata, version = await asyncio.to_thread(self._take_writer_epoch)
        view = await self._raise_epoch(metadata)
        if view.last > view.lac:
            raise LedgerWriteError(
                f"ledger {self.ledger_id} has entries after its last confirmed entry {view.lac} from an earlier "
                f"writer: recover it instead"
            )
        if view.lac + 1 < metadata.segments[-1].first_entry_id:
            raise LedgerWriteError(
                f"ledger {self.ledger_id}'s last segment starts at entry {metadata.segments[-1].first_entry_id}, "
                f"after its last confirmed entry {view.lac}: recover it instead"
            )
        if view.silent:
            metadata, version = await self._replace_silent(metadata, version, view)
        reader = LedgerReader(self.ledger_id, metadata, self._password, self._store, self._pool)
        length = (await reader.read(view.lac)).length if view.lac >= 0 else 0
        writer = LedgerWriter(
            self.ledger_id,
            metadata,
            version,
            self._password,
            self._store,
            self._pool,
            self._settings,
            view.lac,
            length,
            lease=lease,
        )
        return await writer.start()

    def _take_writer_epoch(self) -> tuple[LedgerMetadata, int]:
        """Store the open ledger's next writer epoch (compare-and-set, re-read on a conflict); returns the metadata
        and version holding it."""
        while True:
            metadata, version = self._store.read(self.ledger_id)
            self._check_open(metadata)
            taken = metadata.with_next_writer_epoch()
            try:
                version = self._store.update(self.ledger_id, taken, version)
                self._writer_epoch = taken.writer_epoch
                return taken, version
            except MetadataVersionConflict:
                continue

    def _check_open(self, metadata: LedgerMetadata) -> None:
        if metadata.state == LedgerState.CLOSED:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed")
        if metadata.state == LedgerState.IN_RECOVERY:
            raise LedgerFencedError(f"ledger {self.ledger_id} is being recovered")

    async def _raise_epoch(self, metadata: LedgerMetadata) -> EpochView:
        """Raise the writer epoch on every bookie of the last segment, waiting up to `timeout` for each; the ones
        that confirmed must cover every write quorum. FencedError from any bookie ends the reopen (another writer
        or a recovery took the ledger since)."""
        bookies = metadata.segments[-1].bookies
        asks = {
            position: asyncio.ensure_future(self._raise_on(bookie, metadata.writer_epoch))
            for position, bookie in enumerate(bookies)
        }
        try:
            await asyncio.wait(asks.values(), timeout=self.timeout)
        finally:
            for ask in asks.values():
                ask.cancel()
        views: dict[int, tuple[int, int]] = {}
        errors: list[str] = []
        for position, ask in asks.items():
            if not ask.done() or ask.cancelled():
                errors.append(f"{bookies[position]}: no answer within {self.timeout:.0f}s")
            elif isinstance(error := ask.exception(), FencedError):
                raise LedgerFencedError(f"ledger {self.ledger_id} cannot be reopened: {error.message}") from None
            elif error is not None:
                errors.append(f"{bookies[position]}: {error}")
            else:
                views[position] = ask.result()
        if not quorum_covered(set(views), len(bookies), metadata.write_quorum, metadata.ack_quorum):
            raise LedgerWriteError(
                f"cannot raise the writer epoch of ledger {self.ledger_id} to {metadata.writer_epoch}: too few "
                f"bookies of every write quorum answered ({'; '.join(errors)})"
            )
        return EpochView(
            lac=max(lac for lac, _ in views.values()),
            last=max(last for _, last in views.values()),
            silent={p: bookie for p, bookie in enumerate(bookies) if p not in views},
        )

    async def _raise_on(self, bookie: str, writer_epoch: int) -> tuple[int, int]:
        client = await self._pool.get(bookie)
        return await client.raise_writer_epoch(self._master_key, self.ledger_id, writer_epoch)

    async def _replace_silent(
        self, metadata: LedgerMetadata, version: int, view: EpochView
    ) -> tuple[LedgerMetadata, int]:
        """A new segment from LAC + 1 without the silent bookies, stored by compare-and-set under this writer's
        epoch; refused (LedgerWriteError) when a silent bookie has no writable replacement."""
        ensemble = list(metadata.segments[-1].bookies)
        candidates = await asyncio.to_thread(self._pool.registry.writable)
        excluded = set(view.silent.values())
        for position in sorted(view.silent):
            while True:
                try:
                    bookie = choose_replacement(
                        candidates, ensemble, position, metadata.write_quorum, self._settings.placement, excluded
                    )
                except NotEnoughBookies:
                    raise LedgerWriteError(
                        f"ledger {self.ledger_id} cannot be reopened now: bookie {view.silent[position]} did not "
                        f"answer, may hold an earlier writer's unacknowledged entry after entry {view.lac}, and no "
                        f"writable bookie outside the ensemble can take its place; start it again, add a bookie, "
                        f"or recover (close) the ledger"
                    ) from None
                try:
                    await self._pool.get(bookie)
                except ConnectionError:
                    excluded.add(bookie)
                    continue
                ensemble[position] = bookie
                break
        first_entry_id = view.lac + 1
        while True:
            if metadata.writer_epoch != self._writer_epoch:
                raise LedgerFencedError(f"ledger {self.ledger_id} was reopened by another writer meanwhile")
            self._check_open(metadata)
            updated = metadata
            for position in sorted(view.silent):
                updated = updated.with_ensemble_change(first_entry_id, position, ensemble[position])
            try:
                return updated, await asyncio.to_thread(self._store.update, self.ledger_id, updated, version)
            except MetadataVersionConflict:
                metadata, version = await asyncio.to_thread(self._store.read, self.ledger_id)
