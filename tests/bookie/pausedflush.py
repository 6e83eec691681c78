"""A storage process killed -9 in the middle of a flush: `python -m tests.bookie.pausedflush JOURNAL_DIR LEDGER_DIR
POINT` adds CRASH_PLAN's entries (a first batch flushed whole, a second flushed up to POINT of FLUSH_PAUSE_POINTS,
a third added while that flush is held there), prints `paused` once every add is acknowledged and the flush waits
at POINT, and waits there to be killed (tests/bookie/test_stepped_flush.py)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from bookfleet.bookie.storage import LedgerStorage, StorageSettings
from tests.fixtures.storage import KEY, TEST_SETTINGS, FlushPause, make_entry

CRASH_PLAN = (
    {1: range(0, 300), 2: range(0, 300)},
    {1: range(300, 900), 2: range(300, 700), 3: range(0, 500)},
    {1: range(900, 950), 3: range(500, 600), 4: range(0, 20)},
)
"""Per batch, the entries added to each ledger: the second is several flush steps (FLUSH_STEP_ENTRIES) long."""


async def add(storage: LedgerStorage, batch: dict[int, range]) -> None:
    await asyncio.gather(*(
        storage.add_entry(ledger_id, e, make_entry(ledger_id, e), KEY) for ledger_id, ids in batch.items() for e in ids
    ))


async def main(journal_dir: Path, ledger_dir: Path, point: str) -> None:
    storage = LedgerStorage(journal_dir, ledger_dir, StorageSettings(**TEST_SETTINGS))
    await storage.start()
    flushed, flushing, added_meanwhile = CRASH_PLAN
    await add(storage, flushed)
    await storage.flush()
    await add(storage, flushing)
    pause = FlushPause(point)
    setattr(pause.owner, pause.name, pause.method)
    flushing_task = asyncio.ensure_future(storage.flush())
    if not await pause.held(flushing_task):
        print("the flush never came to", point, flush=True)
        return
    await add(storage, added_meanwhile)
    print("paused", flush=True)
    await flushing_task  # held at `point` until the process is killed


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]))
