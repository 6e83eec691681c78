"""CPU cost of the bookie's add path alone, by part: pre-encoded 1 KiB add frames of one writer (V2 as BookKeeper's
client lays them out, V3 as bookfleet's `AddRequestEncoder` does) fed to one bookie `Connection` in 64 KiB reads, as
a socket would hand them, with real storage behind it (journal fdatasync, memtable).

`--part` runs one part on its own over the same frames: `read` (each read's adds read into runs, as `_process`
does), `store` (those runs applied by `storage.add_run` and their commit awaited, then the memtable flushed),
`acks` (their answers encoded), `frames` (the frames made and nothing else: what every part subtracts); `all` (the
default) is the whole connection. Under callgrind at two add counts (`instructions.sh`'s way) the
difference gives instructions per entry of each part; the rest of `all` is the connection's own bookkeeping.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from loopback import MemoryTransport  # this directory's

from bookfleet import bkwire, eventloop, wire
from bookfleet.bookie.admission import LedgerAdmission
from bookfleet.bookie.connection import Connection
from bookfleet.bookie.http import BookieMetrics
from bookfleet.bookie.server import BookieServer
from bookfleet.bookie.serving import AddRun
from bookfleet.bookie.storage import LedgerStorage, StorageSettings

LEDGER_ID = 1
READ_SIZE = 64 * 1024
MASTER_KEY = wire.master_key(b"")


def frames(protocol: str, adds: int) -> list[bytes]:
    """The stream of `adds` add frames of one writer, cut into socket reads."""
    digester = wire.Digester(wire.DigestType.CRC32C)
    payload = bytes(1024)
    encoder = bkwire.AddFrameEncoder(LEDGER_ID, MASTER_KEY, 0, False, digester)
    stream = bytearray()
    for entry_id in range(adds):
        if protocol == "v3":
            stream += encoder.frame_of(bkwire.varint(entry_id + 1), entry_id, entry_id - 1, 1024 * (entry_id + 1),
                                       payload)
        else:
            entry = digester.encode(LEDGER_ID, entry_id, entry_id - 1, 1024 * (entry_id + 1), payload)
            stream += bkwire.encode_v2_request(bkwire.V2Op.ADD, 0, MASTER_KEY + entry)
    return [bytes(stream[pos : pos + READ_SIZE]) for pos in range(0, len(stream), READ_SIZE)]


def read_runs(session, reads: list[bytes]) -> list[AddRun]:
    """Each read's adds as `Connection._process` reads them into runs (all of one writer here)."""
    runs, buffer, reader = [], bytearray(), session.add_reader
    for data in reads:
        buffer += data
        run = AddRun(reader.writer_of(buffer, 0, len(buffer)), session, 0.0)
        pos, _, run.size = reader.read_run(buffer, 0, len(buffer), run, 1 << 30, 1 << 62)
        del buffer[:pos]
        runs.append(run)
    return runs


async def run(protocol: str, adds: int, part: str, root: Path) -> None:
    (root / "journal").mkdir(parents=True)
    (root / "ledgers").mkdir()
    storage = LedgerStorage(root / "journal", root / "ledgers", StorageSettings())
    await storage.start()
    await storage.raise_writer_epoch(LEDGER_ID, 0, MASTER_KEY)
    server = BookieServer(storage, BookieMetrics(), lambda: (1 << 40, 1 << 40),
                          admission=LedgerAdmission(None, storage.has_ledger))  # type: ignore[arg-type]
    connection = Connection(server)
    connection.connection_made(MemoryTransport(lambda _answers: None))  # the answers dropped
    reads = frames(protocol, adds)
    if part == "all":
        for data in reads:
            connection.data_received(data)
            while len(connection.buffer) > 4 * READ_SIZE or connection.in_flight >= server.max_in_flight:
                await asyncio.sleep(0.001)
        while connection.in_flight:
            await asyncio.sleep(0.001)
    elif part != "frames":
        connection.data_received(reads[0][:5])  # the first bytes choose the session
        session = connection._session
        runs = read_runs(session, reads)
        if part == "store":
            synced = [server.add_run(add_run) for add_run in runs if add_run.entries]
            await synced[-1]
        elif part == "acks":
            for add_run in runs:
                session.add_acks(add_run)
    await storage.flush()
    await storage.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("adds", type=int)
    parser.add_argument("--protocol", choices=("v2", "v3"), default="v2")
    parser.add_argument("--part", choices=("all", "frames", "read", "store", "acks"), default="all")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bookie-add-cost-") as tmp:
        eventloop.run(run(args.protocol, args.adds, args.part, Path(tmp)))


if __name__ == "__main__":
    main()
