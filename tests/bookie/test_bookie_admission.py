"""Ledger admission's ZooKeeper traffic (bookie/admission.py): a ledger that exists costs one read; a miss is synced
and read again before it is believed (a lagging server); whether a ledger is closed is read after a sync. On a
stand-in for kazoo's async calls, in milliseconds."""

from __future__ import annotations

import asyncio

import pytest
from kazoo.exceptions import NoNodeError

from bookfleet.bookie.admission import LedgerAdmission
from bookfleet.bookie.errors import UnknownLedger
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import new_metadata

LEDGER = 42
METADATA = new_metadata(["b1", "b2", "b3"], 3, 2)


class Answer:
    def __init__(self, data: bytes | None):
        self.data = data

    def get(self) -> tuple[bytes, object]:
        if self.data is None:
            raise NoNodeError()
        return self.data, None

    def rawlink(self, callback) -> None:
        callback(self)


class LaggingZooKeeper:
    """The session's server has the ledger's node only once a sync brought it up to date (`lagging`), or never
    (`data` None); every call is recorded."""

    def __init__(self, data: bytes | None, lagging: bool):
        self.data, self.synced, self.calls = data, not lagging, []

    def get_async(self, path: str) -> Answer:
        self.calls.append(("get", path))
        return Answer(self.data if self.synced else None)

    def sync_async(self, path: str) -> Answer:
        self.calls.append(("sync", path))
        self.synced = True
        return Answer(b"")


def admit(zk: LaggingZooKeeper) -> list[str]:
    admission = LedgerAdmission(zk, holds=lambda ledger_id: False)
    asyncio.run(admission.admit(LEDGER))
    assert admission.admitted(LEDGER)  # remembered: no second lookup
    return [call for call, path in zk.calls if path == zkpaths.ledger(LEDGER)]


def test_an_existing_ledger_costs_one_read():
    assert admit(LaggingZooKeeper(METADATA.encode(), lagging=False)) == ["get"]


def test_a_miss_on_a_lagging_server_is_synced_and_read_again_before_it_is_believed():
    assert admit(LaggingZooKeeper(METADATA.encode(), lagging=True)) == ["get", "sync", "get"]


def test_a_ledger_without_metadata_is_refused_after_the_synced_read():
    zk = LaggingZooKeeper(None, lagging=True)
    with pytest.raises(UnknownLedger):
        asyncio.run(LedgerAdmission(zk, holds=lambda ledger_id: False).admit(LEDGER))
    assert [call for call, _ in zk.calls] == ["get", "sync", "get"]


def test_closed_is_read_after_a_sync_so_a_lagging_server_never_makes_a_closed_ledger_look_open():
    zk = LaggingZooKeeper(METADATA.with_closed(4, 500).encode(), lagging=True)
    assert asyncio.run(LedgerAdmission(zk, holds=lambda ledger_id: True).closed(LEDGER))
    assert [call for call, _ in zk.calls] == ["sync", "get"]


def test_what_admission_remembers_is_bounded_least_recently_used_first():
    zk = LaggingZooKeeper(METADATA.with_closed(4, 500).encode(), lagging=False)
    admission = LedgerAdmission(zk, holds=lambda ledger_id: False, cache_ledgers=2)

    async def ask(kind, *ledger_ids: int) -> list[tuple[str, str]]:
        zk.calls.clear()
        for ledger_id in ledger_ids:
            await kind(ledger_id)
        return zk.calls

    asyncio.run(ask(admission.admit, 1, 2))
    assert admission.admitted(1)  # 1 is now used more recently than 2
    asyncio.run(ask(admission.admit, 3))  # past the bound: 2 is forgotten, not 1
    assert [admission.admitted(ledger_id) for ledger_id in (1, 2, 3)] == [True, False, True]
    assert asyncio.run(ask(admission.admit, 1, 2)) == [("get", zkpaths.ledger(2))]  # only 2 is looked up again

    asyncio.run(ask(admission.closed, 1, 2, 1, 3))
    assert asyncio.run(ask(admission.closed, 1, 2)) == [("sync", zkpaths.ledger(2)), ("get", zkpaths.ledger(2))]


def test_ensemble_membership_is_read_after_a_sync_per_segment_and_its_ranges_remembered():
    """What a read-only bookie asks before a recovery add: b2 stores entries 0-4 only (b4 took its place from 5)."""
    changed = METADATA.with_ensemble_change(5, 1, "b4")
    zk = LaggingZooKeeper(changed.encode(), lagging=True)
    admission = LedgerAdmission(zk, holds=lambda ledger_id: True, bookie_id="b2")

    async def ask(entry_id: int) -> tuple[bool, list[str]]:
        zk.calls.clear()
        return await admission.in_ensemble(LEDGER, entry_id), [call for call, _ in zk.calls]

    assert asyncio.run(ask(3)) == (True, ["sync", "get"])  # a lagging server cannot hide the newest segment
    assert asyncio.run(ask(4)) == (True, [])  # remembered
    assert asyncio.run(ask(5)) == (False, ["sync", "get"])  # a new home: asked again, and refused
    assert not asyncio.run(LedgerAdmission(zk, holds=lambda ledger_id: True).in_ensemble(LEDGER, 0))  # no own id
