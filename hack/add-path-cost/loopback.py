"""CPU cost of the add path without sockets: a real LedgerWriter and BookieClient wired to a real bookie server
connection and LedgerStorage (journal fdatasync, memtable flush, index) through in-memory transports.

`instructions.sh` runs it under callgrind, whose instruction counts do not move with the machine's load, at two add
counts; their difference divides out start-up. `--bookies 3` writes E3/Qw3/Qa2 to three of them. The journal's group
commits depend on thread timing, so the full figure varies by about 2% between runs. The event loop is uvloop when
installed, as in the benches.

`--client-only` counts the client's instructions alone: each bookie is a canned one in a process of its own (this
script with `--answer-adds`, started by exec, which callgrind does not follow), answering every add of a socket read
with OK at once. The client reaches it through the pool over a real loopback TCP connection, so what is counted is
the client's whole add path, its socket writes and reads, the parsing of the answers and the ack accounting
included, and nothing of the canned bookie's. How many answers a read brings depends on timing, but the per-read
work is a small part of the whole: the figure moves by well under 1% between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
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


def answer_adds(listener_fd: int) -> None:
    """The canned bookie of `--client-only`, in a process of its own: takes one connection on the listening socket
    it was handed and answers each V3 ADD_ENTRY frame with OK, reading only the txnId (the bytes after the header's
    version and operation, up to the header's end) and answering a whole read's adds in one send, as a bookie
    answers a group commit's. Returns when the client closes the connection."""
    with socket.socket(fileno=listener_fd) as listener:
        connection, _ = listener.accept()
    buffer = bytearray()
    with connection:
        while data := connection.recv(1 << 20):
            buffer += data
            txns, pos = [], 0
            while pos + 4 <= len(buffer):
                (length,) = wire.LENGTH_PREFIX.unpack_from(buffer, pos)
                if pos + 4 + length > len(buffer):
                    break
                txns.append(bytes(buffer[pos + 11 : pos + 6 + buffer[pos + 5]]))
                pos += 4 + length
            del buffer[:pos]
            if txns:
                connection.sendall(bkwire.encode_v3_add_acks(LEDGER_ID, txns, [0] * len(txns)))


def _canned_bookie() -> tuple[str, subprocess.Popen]:
    """A canned bookie's HOST:PORT and process (see `answer_adds`)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        process = subprocess.Popen(
            [sys.executable, __file__, "0", "--answer-adds", str(listener.fileno())], pass_fds=(listener.fileno(),)
        )
        return f"127.0.0.1:{listener.getsockname()[1]}", process


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
    addresses = [f"bookie-{index}:3181" for index in range(bookies)]
    storages, canned = [], []
    if client_only:
        canned = [_canned_bookie() for _ in addresses]
        pool = BookiePool({bookie: address for bookie, (address, _) in zip(addresses, canned, strict=True)})
        for bookie in addresses:
            await pool.get(bookie)
    else:
        pool = BookiePool({})
        for address in addresses:
            protocol = _ClientProtocol(address)
            storage, connection = await _bookie(root / address, protocol)
            storages.append(storage)
            client = BookieClient(address, MemoryTransport(connection.data_received), protocol)
            protocol.client = client
            pool._clients[address] = client  # connected already, through the memory transport
    metadata = new_metadata(addresses, bookies, min(bookies, 2))  # E3/Qw3/Qa2 as bench's e3 scenario
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
    await pool.close()
    for _, process in canned:
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("adds", type=int)
    parser.add_argument("--client-only", action="store_true")
    parser.add_argument("--bookies", type=int, default=1, help="1: E=Qw=Qa=1; 3: E3/Qw3/Qa2")
    parser.add_argument("--answer-adds", type=int, metavar="FD", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.answer_adds is not None:
        answer_adds(args.answer_adds)
        return
    with tempfile.TemporaryDirectory(prefix="add-path-cost-") as tmp:
        eventloop.run(run(args.adds, args.client_only, args.bookies, Path(tmp)))


if __name__ == "__main__":
    main()
