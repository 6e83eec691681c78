"""Ledger metadata against a real ZooKeeper: validation, compare-and-set, ledgers by bookie, listing."""

from __future__ import annotations

import pytest
from kazoo.exceptions import ConnectionLoss
from pydantic import ValidationError

from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import (
    LedgerMetadata,
    LedgerState,
    MetadataStore,
    MetadataVersionConflict,
    NoSuchLedgerError,
    Segment,
    new_metadata,
)


def metadata(bookies=("b1", "b2", "b3"), qw=3, qa=2) -> LedgerMetadata:
    return new_metadata(bookies, qw, qa, password=b"secret", custom={"app": "test"})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"write_quorum": 4}, "E=3 Qw=4 Qa=2"),
        ({"ack_quorum": 3, "write_quorum": 2}, "E=3 Qw=2 Qa=3"),
        ({"segments": []}, "at least one segment"),
        ({"segments": [{"first_entry_id": 1, "bookies": ["b1", "b2", "b3"]}]}, "must start at entry 0"),
        ({"segments": [{"first_entry_id": 0, "bookies": ["b1", "b1", "b3"]}]}, "3 distinct bookies"),
        ({"segments": [{"first_entry_id": 0, "bookies": ["b1", "b2"]}]}, "3 distinct bookies"),
        (
            {
                "segments": [
                    {"first_entry_id": 0, "bookies": ["b1", "b2", "b3"]},
                    {"first_entry_id": 0, "bookies": ["b1", "b2", "b4"]},
                ]
            },
            "strictly increase",
        ),
    ],
)
def test_invariants_are_validated_with_clear_errors(changes, message):
    data = {**metadata().model_dump(), **changes}
    with pytest.raises(ValidationError, match=message):
        LedgerMetadata.model_validate(data)


def test_password_is_kept_in_plain_as_bookkeeper_does_but_never_printed():
    meta = metadata()
    assert meta.password == b"secret" and meta.password_matches(b"secret") and not meta.password_matches(b"other")
    assert b"secret" in meta.encode()
    assert "secret" not in meta.model_dump_json() and "secret" not in repr(meta)
    assert meta.with_closed(-1, 0).password == b"secret"  # derived copies keep it


def test_segments_fragments_and_ensemble_change():
    meta = metadata(("b1", "b2", "b3", "b4"), qw=3, qa=2)
    in_place = meta.with_ensemble_change(0, 1, "b9")
    assert [s.bookies for s in in_place.segments] == [("b1", "b9", "b3", "b4")]
    changed = meta.with_ensemble_change(5, 1, "b9").with_closed(last_entry_id=9, length=100)
    assert changed.segment_for(4).bookies == ("b1", "b2", "b3", "b4")
    assert changed.segment_for(5).bookies == ("b1", "b9", "b3", "b4")
    assert changed.bookies() == {"b1", "b2", "b3", "b4", "b9"}
    assert [(f.first_entry_id, f.last_entry_id) for f in changed.fragments()] == [(0, 4), (5, 9)]
    assert list(changed.fragments()[1].entry_ids()) == [5, 6, 7, 8, 9]
    assert meta.fragments()[0].last_entry_id is None  # open tail
    with pytest.raises(ValidationError, match="distinct"):
        meta.with_ensemble_change(5, 1, "b3")


def test_create_read_update_delete_and_ledgers_by_bookie(zk):
    store = MetadataStore(zk)
    first = store.create(metadata())
    second = store.create(metadata(("b2", "b3", "b4")))
    assert second > first
    assert not zk.get_children(zkpaths.IDGEN)  # the sequential nodes are removed after use
    meta, version = store.read(first)
    assert meta == metadata().model_copy(update={"ctime": meta.ctime}) and version == 0
    assert store.ledgers_on_bookie("b1") == [first]
    assert store.ledgers_on_bookie("b3") == [first, second]

    changed = meta.with_ensemble_change(0, 0, "b5")
    assert store.update(first, changed, version) == 1
    assert store.ledgers_on_bookie("b1") == []
    assert store.ledgers_on_bookie("b5") == [first]
    assert store.ledger_ids() == [first, second]

    store.delete(first)
    assert store.ledger_ids() == [second]
    assert store.ledgers_on_bookie("b5") == [] and store.ledgers_on_bookie("b3") == [second]
    with pytest.raises(NoSuchLedgerError, match=f"ledger {first} does not exist"):
        store.read(first)
    with pytest.raises(NoSuchLedgerError, match=f"ledger {first} does not exist"):
        store.delete(first)


def test_compare_and_set_rejects_a_stale_version(zk):
    store = MetadataStore(zk)
    ledger_id = store.create(metadata())
    meta, version = store.read(ledger_id)
    store.update(ledger_id, meta.with_state(LedgerState.IN_RECOVERY), version)
    with pytest.raises(MetadataVersionConflict, match=f"ledger {ledger_id} changed since version 0"):
        store.update(ledger_id, meta.with_ensemble_change(0, 0, "b7"), version)
    current, _ = store.read(ledger_id)
    assert current.state == LedgerState.IN_RECOVERY
    assert store.ledgers_on_bookie("b7") == []


def test_listing_walks_the_hierarchy_and_skips_other_dirs(zk):
    store = MetadataStore(zk)
    ids = [12_345_678_901, 7, 10_000, 2**31 - 2, 2**31 - 1, 2**63 - 1]
    for ledger_id in ids:
        store.create(metadata(), ledger_id=ledger_id)
    zk.ensure_path(zkpaths.available("b1"))
    zk.ensure_path(zkpaths.underreplicated(7))
    zk.ensure_path(zkpaths.INSTANCE_ID)
    assert zk.exists("/ledgers/00/0000/L0007") and zk.exists("/ledgers/21/4748/L3646")
    assert zk.exists("/ledgers/000/0000/0021/4748/L3647") and zk.exists("/ledgers/000/0000/0123/4567/L8901")
    assert store.ledger_ids() == sorted(ids)


def test_the_count_agrees_with_the_listing_without_listing_an_id(zk):
    """count() adds up the second level's child counts (how `bookfleet status` counts 100,000 ledgers): the same
    number as the walk, across levels and after a delete, and nothing outside the layout is counted."""
    store = MetadataStore(zk)
    assert store.count() == 0
    ids = [12_345_678_901, 7, 8, 10_000, 20_000]
    for ledger_id in ids:
        store.create(metadata(), ledger_id=ledger_id)
    zk.ensure_path(zkpaths.available("b1"))
    zk.ensure_path(zkpaths.underreplicated(7))
    store.delete(8)
    assert store.count() == len(store.ledger_ids()) == 4


def test_negative_segment_start_is_named():
    with pytest.raises(ValidationError, match="first_entry_id"):
        Segment(first_entry_id=-1, bookies=("a",))


def test_writer_epoch_starts_at_0_rides_in_custom_metadata_and_reads_as_0_where_absent():
    created = metadata()
    assert created.writer_epoch == 0
    raised = created.with_next_writer_epoch().with_next_writer_epoch()
    assert raised.writer_epoch == 2 and LedgerMetadata.decode(raised.encode()).writer_epoch == 2
    assert b"bookfleet.writerEpoch" in raised.encode() and b"bookfleet.writerEpoch" not in created.encode()
    assert LedgerMetadata.decode(raised.encode()).custom == {"app": "test"}  # bookfleet's keys stay out of it
    with pytest.raises(ValidationError, match="writer_epoch"):
        LedgerMetadata.model_validate({**created.model_dump(), "writer_epoch": -1})
    with pytest.raises(ValidationError, match="bookfleet's"):
        new_metadata(("b1",), 1, 1, custom={"bookfleet.writerEpoch": "9"})


class LosesTheReply:
    """A transaction whose reply is lost with the connection, after (applied=True) or before ZooKeeper applied it."""

    def __init__(self, txn, applied: bool):
        self._txn, self._applied = txn, applied

    def __getattr__(self, name):
        return getattr(self._txn, name)

    def commit(self):
        if self._applied:
            self._txn.commit()
        raise ConnectionLoss()


@pytest.mark.parametrize("applied", [True, False])
def test_an_update_whose_reply_is_lost_is_settled_by_reading_back(zk, monkeypatch, applied):
    store = MetadataStore(zk)
    ledger_id = store.create(metadata())
    meta, version = store.read(ledger_id)
    changed = meta.with_ensemble_change(0, 0, "b5")
    transaction = zk.transaction
    monkeypatch.setattr(zk, "transaction", lambda: LosesTheReply(transaction(), applied))
    if applied:
        assert store.update(ledger_id, changed, version) == version + 1
    else:  # not applied: the caller's re-read and re-apply (as after any conflict) does it, never a blind rewrite
        with pytest.raises(MetadataVersionConflict):
            store.update(ledger_id, changed, version)
    assert store.read(ledger_id) == ((changed, 1) if applied else (meta, 0))


def test_ids_go_on_past_31_bits_as_bookkeepers_generator_hands_them_out(zk, monkeypatch):
    """A ZooKeeper sequence is a signed 32-bit counter: once /ledgers/idgen's overflows, ids come from the newest
    /ledgers/idgen-long/HOB-<high> level (high 32 bits) and its own sequence (low 32 bits), a level after another."""
    store = MetadataStore(zk)
    assert 0 <= store.new_ledger_id() < 2**31 - 1 and not zk.exists(zkpaths.IDGEN_LONG)
    sequence = store._sequence

    def overflowing(level: str):
        return lambda prefix: -(2**31) if prefix.startswith(level) else sequence(prefix)

    monkeypatch.setattr(store, "_sequence", overflowing(zkpaths.IDGEN_PREFIX))
    first, second = store.new_ledger_id(), store.new_ledger_id()
    assert first >> 32 == second >> 32 == 1 and second > first and zk.exists(zkpaths.high_bits(1))
    monkeypatch.setattr(store, "_sequence", sequence)
    assert store.new_ledger_id() >> 32 == 1  # idgen-long exists: no short id any more
    monkeypatch.setattr(store, "_sequence", overflowing(zkpaths.high_bits(1)))
    assert store.new_ledger_id() >> 32 == 2 and zk.exists(zkpaths.high_bits(2))
    store.create(metadata(), ledger_id=first)
    assert store.ledger_ids() == [first] and zkpaths.ledger(first).startswith("/ledgers/000/0000/0042/9496/L")
