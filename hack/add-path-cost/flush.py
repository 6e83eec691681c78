"""CPU cost of one memtable flush per entry: LedgerStorage's own flush (entry log appends in steps and fsync, index
commit) of a memtable of N 1 KiB entries over 4 ledgers (one entry's bytes under every id), on an event loop with
nothing else to run, so callgrind's count is the flush's alone (with its steps' thread handoffs);
`instructions.sh --flush` runs it at two sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from bookfleet import wire
from bookfleet.bookie.index import IndexedLedger
from bookfleet.bookie.memtable import Memtable
from bookfleet.bookie.storage import LedgerStorage, StorageSettings

LEDGERS = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("entries", type=int)
    args = parser.parse_args()
    entry = wire.encode_entry(wire.Digester(wire.DigestType.CRC32C), 1, 0, -1, 0, bytes(1024))
    memtable = Memtable()
    for ledger_id in range(1, LEDGERS + 1):  # filled in C: the count is the flush's alone, nearly
        memtable.ledgers[ledger_id] = dict.fromkeys(range(args.entries // LEDGERS), entry)
    ledgers = [IndexedLedger(bytes(wire.MASTER_KEY_SIZE)).row(ledger_id) for ledger_id in range(1, LEDGERS + 1)]
    with tempfile.TemporaryDirectory(prefix="flush-cost-") as tmp:
        (Path(tmp) / "ledgers").mkdir()
        (Path(tmp) / "journal").mkdir()
        storage = LedgerStorage(Path(tmp) / "journal", Path(tmp) / "ledgers", StorageSettings())
        storage._open_files()
        assert asyncio.run(storage._write_snapshot(memtable, ledgers)) == {}


if __name__ == "__main__":
    main()
