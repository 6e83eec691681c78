"""CPU cost of the add path without sockets: a real LedgerWriter and BookieClient wired to a real bookie server
connection and LedgerStorage (journal fdatasync, memtable flush, index) through in-memory transports.

`instructions.sh` runs it under callgrind, whose instruction counts do not move with the machine's load, at two add
counts; their difference divides out start-up. `--client-only` answers every add from a canned ack instead (no
bookie), for the client's share alone; `--bookies 3` writes E3/Qw3/Qa2 to three of them. The journal's group
commits depend on thread timing, so the full figure varies by about 2% between runs; the client's does not. The
event loop is uvloop when installed, as in the benches.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from types import SimpleNamespace

from bookfleet import bkwire, eventloop, wire
from bookfleet.bookie.admission import LedgerAdmission
from bookfleet.bookie.connection import Connection
from bookfleet.bookie.http import BookieMetrics
from bookfleet.bookie.server import BookieServer
from bookfleet.bookie.storage import LedgerStorage, StorageSettings
from bookfleet.client.connection import BookieClient, _ClientProtocol
from bookfleet.client.pool import BookiePool
from bookfleet.client.writer import LedgerWriter
from bookfleet.meta.metadata import new_metadata

LEDGER_ID = 1
IN_FLIGHT = 2000
"""Adds outstanding, as `bookfleet bench client` keeps them."""


class MemoryTransport(asyncio.Transport):
    """Hands what is written to the peer's `data_received` on the next turn of the loop, like a socket would."""

    def __init__(self, receive) -> None:
        super().__init__()
        self._receive = receive
        self._loop = asyncio.get_running_loop()

    def write(self, data) -> None:
        self._loop.call_soon(self._receive, bytes(data))

    def writelines(self, chunks) -> None:
        self.write(b"".join(chunks))

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 3181) if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _canned_acks(client_protocol: _ClientProtocol):
    """A bookie that answers each V3 ADD_ENTRY frame at once with OK, reading only the txnId (the bytes after the
    header's version and operation, up to the header's end) and answering a whole read's adds in one call, as a
    bookie answers a group commit's: what it costs is the fake bookie's, not the client's, so it is kept small."""

    def receive(data: bytes) -> None:
        txns, pos = [], 0
        while pos < len(data):
            (length,) = wire.LENGTH_PREFIX.unpack_from(data, pos)
            txns.append(data[pos + 11 : pos + 6 + data[pos + 5]])
            pos += 4 + length
        client_protocol.data_received(bkwire.encode_v3_add_acks(LEDGER_ID, txns, [0] * len(txns)))

    return receive


async def _bookie(root: Path, client_protocol: _ClientProtocol) -> tuple[LedgerStorage, Connection]:
    (root / "journal").mkdir(parents=True)
    (root / "ledgers").mkdir()
    storage = LedgerStorage(root / "journal", root / "ledgers", StorageSettings())
    await storage.start()
    await storage.raise_writer_epoch(LEDGER_ID, 0, wire.master_key(b""))  # held: admitted without ZooKeeper
    admission = LedgerAdmission(None, storage.has_ledger)  # type: ignore[arg-type]  # as `bookfleet bookie` checks
    server = BookieServer(storage, BookieMetrics(), lambda: (1 << 40, 1 << 40), admission=admission)
    connection = Connection(server)
    connection.connection_made(MemoryTransport(client_protocol.data_received))
    return storage, connection


async def run(adds: int, client_only: bool, bookies: int, root: Path) -> None:
    pool = BookiePool({})
    storages = []
    for index in range(bookies):
        address = f"bookie-{index}:3181"
        protocol = _ClientProtocol(address)
        if client_only:
            receive = _canned_acks(protocol)
        else:
            storage, connection = await _bookie(root / address, protocol)
            storages.append(storage)
            receive = connection.data_received
        client = BookieClient(address, MemoryTransport(receive), protocol)
        protocol.client = client
        pool._clients[address] = client  # connected already, through the memory transport
    metadata = new_metadata(list(pool._clients), bookies, min(bookies, 2))  # E3/Qw3/Qa2 as bench's e3 scenario
    writer = LedgerWriter(LEDGER_ID, metadata, 0, b"", SimpleNamespace(zk=None), pool)
    payload = bytes(1024)
    done = asyncio.get_running_loop().create_future()
    issued = 0

    def completed(_entry_id: int, error: BaseException | None) -> None:
        nonlocal issued
        if error is not None:
            done.set_exception(error)
        elif issued < adds:
            issued += 1
            writer.append_callback(payload, completed)
        elif writer.last_add_confirmed == adds - 1:
            done.set_result(None)

    for _ in range(min(IN_FLIGHT, adds)):
        issued += 1
        writer.append_callback(payload, completed)
    await done
    for storage in storages:
        await storage.flush()
        await storage.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("adds", type=int)
    parser.add_argument("--client-only", action="store_true")
    parser.add_argument("--bookies", type=int, default=1, help="1: E=Qw=Qa=1; 3: E3/Qw3/Qa2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="add-path-cost-") as tmp:
        eventloop.run(run(args.adds, args.client_only, args.bookies, Path(tmp)))


if __name__ == "__main__":
    main()
