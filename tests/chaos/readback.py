"""The end of a history run (`python -m tests.chaos.readback`, or `close_and_read_everything` in-process): every
ledger closed (recovered if open) and every entry up to its end read, all recorded in a history of its own. A ledger
found closed has its end recorded as a close too: what its metadata fixed is what the checker holds every
acknowledged add against."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.reader import EntryUnavailable, LedgerReader
from bookfleet.client.recovery import RecoveryError
from tests.chaos.history import History, digest


async def recover(bk: BookKeeper, ledger_id: int):
    """Recovery of a healed fleet: a retry may be needed while bookies re-register after the last fault."""
    for _ in range(60):
        try:
            return await bk.recover_ledger(ledger_id)
        except RecoveryError:
            await asyncio.sleep(1.0)
    return await bk.recover_ledger(ledger_id)


async def read_one(reader: LedgerReader, history: History, entry_id: int) -> None:
    op = history.invoke("read", reader.ledger_id, entry=entry_id)
    try:
        entry = await reader.read(entry_id)
    except EntryUnavailable:
        history.ok(op, missing=True)
        return
    history.ok(op, digest=digest(entry.payload))


async def close_and_read_everything(zk: str, history: History, ledger_ids: list[int] | None = None) -> None:
    """Every ledger (or those of `ledger_ids`) closed and every entry up to its end read."""
    async with BookKeeper(zk) as bk:
        for ledger_id in bk.list_ledgers() if ledger_ids is None else ledger_ids:
            op = history.invoke("close", ledger_id)
            metadata = bk.ledger_metadata(ledger_id)
            if not metadata.is_closed:
                metadata = await recover(bk, ledger_id)
            history.ok(op, last=metadata.last_entry_id)
            reader = await bk.open_ledger(ledger_id)
            for first in range(0, metadata.last_entry_id + 1, 64):
                batch = range(first, min(first + 64, metadata.last_entry_id + 1))
                await asyncio.gather(*(read_one(reader, history, entry_id) for entry_id in batch))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zk", required=True)
    parser.add_argument("--history", type=Path, required=True, help="the history file to append to")
    parser.add_argument("--ledgers", type=lambda text: [int(i) for i in text.split(",") if i], default=None,
                        help="comma-separated ledger ids (default: every ledger)")
    args = parser.parse_args()
    history = History(args.history, "final")
    try:
        asyncio.run(close_and_read_everything(args.zk, history, args.ledgers))
    finally:
        history.close()


if __name__ == "__main__":
    main()
