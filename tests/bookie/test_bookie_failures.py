"""A bookie whose journal disk fails, and a registration held by another live ZooKeeper session: in-process, so the
fault can be injected under the real Bookie and Registration."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from collections.abc import AsyncIterator

import pytest

from bookfleet import wire
from bookfleet.bookie.config import BookieConfig
from bookfleet.bookie.main import BookieNode
from bookfleet.bookie.registration import Registration
from bookfleet.client.connection import BookieClient, ReadOnlyError
from bookfleet.meta import zk as zkclient
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import MetadataStore, new_metadata
from bookfleet.zkserver import free_port
from tests.fixtures.bookies import MASTER_KEY, encode_test_entry
from tests.fixtures.storage import corrupt_index


async def eventually(condition, what: str, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def registered_bookie(config: BookieConfig, zk) -> AsyncIterator[BookieNode]:
    """The real bookie in this process (so faults can be injected under it), once registered; stopped at the end."""
    bookie = BookieNode(config)
    running = asyncio.create_task(bookie.run())
    try:
        await eventually(lambda: zk.exists(zkpaths.available(config.bookie_id)), "registration")
        yield bookie
    finally:
        bookie.stop()
        await asyncio.wait_for(running, 60)


async def test_a_journal_write_error_turns_the_bookie_read_only_at_once_and_says_why(
    zk_connect, zk, tmp_path, monkeypatch
):
    config = BookieConfig(
        "failing-bookie", free_port(), tmp_path / "journal", tmp_path / "ledgers", zk_connect, verify_ledgers=False
    )
    async with registered_bookie(config, zk), await BookieClient.connect(config.advertised_address) as client:
        assert await client.add_entry(MASTER_KEY, encode_test_entry(1, 0, b"before")) == (1, 0)

        def broken_disk(fd: int) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(os, "fdatasync", broken_disk)
        with pytest.raises(Exception, match="journal write failed"):
            await client.add_entry(MASTER_KEY, encode_test_entry(1, 1, b"lost disk"))
        # At once: the next add is refused as read-only, naming the reason, and the registration has moved.
        why = r"storage failed \(journal write or sync failed in .*: \[Errno 5\] Input/output error"
        with pytest.raises(ReadOnlyError, match=why):
            await client.add_entry(MASTER_KEY, encode_test_entry(2, 0, b"after"))
        assert (await client.bookie_info()).state == wire.BookieState.READ_ONLY
        await eventually(lambda: zk.exists(zkpaths.readonly(config.bookie_id)), "read-only registration")
        assert zk.exists(zkpaths.available(config.bookie_id)) is None
        # One transaction moved it: the writable node went at the zxid that created the read-only one.
        assert zk.exists(zkpaths.AVAILABLE).pzxid == zk.exists(zkpaths.readonly(config.bookie_id)).czxid
        assert await client.read_entry(1, 0) == encode_test_entry(1, 0, b"before")  # reads go on
        monkeypatch.undo()  # before the bookie's own stop


async def test_a_bookie_whose_storage_failed_takes_no_recovery_add(zk_connect, zk, tmp_path, monkeypatch):
    """Unlike a full disk or a forced switch, failed storage keeps no reserve for recovery adds (bookie/readonly.py):
    refused as read-only, even for a ledger whose ensemble names the bookie."""
    config = BookieConfig("failed-bookie", free_port(), tmp_path / "journal", tmp_path / "ledgers", zk_connect)
    ledger_id = MetadataStore(zk).create(new_metadata([config.bookie_id], 1, 1))
    async with registered_bookie(config, zk), await BookieClient.connect(config.advertised_address) as client:
        assert await client.add_entry(MASTER_KEY, encode_test_entry(ledger_id, 0, b"before")) == (ledger_id, 0)

        def broken_disk(fd: int) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(os, "fdatasync", broken_disk)
        with pytest.raises(Exception, match="journal write failed"):
            await client.add_entry(MASTER_KEY, encode_test_entry(ledger_id, 1, b"lost disk"))
        with pytest.raises(ReadOnlyError, match=r"storage failed \(journal write or sync failed"):
            await client.add_entry(MASTER_KEY, encode_test_entry(ledger_id, 1, b"recovered"), recovery=True)
        monkeypatch.undo()  # before the bookie's own stop


async def test_a_corrupt_index_turns_the_bookie_read_only_and_says_why(zk_connect, zk, tmp_path):
    """Not one quarantined ledger per flush: the bookie leaves the writable set and goes on serving reads."""
    config = BookieConfig(
        "corrupt-index-bookie", free_port(), tmp_path / "journal", tmp_path / "ledgers", zk_connect,
        verify_ledgers=False,
    )
    async with registered_bookie(config, zk), await BookieClient.connect(config.advertised_address) as client:
        assert await client.add_entry(MASTER_KEY, encode_test_entry(1, 0, b"before")) == (1, 0)
        corrupt_index(config.ledger_dir, "corrupt_pages")
        assert await client.add_entry(MASTER_KEY, encode_test_entry(2, 0, b"after")) == (2, 0)  # journaled

        await eventually(lambda: zk.exists(zkpaths.readonly(config.bookie_id)), "read-only registration")
        assert zk.exists(zkpaths.available(config.bookie_id)) is None
        assert (await client.bookie_info()).state == wire.BookieState.READ_ONLY
        why = r"storage failed \(memtable flush failed: the ledger index is corrupt \(SQLITE_CORRUPT"
        with pytest.raises(ReadOnlyError, match=why):
            await client.add_entry(MASTER_KEY, encode_test_entry(3, 0, b"refused"))
        assert await client.read_entry(2, 0) == encode_test_entry(2, 0, b"after")  # still in memory


async def test_registration_waits_for_another_sessions_node_to_expire(zk_connect, zk, caplog):
    path = zkpaths.available("contested")
    other = await asyncio.to_thread(zkclient.connect, zk_connect)
    other_session = other.client_id[0]
    other.create(path, b"{}", ephemeral=True, makepath=True)
    registration = Registration(zk, "contested", "127.0.0.1:1", "", 0)
    with caplog.at_level(logging.WARNING, logger="bookfleet.bookie.registration"):
        registration.start()
        try:
            await eventually(lambda: "waiting for that session to end" in caplog.text, "the registration to wait")
            assert zk.exists(path).ephemeralOwner == other_session  # never deleted under a live session
            assert not registration.registered
            await asyncio.to_thread(other.stop)  # that session ends: its node goes, ours takes its place
            await registration.wait_registered(30)
            assert zk.exists(path).ephemeralOwner == zk.client_id[0]
        finally:
            await registration.close()
            await asyncio.to_thread(other.close)
