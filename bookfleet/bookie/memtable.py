"""The write cache: entries not yet in the entry log, and the place tailing reads are served from."""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class Memtable:
    """(ledger, entry) -> encoded entry, as a dict of dicts so an add allocates no key tuple."""

    __slots__ = ("ledgers", "size")

    def __init__(self) -> None:
        self.ledgers: dict[int, dict[int, bytes]] = {}
        self.size = 0
        """Bytes of entries put (an overwritten entry counts twice; this only decides when to flush)."""

    def put(self, ledger_id: int, entry_id: int, entry: bytes) -> None:
        entries = self.ledgers.get(ledger_id)
        if entries is None:
            entries = self.ledgers[ledger_id] = {}
        entries[entry_id] = entry
        self.size += len(entry)

    def put_run(self, ledger_id: int, entry_ids: list[int], entries: list[bytes]) -> None:
        """`put` of each pair in order, in C."""
        ledger = self.ledgers.get(ledger_id)
        if ledger is None:
            ledger = self.ledgers[ledger_id] = {}
        ledger.update(zip(entry_ids, entries, strict=True))
        self.size += sum(map(len, entries))

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        entries = self.ledgers.get(ledger_id)
        return None if entries is None else entries.get(entry_id)

    def entry_ids(self, ledger_id: int, first: int, last: int) -> list[int]:
        """The ids this memtable holds in [first, last], ascending."""
        entries = self.ledgers.get(ledger_id)
        if not entries:
            return []
        if last - first < len(entries):
            return [e for e in range(first, last + 1) if e in entries]
        return sorted(e for e in entries if first <= e <= last)

    def drop(self, ledger_ids: Iterable[int]) -> None:
        for ledger_id in ledger_ids:
            entries = self.ledgers.pop(ledger_id, None)
            if entries:
                self.size -= sum(len(e) for e in entries.values())

    def absorb(self, newer: Memtable) -> None:
        """Take every entry of `newer` over ours (used to put back a snapshot whose flush failed)."""
        for ledger_id, entries in newer.ledgers.items():
            for entry_id, entry in entries.items():
                self.put(ledger_id, entry_id, entry)

    def steps(self, step_entries: int) -> Iterator[list[tuple[int, list[int], list[bytes]]]]:
        """Every entry in steps of at most `step_entries`, each a list of (ledger, entry ids, their entries), ordered
        by ledger then entry, so each ledger's entries land together in the entry log."""
        step: list[tuple[int, list[int], list[bytes]]] = []
        room = step_entries
        for ledger_id in sorted(self.ledgers):
            entries = self.ledgers[ledger_id]
            entry_ids = sorted(entries)
            position = 0
            while position < len(entry_ids):
                piece = entry_ids[position : position + room]
                position += len(piece)
                step.append((ledger_id, piece, list(map(entries.__getitem__, piece))))
                room -= len(piece)
                if not room:
                    yield step
                    step, room = [], step_entries
        if step:
            yield step
