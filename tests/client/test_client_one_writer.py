"""One writer per ledger: concurrent reopens, closing under a live writer, a writer that loses its lease."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bookfleet import cli, wire
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.errors import LedgerFencedError, LedgerHeldError, LedgerWriteError
from bookfleet.client.writer import LedgerWriter
from bookfleet.client.writeset import write_set
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import LedgerState
from tests.fixtures.waiting import eventually

REPO = Path(__file__).resolve().parents[2]


async def test_two_concurrent_reopens_get_one_writer(bookie_fleet, zk_connect):
    bookie_fleet.start(3)
    async with BookKeeper(zk_connect) as creator, BookKeeper(zk_connect) as one, BookKeeper(zk_connect) as two:
        first = await creator.create_ledger(3, 3, 2, password=b"pw")
        await first.add(b"0")
        await first.flush()
        with pytest.raises(LedgerHeldError, match=f"ledger {first.ledger_id} already has a live writer"):
            await one.reopen_ledger(first.ledger_id, b"pw")  # the creator still writes
        await first.detach()

        reopened = await asyncio.gather(
            one.reopen_ledger(first.ledger_id, b"pw"), two.reopen_ledger(first.ledger_id, b"pw"), return_exceptions=True
        )
        winners = [w for w in reopened if isinstance(w, LedgerWriter)]
        refused = [e for e in reopened if isinstance(e, LedgerHeldError)]
        assert (len(winners), len(refused)) == (1, 1), reopened
        assert await winners[0].add(b"1 from the one writer") == 1
        await winners[0].flush()
        await winners[0].detach()

        again = await (one if winners[0] is reopened[1] else two).reopen_ledger(first.ledger_id, b"pw")
        assert await again.add(b"2") == 2
        await again.close()
        reader = await creator.open_ledger(first.ledger_id, b"pw")
        assert [e.payload async for e in reader.entries()] == [b"0", b"1 from the one writer", b"2"]


async def test_close_fences_a_live_writer(bookie_fleet, zk_connect):
    bookie_fleet.start(3)
    async with BookKeeper(zk_connect) as live, BookKeeper(zk_connect) as closer:
        writer = await live.create_ledger(3, 3, 2)
        acked: list[int] = []
        failure: list[BaseException] = []

        async def keep_writing() -> None:
            try:
                while True:
                    batch = [writer.append(b"entry") for _ in range(20)]
                    acked.extend(await asyncio.gather(*batch))
            except LedgerWriteError as exc:
                failure.append(exc)

        async def some_acked() -> bool:
            return len(acked) >= 100

        writing = asyncio.ensure_future(keep_writing())
        await eventually(some_acked, timeout=30)
        command = ["ledger", "close", str(writer.ledger_id), "--zk", zk_connect]
        assert await asyncio.to_thread(cli.main, command) == 0
        closed = closer.ledger_metadata(writer.ledger_id)

        async def settled() -> bool:
            return bool(failure) or max(acked) > closed.last_entry_id

        await eventually(settled, timeout=30)
        writing.cancel()
        assert max(acked) <= closed.last_entry_id, "the live writer got an ack past the closed lastEntryId"
        assert isinstance(failure[0], LedgerFencedError)
        reader = await closer.open_ledger(writer.ledger_id)
        assert [e.entry_id async for e in reader.entries()] == list(range(closed.last_entry_id + 1))


async def test_a_writer_that_loses_its_lease_stops(bookie_fleet, zk_connect, zk):
    bookie_fleet.start(3)
    async with BookKeeper(zk_connect) as bk:
        writer = await bk.create_ledger(3, 3, 2)
        await writer.add(b"0")
        zk.delete(zkpaths.ledger_writer(writer.ledger_id))  # what the expiry of the writer's session does

        async def refused() -> LedgerWriteError | None:
            try:
                await writer.add(b"more")
            except LedgerWriteError as exc:
                return exc
            return None

        assert "lost its lease" in str(await eventually(refused, timeout=30))


async def test_a_writer_cut_off_by_a_reopen_cannot_close_the_ledger_under_the_new_one(bookie_fleet, zk_connect):
    """A writer whose session expired (here: one without a lease) still has the ledger's metadata; after another
    writer reopened the ledger, its compare-and-set must fail on the writer epoch, not be retried over the new
    writer's (it would close the ledger at the old LAC and cut off the new writer's acknowledged entries)."""
    bookie_fleet.start(3)
    async with BookKeeper(zk_connect) as old_side, BookKeeper(zk_connect) as new_side:
        creator = await old_side.create_ledger(3, 3, 2)
        await creator.add(b"0")
        await creator.flush()
        metadata, version = old_side.metadata.read(creator.ledger_id)
        stale = LedgerWriter(creator.ledger_id, metadata, version, b"", old_side.metadata, old_side.pool)
        await stale.start()
        await creator.detach()

        reopened = await new_side.reopen_ledger(creator.ledger_id)
        assert await reopened.add(b"1 from the new writer") == 1
        await reopened.flush()
        with pytest.raises(LedgerFencedError, match="reopened by another writer"):
            await stale.close()
        assert new_side.ledger_metadata(creator.ledger_id).state == LedgerState.OPEN
        assert (await reopened.close()).last_entry_id == 1
        reader = await new_side.open_ledger(creator.ledger_id)
        assert [e.payload async for e in reader.entries()] == [b"0", b"1 from the new writer"]


async def test_a_frozen_writer_cannot_overwrite_the_next_writer(bookie_fleet, zk_connect, zk, tmp_path):
    """A paused writer: W1 (its own process) bursts and flushes, is frozen until its session expires; W2
    reopens and is acknowledged for 200 entries; W1, thawed, sends its next burst at once. Bookies must refuse it:
    every entry W2 was acknowledged for holds W2's payload on every replica, and W1 gets an error, no ack."""
    bookie_fleet.start(3)
    burst = 50
    with open(tmp_path / "w1.log", "w") as log:
        w1 = subprocess.Popen(
            [sys.executable, "-m", "tests.fixtures.stalewriter", zk_connect, "4", str(burst)],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
        )
    try:
        started = json.loads(await asyncio.to_thread(w1.stdout.readline) or "null")
        assert started is not None, (tmp_path / "w1.log").read_text()
        ledger_id = started["ledger_id"]
        assert started["lac"] == burst - 1
        os.kill(w1.pid, signal.SIGSTOP)

        async def lease_expired() -> bool:
            return zk.exists(zkpaths.ledger_writer(ledger_id)) is None

        await eventually(lease_expired, timeout=120)
        async with BookKeeper(zk_connect) as bk:
            w2 = await bk.reopen_ledger(ledger_id)
            acked = await asyncio.gather(*(w2.append(b"W2 %d" % (burst + i)) for i in range(200)))
            assert acked == list(range(burst, burst + 200))
            await w2.flush()

            w1.stdin.write("next burst\n")
            w1.stdin.flush()  # waiting in the pipe, so W1's event loop sends the burst the moment it is thawed
            os.kill(w1.pid, signal.SIGCONT)
            resumed = json.loads(await asyncio.to_thread(w1.stdout.readline) or "null")
            assert resumed is not None, (tmp_path / "w1.log").read_text()

            digester = wire.Digester(w2.metadata.digest_type)
            overwritten = []
            for entry_id in acked:
                segment = w2.metadata.segment_for(entry_id)
                for position in write_set(entry_id, w2.metadata.ensemble_size, w2.metadata.write_quorum):
                    client = await bk.pool.get(segment.bookies[position])
                    entry = wire.decode_entry(digester, await client.read_entry(ledger_id, entry_id))
                    if entry.payload != b"W2 %d" % entry_id:
                        overwritten.append((entry_id, segment.bookies[position], entry.payload))
            assert not overwritten, f"{len(overwritten)} replicas of W2's acknowledged entries overwritten"
            assert resumed["acked"] == [], f"the frozen writer was acknowledged for {resumed['acked']}"
            assert resumed["error"] is not None
            await w2.close()
    finally:
        if w1.poll() is None:
            os.kill(w1.pid, signal.SIGCONT)
            w1.kill()
        w1.wait()
