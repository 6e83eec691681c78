"""One chaos writer process (`python -m tests.chaos.writer ...`): its own process, so the harness can SIGSTOP it.

It writes ledgers one after another (pipelined, random E/Qw/Qa or the one `--config`), reads back confirmed entries
of the ledger it is writing at random moments, and records every operation in its history file. With `--take-over
LEDGER` it first takes a ledger over the way users do: `reopen_ledger` once the old writer's lease is gone, or
`recover_ledger` when entries past the LAC need recovery's decision. A writer that gives a ledger up writes one line
in `<name>.giveups.jsonl` (the harness judges whether Qa bookies of each write set were reachable), and its current
ledger id is kept in `<name>.ledger` for whoever takes it over. It stops when the file `stop` appears in its
directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from dataclasses import replace
from pathlib import Path

from kazoo.exceptions import KazooException

from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.errors import LedgerHeldError, LedgerWriteError
from bookfleet.client.placement import NotEnoughBookies
from bookfleet.client.reader import LedgerReadError
from bookfleet.client.recovery import RecoveryError
from bookfleet.client.writer import LedgerWriter, WriterSettings
from bookfleet.meta.zk import ZooKeeperUnreachable
from tests.chaos.history import History, digest

CONFIGS = [(3, 3, 2), (4, 3, 2), (3, 2, 2)]
SETTINGS = WriterSettings(add_timeout=5.0, replacement_retry=0.5)
TRANSIENT = (NotEnoughBookies, LedgerWriteError, LedgerReadError, RecoveryError, KazooException, OSError, RuntimeError)
"""What bookies or ZooKeeper being down right now look like to a client call: the writer tries again."""
TAKEOVER_PATIENCE = 60.0
"""Seconds a new writer waits for the old writer's lease to expire before it recovers the ledger instead."""


class ChaosWriter:
    def __init__(self, args: argparse.Namespace):
        self.dir = Path(args.dir)
        self.name = args.name
        self.rng = random.Random(args.seed)
        self.history = History(self.dir / f"{self.name}.history.jsonl", self.name)
        self.giveups = open(self.dir / f"{self.name}.giveups.jsonl", "a", buffering=1)  # noqa: SIM115
        self.take_over = args.take_over
        self.entries = (args.min_entries, args.max_entries)
        self.configs = [args.config] if args.config else CONFIGS
        self.add_interval = args.add_interval
        self.settings = replace(SETTINGS, add_timeout=args.add_timeout) if args.add_timeout else SETTINGS

    @property
    def stopping(self) -> bool:
        return (self.dir / "stop").exists()

    def payload(self, ledger_id: int, entry_id: int) -> bytes:
        head = f"{self.name}:{ledger_id}:{entry_id}:".encode()
        return head + self.rng.randbytes(self.rng.randrange(16, 512))

    async def run(self, zk: str) -> None:
        async with await self._connect(zk) as bk:
            while not self.stopping:
                writer = await self._take_over(bk) if self.take_over is not None else None
                self.take_over = None
                if writer is None:
                    writer = await self._create(bk)
                if writer is not None:
                    await self._write(bk, writer)

    async def _connect(self, zk: str) -> BookKeeper:
        """A client, however long ZooKeeper takes to come back (a writer started while it restarts, as a takeover
        writer may be, would otherwise exit at once)."""
        while True:
            try:
                return BookKeeper(zk, self.settings)  # blocks this writer only: it has nothing else to do yet
            except ZooKeeperUnreachable:
                await asyncio.sleep(0.5)

    async def _create(self, bk: BookKeeper) -> LedgerWriter | None:
        try:
            return await bk.create_ledger(*self.rng.choice(self.configs))
        except TRANSIENT:
            await asyncio.sleep(0.5)
            return None

    async def _take_over(self, bk: BookKeeper) -> LedgerWriter | None:
        ledger_id, deadline = self.take_over, time.monotonic() + TAKEOVER_PATIENCE
        while not self.stopping:
            op = self.history.invoke("reopen", ledger_id)
            try:
                writer = await bk.reopen_ledger(ledger_id)
            except LedgerHeldError as exc:  # the old writer's session has not expired yet
                self.history.fail(op, exc)
                if time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    continue
            except LedgerWriteError as exc:  # closed, being recovered, or entries past the LAC: recovery decides
                self.history.fail(op, exc)
            except TRANSIENT as exc:
                self.history.fail(op, exc)
                await asyncio.sleep(0.5)
                continue
            else:
                self.history.ok(op, last=writer.last_add_confirmed)
                return writer
            await self._recover(bk, ledger_id)
            return None
        return None

    async def _recover(self, bk: BookKeeper, ledger_id: int) -> None:
        while not self.stopping:
            op = self.history.invoke("close", ledger_id)
            try:
                closed = await bk.recover_ledger(ledger_id)
            except TRANSIENT as exc:
                self.history.fail(op, exc)
                await asyncio.sleep(0.5)
                continue
            self.history.ok(op, last=closed.last_entry_id)
            return

    def _append(self, writer: LedgerWriter) -> asyncio.Future[int]:
        entry_id = writer.next_entry_id
        payload = self.payload(writer.ledger_id, entry_id)
        op = self.history.invoke("add", writer.ledger_id, entry=entry_id, digest=digest(payload))
        future = writer.append(payload)

        def recorded(done: asyncio.Future[int]) -> None:
            if done.cancelled() or done.exception() is not None:
                self.history.fail(op, done.exception() or asyncio.CancelledError())
            else:
                self.history.ok(op, entry=done.result(), digest=digest(payload))

        future.add_done_callback(recorded)
        return future

    async def _write(self, bk: BookKeeper, writer: LedgerWriter) -> None:
        # Renamed into place: the harness may read it between a truncate and a write (it found it empty once).
        staged = self.dir / f"{self.name}.ledger.partial"
        staged.write_text(str(writer.ledger_id))
        staged.replace(self.dir / f"{self.name}.ledger")
        reading = asyncio.ensure_future(self._read_along(bk, writer.ledger_id))
        window = self.rng.choice([1, 8, 64])
        in_flight: list[asyncio.Future[int]] = []
        try:
            for _ in range(self.rng.randrange(*self.entries)):
                if self.stopping:
                    break
                in_flight.append(self._append(writer))
                if len(in_flight) >= window:
                    await in_flight.pop(0)
                if self.add_interval:
                    await asyncio.sleep(self.add_interval)
            await asyncio.gather(*in_flight)
            op = self.history.invoke("close", writer.ledger_id)
            try:
                closed = await writer.close()
            except LedgerWriteError as exc:
                self.history.fail(op, exc)
                raise
            self.history.ok(op, last=closed.last_entry_id)
        except (LedgerWriteError, KazooException) as exc:  # a ZooKeeper error from close: its outcome stays unknown
            for pending in in_flight:
                with contextlib.suppress(LedgerWriteError, asyncio.CancelledError):
                    await pending
            self.giveups.write(json.dumps({
                "t": time.monotonic(), "writer": self.name, "ledger": writer.ledger_id,
                "ensemble": writer.metadata.segments[-1].bookies, "qw": writer.metadata.write_quorum,
                "qa": writer.metadata.ack_quorum, "error": f"{type(exc).__name__}: {exc}"[:300],
            }) + "\n")
            with contextlib.suppress(LedgerWriteError, KazooException):
                await writer.detach()
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading

    async def _read_along(self, bk: BookKeeper, ledger_id: int) -> None:
        """A reader beside the writer: a random confirmed entry now and then, never one past the LAC it learned,
        until cancelled (the client's deadlines are asyncio.timeout, which never drops a cancel)."""
        while True:
            await asyncio.sleep(self.rng.uniform(0.1, 0.6))
            try:
                reader = await bk.open_ledger(ledger_id)
                lac = await reader.read_lac()
                if lac < 0:
                    continue
                entry_id = self.rng.randrange(lac + 1)
                op = self.history.invoke("read", ledger_id, entry=entry_id)
                try:
                    entry = await reader.read(entry_id)
                except TRANSIENT as exc:
                    self.history.fail(op, exc)
                    continue
                self.history.ok(op, digest=digest(entry.payload))
            except TRANSIENT:
                continue


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zk", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--take-over", type=int, default=None)
    parser.add_argument("--min-entries", type=int, default=200)
    parser.add_argument("--max-entries", type=int, default=2000)
    parser.add_argument("--config", type=lambda text: tuple(map(int, text.split(","))), default=None,
                        help="E,Qw,Qa of every ledger (default: one of CONFIGS at random)")
    parser.add_argument("--add-timeout", type=float, default=None,
                        help="seconds an add waits for a bookie before replacing it (default SETTINGS')")
    parser.add_argument("--add-interval", type=float, default=0.0,
                        help="seconds between two appends (default 0: as fast as the window allows)")
    args = parser.parse_args()
    asyncio.run(ChaosWriter(args).run(args.zk))


if __name__ == "__main__":
    main()
