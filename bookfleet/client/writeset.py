"""Which ensemble positions store an entry: the striping rule shared by writer, readers, repair and audit."""

from __future__ import annotations


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> list[int]:
    """Ensemble indexes `(entry_id + i) mod E` for i < Qw, so consecutive entries stripe round the ensemble."""
    if not 1 <= write_quorum <= ensemble_size:
        raise ValueError(f"write quorum {write_quorum} must be between 1 and the ensemble size {ensemble_size}")
    if entry_id < 0:
        raise ValueError(f"entry id {entry_id} is negative")
    return [(entry_id + i) % ensemble_size for i in range(write_quorum)]


def stores_entry(position: int, entry_id: int, ensemble_size: int, write_quorum: int) -> bool:
    """Whether ensemble position `position` is in the write set of `entry_id` (no list built: audit loops use it)."""
    return (position - entry_id) % ensemble_size < write_quorum


def quorum_covered(answered: set[int], ensemble_size: int, write_quorum: int, ack_quorum: int) -> bool:
    """Whether answers from these ensemble positions leave no write set with Qa silent bookies: then no add could
    have been acknowledged (or can still be) without one of them knowing it."""
    needed = write_quorum - ack_quorum + 1
    return all(
        sum(p in answered for p in write_set(start, ensemble_size, write_quorum)) >= needed
        for start in range(ensemble_size)
    )
