"""What a repair has to copy: the damaged fragments of a ledger, which entries each lost position must hold, and
who takes that position. Pure functions over LedgerMetadata, so the driver plans without touching a bookie.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from bookfleet.client.writeset import stores_entry, write_set
from bookfleet.meta.metadata import Fragment, LedgerMetadata

ReplacementChooser = Callable[[Sequence[str], int, int, Collection[str]], str]
"""(segment bookies, lost position, write quorum, bookies to avoid) -> replacement bookie id (placement policy)."""


class LedgerNotClosed(ValueError):
    """The open tail of a ledger has no known last entry: a ledger whose tail lost a bookie is fenced and closed
    before it is planned (BookKeeper's rule); one that lost bookies only in earlier segments is repaired open."""


@dataclass(frozen=True, slots=True)
class FragmentPlan:
    """One segment's entry range of one ledger whose ensemble lost positions, with a replacement per position.

    Picklable plain data: the driver ships it to a Spark task.
    """

    ledger_id: int
    segment_index: int
    first_entry_id: int
    last_entry_id: int
    bookies: tuple[str, ...]
    write_quorum: int
    lost: tuple[int, ...]
    replacements: tuple[str, ...]
    declared_lost: frozenset[str] = frozenset()
    """Bookies of the fragment the lost-bookie rule declared lost (the marker's `lost_bookies`): the only ones
    repair may give up on. The other missing ones (a writer's missed entries, a replica check) may well answer."""
    digest_type: str = "crc32c"
    password: bytes = field(default=b"", repr=False)
    """The ledger's password from its metadata, as BookKeeper's replication worker takes it: the copies' digests
    are verified with it and their adds carry its master key."""
    writer_epoch: int = 0
    """The ledger's writer epoch when planned, carried by the copies: a bookie that knows a newer one never lets them
    replace a copy of its own (see `Storage.add_unpacked`)."""
    entry_size_hint: int = 1024
    """The ledger's average entry size, so a task sizes its reads without asking a bookie first."""

    @property
    def ensemble_size(self) -> int:
        return len(self.bookies)

    def entries_for(self, position: int) -> list[int]:
        """Entries of this fragment that ensemble `position` must hold (its write sets include it)."""
        entries = range(self.first_entry_id, self.last_entry_id + 1)
        return [e for e in entries if stores_entry(position, e, self.ensemble_size, self.write_quorum)]

    def targets(self, entry_id: int) -> list[str]:
        """Replacement bookies that must receive `entry_id`."""
        size = self.ensemble_size
        return [
            bookie
            for position, bookie in zip(self.lost, self.replacements, strict=True)
            if stores_entry(position, entry_id, size, self.write_quorum)
        ]

    def replicas(self, entry_id: int) -> list[str]:
        """Every bookie of the segment that should hold `entry_id` (lost ones included), in write-set order."""
        return [self.bookies[p] for p in write_set(entry_id, self.ensemble_size, self.write_quorum)]

    def needed_entries(self) -> list[int]:
        """Entries that at least one lost position must hold."""
        size = self.ensemble_size
        # write sets repeat every E entries: decide each residue once, not each entry
        residues = {r for r in range(size) if any(stores_entry(p, r, size, self.write_quorum) for p in self.lost)}
        return [e for e in range(self.first_entry_id, self.last_entry_id + 1) if e % size in residues]

    @property
    def survivors(self) -> tuple[str, ...]:
        return tuple(b for p, b in enumerate(self.bookies) if p not in self.lost)


def lost_positions(bookies: Sequence[str], missing: Collection[str]) -> tuple[int, ...]:
    """Ensemble positions held by a missing bookie."""
    return tuple(position for position, bookie in enumerate(bookies) if bookie in missing)


def tail_is_damaged(metadata: LedgerMetadata, missing: Collection[str]) -> bool:
    """An OPEN ledger whose current segment includes a missing bookie: only then may repair fence its writer."""
    return not metadata.is_closed and bool(lost_positions(metadata.segments[-1].bookies, missing))


def damaged_fragments(metadata: LedgerMetadata, missing: Collection[str]) -> list[tuple[Fragment, tuple[int, ...]]]:
    """Closed fragments whose ensemble includes a missing bookie, each with its lost positions.

    Empty fragments are included: they have nothing to copy, but the missing bookie must still leave the metadata.
    The open tail of an OPEN ledger is its writer's; if it is damaged, the ledger must be closed first.
    """
    if tail_is_damaged(metadata, missing):
        raise LedgerNotClosed(
            f"ledger is {metadata.state} and its current segment lost a bookie: fence and close it before planning"
        )
    damaged = []
    for fragment in metadata.fragments():
        lost = lost_positions(fragment.bookies, missing)
        if lost and fragment.last_entry_id is not None:
            damaged.append((fragment, lost))
    return damaged


def choose_replacements(
    bookies: Sequence[str], lost: Sequence[int], write_quorum: int, missing: Collection[str], choose: ReplacementChooser
) -> tuple[str, ...]:
    """A replacement per lost position of one segment: never a bookie of the segment or a missing one, and two
    positions never get the same bookie. Raises the placement policy's NotEnoughBookies when there is none."""
    ensemble = list(bookies)
    replacements: list[str] = []
    for position in lost:
        bookie = choose(ensemble, position, write_quorum, {*missing, *bookies, *replacements})
        replacements.append(bookie)
        ensemble[position] = bookie
    return tuple(replacements)


def plan_ledger(
    ledger_id: int,
    metadata: LedgerMetadata,
    missing: Collection[str],
    choose: ReplacementChooser,
    declared_lost: Collection[str] = frozenset(),
) -> list[FragmentPlan]:
    """Fragment plans for the closed fragments of one ledger; `choose` is the shared placement policy.

    A replacement never joins a segment it is already in, never is a missing bookie, and two positions lost in
    one segment get different bookies. `declared_lost`: the missing bookies the lost-bookie rule declared lost.
    """
    plans = []
    for fragment, lost in damaged_fragments(metadata, missing):
        replacements = choose_replacements(fragment.bookies, lost, metadata.write_quorum, missing, choose)
        plans.append(
            FragmentPlan(
                ledger_id=ledger_id,
                segment_index=fragment.index,
                first_entry_id=fragment.first_entry_id,
                last_entry_id=fragment.last_entry_id,
                bookies=fragment.bookies,
                write_quorum=metadata.write_quorum,
                lost=lost,
                replacements=replacements,
                declared_lost=frozenset(fragment.bookies) & frozenset(declared_lost),
                digest_type=str(metadata.digest_type),
                password=metadata.password,
                writer_epoch=metadata.writer_epoch,
                entry_size_hint=metadata.length // max(1, metadata.last_entry_id + 1),
            )
        )
    return plans
