"""The one replica checker of the auditor, the Spark audit and the benchmarks: which entries of a closed fragment a
check reads from one bookie, how it reads them, and what a copy it got back says.

- `entries_to_check` (pure): the entries ensemble `position` must hold, narrowed to the check's `Coverage` — the
  fragment's two ends for that position (the auditor's periodic check), all of them (the audit job, the
  benchmarks' verification) or a seeded sample (`bookfleet audit --sample`, so a rerun checks the same entries).
- `read_copies`: those entries from one bookie — READ_RANGE for a whole range, READ_ENTRY each otherwise; an
  entry or ledger the bookie says it lacks is simply absent, any other error is the caller's (never "lacks").
- `verdict` (pure): HAS, CORRUPT or LACKS for one copy, its digest verified with the ledger's own digest and password.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
from dataclasses import dataclass

from bookfleet import wire
from bookfleet.client.connection import BookieClient, NoSuchLedgerOnBookieError
from bookfleet.client.writeset import stores_entry
from bookfleet.meta.metadata import Fragment
from bookfleet.replication.planner import FragmentPlan
from bookfleet.replication.repair import DEFINITIVE, Reply, read_present


class Scope(enum.Enum):
    ENDS = "ends"
    ALL = "all"
    SAMPLE = "sample"


@dataclass(frozen=True, slots=True)
class Coverage:
    """How much of a replica a check reads; `fraction` only for SAMPLE."""

    scope: Scope
    fraction: float = 1.0

    @classmethod
    def sampled(cls, fraction: float) -> Coverage:
        """A sample of `fraction` (in (0, 1]) of the entries; the whole replica when it is 1."""
        if not 0 < fraction <= 1:
            raise ValueError(f"sample fraction must be in (0, 1], got {fraction}")
        return cls(Scope.ALL) if fraction == 1 else cls(Scope.SAMPLE, fraction)


ENDS = Coverage(Scope.ENDS)
ALL = Coverage(Scope.ALL)


@dataclass(frozen=True, slots=True)
class ReplicaRange:
    """The part of a closed fragment one ensemble position holds: entries `first..last` striped over
    `ensemble_size` bookies with `write_quorum` copies each."""

    ledger_id: int
    segment_index: int
    first: int
    last: int
    position: int
    ensemble_size: int
    write_quorum: int

    @classmethod
    def of_fragment(cls, ledger_id: int, fragment: Fragment, position: int, write_quorum: int) -> ReplicaRange:
        """Position `position` of a closed fragment of the ledger's metadata."""
        last = fragment.last_entry_id
        if last is None:
            raise ValueError(f"fragment {fragment.index} of ledger {ledger_id} is still open: it has no known end")
        size = len(fragment.bookies)
        return cls(ledger_id, fragment.index, fragment.first_entry_id, last, position, size, write_quorum)

    @classmethod
    def of_plan(cls, plan: FragmentPlan, position: int) -> ReplicaRange:
        """Position `position` of a planned fragment (what a Spark task is shipped)."""
        return cls(
            plan.ledger_id, plan.segment_index, plan.first_entry_id, plan.last_entry_id, position,
            plan.ensemble_size, plan.write_quorum,
        )

    def stores(self, entry_id: int) -> bool:
        return stores_entry(self.position, entry_id, self.ensemble_size, self.write_quorum)


def entries_to_check(replica: ReplicaRange, coverage: Coverage, skip: frozenset[int] = frozenset()) -> list[int]:
    """The entries of `replica` a check with `coverage` reads, ascending, without those in `skip` (e.g. entries
    recorded as DATA_LOSS). ENDS costs about one stripe, not the fragment's length."""
    if replica.first > replica.last:
        return []

    def wanted(entry_id: int) -> bool:
        return replica.stores(entry_id) and entry_id not in skip

    if coverage.scope is Scope.ENDS:
        entries = range(replica.first, replica.last + 1)
        head = next((e for e in entries if wanted(e)), None)
        if head is None:
            return []
        tail = next(e for e in reversed(entries) if wanted(e))
        return [head] if head == tail else [head, tail]
    entries = [e for e in range(replica.first, replica.last + 1) if wanted(e)]
    if coverage.scope is Scope.ALL or not entries:
        return entries
    rng = random.Random(f"{replica.ledger_id}/{replica.segment_index}/{replica.position}")
    return sorted(rng.sample(entries, max(1, round(len(entries) * coverage.fraction))))


async def read_copies(client: BookieClient, ledger_id: int, entries: list[int], whole_range: bool) -> dict[int, bytes]:
    """entry id -> the raw copy the bookie holds, for those of `entries` it has. With `whole_range`, `entries` are
    all a replica holds between the first and the last, read with READ_RANGE; otherwise one READ_ENTRY each.
    Only a definite "no such ledger or entry" makes an entry absent; other errors propagate."""
    if not entries:
        return {}
    if whole_range:
        try:
            raws = await read_present(client, ledger_id, entries[0], entries[-1])
        except NoSuchLedgerOnBookieError:
            return {}
        copies = {}
        for raw in raws:
            with contextlib.suppress(wire.ProtocolError):  # too short to name its entry: as good as absent
                copies[wire.entry_ids(raw)[1]] = raw
        return copies

    async def one(entry_id: int) -> bytes | None:
        try:
            return await client.read_entry(ledger_id, entry_id)
        except DEFINITIVE:
            return None

    raws = await asyncio.gather(*(one(e) for e in entries))
    return {entry_id: raw for entry_id, raw in zip(entries, raws, strict=True) if raw is not None}


def verdict(raw: bytes | None, ledger_id: int, entry_id: int, digester: wire.Digester) -> Reply:
    """LACKS without a copy; HAS for a copy of this very entry whose digest verifies with the ledger's own digest
    type and password (from its metadata, as BookKeeper's replication worker takes them); CORRUPT otherwise."""
    if raw is None:
        return Reply.LACKS
    try:
        entry = wire.decode_entry(digester, raw)
    except wire.ProtocolError:
        return Reply.CORRUPT
    return Reply.HAS if (entry.ledger_id, entry.entry_id) == (ledger_id, entry_id) else Reply.CORRUPT
