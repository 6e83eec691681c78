"""A reopen while a bookie that holds an older writer's unacknowledged entry is down or paused: the new writer's
entries of the same ids are the only ones a reader or a recovery ever meets (repair: tests/replication/
test_repair_faults.py). Real ZooKeeper and bookie processes; the ledger's shape is `ledger_with_a_stranded_entry`'s."""

from __future__ import annotations

import os
import signal

import pytest

from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.errors import LedgerWriteError
from bookfleet.meta.registry import BookieRegistry
from tests.fixtures.strandedentry import PASSWORD, STALE, copies_of, ledger_with_a_stranded_entry


@pytest.mark.parametrize("silence", ["killed", "frozen"])
async def test_a_reopen_leaves_a_silent_bookie_out_of_its_entries(bookie_fleet, zk, zk_connect, silence):
    """Killed, the bookie refuses connections; frozen (SIGSTOP: a paused VM), it accepts them and never answers, so
    a writer that only replaced bookies that fail its adds would have been acknowledged for entry 11 without it."""
    bookies = {bookie.bookie_id: bookie for bookie in bookie_fleet.start(4)}
    ledger_id, holder = await ledger_with_a_stranded_entry(zk_connect, bookies)
    if silence == "killed":
        holder.kill9()
    else:
        os.kill(holder.process.pid, signal.SIGSTOP)

    async with BookKeeper(zk_connect) as bk:
        writer = await bk.reopen_ledger(ledger_id, PASSWORD)
        assert await writer.add(b"B-11") == 11
        await writer.add(b"B-12")
        await writer.flush()
        await writer.detach()

    if silence == "killed":
        holder.start().wait_ready()
    else:
        os.kill(holder.process.pid, signal.SIGCONT)
    async with BookKeeper(zk_connect) as bk:
        reader = await bk.open_ledger(ledger_id, PASSWORD)
        assert (await reader.read(11)).payload == b"B-11"
        recovered = await bk.open_ledger(ledger_id, PASSWORD, recovery=True)
        assert recovered.metadata.last_entry_id == 12
        payloads = [entry.payload async for entry in recovered.entries()]
        assert payloads == [b"A-%d" % e for e in range(11)] + [b"B-11", b"B-12"]
        final = recovered.metadata.segment_for(11).bookies
    assert await copies_of(bookies, ledger_id, 11, final) == [b"B-11"] * 3


async def test_a_reopen_with_no_bookie_to_replace_a_silent_one_is_refused(bookie_fleet, zk, zk_connect):
    bookies = {bookie.bookie_id: bookie for bookie in bookie_fleet.start(3)}
    ledger_id, holder = await ledger_with_a_stranded_entry(zk_connect, bookies)
    holder.kill9()

    async with BookKeeper(zk_connect) as bk:
        with pytest.raises(LedgerWriteError, match=f"bookie {holder.bookie_id} did not answer"):
            await bk.reopen_ledger(ledger_id, PASSWORD)
        holder.start().wait_ready()
        with pytest.raises(LedgerWriteError, match="recover it instead"):
            await bk.reopen_ledger(ledger_id, PASSWORD)  # it answers now, with an entry past the LAC
        recovered = await bk.open_ledger(ledger_id, PASSWORD, recovery=True)
        # No writer was acknowledged for entry 11, so recovery may keep the one copy there is, on every replica.
        assert recovered.metadata.last_entry_id == 11
        assert (await recovered.read(11)).payload == STALE
    writable = [info.bookie_id for info in BookieRegistry(zk).writable()]
    assert await copies_of(bookies, ledger_id, 11, writable) == [STALE] * 3
