"""Under-replication markers, locks, switches and DATA_LOSS records against a real ZooKeeper."""

import threading
import time

import pytest

from bookfleet.meta import zk as zkclient
from bookfleet.meta import zkpaths
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.polling import wait_for
from tests.fixtures.zookeeper import count_requests


def test_marking_is_idempotent_and_merges_missing_bookies(zk):
    ur = UnderReplication(zk)
    first = ur.mark(5, ["b1"])
    assert ur.mark(5, ["b1"]) == first  # nothing changes, not even the version
    merged = ur.mark(5, ["b2", "b1"])
    assert merged.missing_bookies == {"b1", "b2"}
    assert merged.ctime == first.ctime
    assert merged.version == first.version + 1
    assert zk.exists(zkpaths.underreplicated(5))


def test_a_marker_says_why_it_names_each_bookie(zk):
    ur = UnderReplication(zk)
    ur.mark_all([7], ["lost"], lost=True)
    ur.mark(7, ["checked"])
    first = ur.mark(7, ["skipped"], missed_entries=True)
    assert first.missing_bookies == {"lost", "checked", "skipped"}
    assert (first.lost_bookies, first.missed_entries) == ({"lost"}, {"skipped"})
    assert first.grace_start == first.missed_at >= first.ctime
    wait_for(lambda: time.time() * 1000 > first.missed_at + 1, 10, "the clock to move on")
    again = ur.mark(7, ["skipped"], missed_entries=True)  # the writer names the bookie again: the grace restarts
    assert again == ur.marker(7) and again.missed_at > first.missed_at and again.ctime == first.ctime
    assert ur.mark(7, ["lost"]) == again  # a replica check naming a lost bookie changes nothing


def test_mark_all_marks_new_ledgers_and_merges_into_existing_markers(zk):
    ur = UnderReplication(zk)
    kept = ur.mark(2, ["b1"])
    ur.mark(3, ["b2"])
    marked = ur.mark_all([1, 2, 3], ["b1"])
    assert [m.ledger_id for m in marked] == [1, 2, 3]
    assert marked[0].missing_bookies == {"b1"} and marked[0] == ur.marker(1)
    assert marked[1] == kept  # already missing b1: untouched
    assert marked[2].missing_bookies == {"b1", "b2"} and marked[2] == ur.marker(3)
    assert ur.ledger_ids() == [1, 2, 3]


def test_mark_all_takes_about_one_request_per_fresh_ledger(zk, monkeypatch):
    """A lost bookie's ledgers are marked with one transaction each (own level and marker), the shared levels once:
    kazoo's makepath costs a failed create plus an exists and a create per missing level, for every ledger."""
    zk.ensure_path(zkpaths.UR_LEDGERS)  # as in any fleet
    ledger_ids = [*range(100), 70000]
    requests = count_requests(zk, monkeypatch)
    marked = UnderReplication(zk).mark_all(ledger_ids, ["b1"])
    monkeypatch.undo()
    assert len(requests) <= len(ledger_ids) + 5, len(requests)  # + exists, 4 shared levels
    assert marked == [UnderReplication(zk).marker(ledger_id) for ledger_id in ledger_ids]


def test_mark_all_marks_a_ledger_whose_level_was_left_behind(zk):
    """clear() prunes empty levels only on a best-effort basis: a ledger's own level may exist without a marker."""
    ur = UnderReplication(zk)
    zk.ensure_path(zkpaths.underreplicated(4).rsplit("/", 1)[0])
    (marker,) = ur.mark_all([4], ["b1"])
    assert marker == ur.marker(4) and marker.missing_bookies == {"b1"}


def test_cleared_markers_leave_no_empty_levels(zk):
    ur = UnderReplication(zk)
    markers = ur.mark_all([7, 8, 70000], ["b1"])
    txn = zk.transaction()
    for marker in markers[:2]:
        ur.clear_in(txn, marker)
    assert not any(isinstance(result, Exception) for result in txn.commit())
    ur.prune_levels(ur.shared_levels([7, 8]))
    assert ur.ledger_ids() == [70000]
    assert ur.clear(markers[2])
    assert zk.get_children(zkpaths.UR_LEDGERS) == []


def test_concurrent_marks_lose_no_bookie(zk, zk_connect):
    clients = [zkclient.connect(zk_connect) for _ in range(4)]
    try:
        threads = [
            threading.Thread(target=UnderReplication(client).mark, args=(9, [f"b{n}"]))
            for n, client in enumerate(clients)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for client in clients:
            client.stop()
            client.close()
    assert UnderReplication(zk).marker(9).missing_bookies == {"b0", "b1", "b2", "b3"}


def test_listing_walks_the_hex_levels(zk):
    ur = UnderReplication(zk)
    for ledger_id in (1, 70000, 2**40 + 3):
        ur.mark(ledger_id, ["b1"])
    assert ur.ledger_ids() == [1, 70000, 2**40 + 3]
    assert [m.ledger_id for m in ur.markers()] == [1, 70000, 2**40 + 3]


def test_clear_only_if_unchanged_since_read(zk):
    ur = UnderReplication(zk)
    read = ur.mark(3, ["b1"])
    ur.mark(3, ["b2"])  # a new loss while a repair worked from `read`
    assert not ur.clear(read)
    assert ur.marker(3).missing_bookies == {"b1", "b2"}
    assert ur.clear(ur.marker(3))
    assert ur.marker(3) is None
    assert ur.ledger_ids() == []
    assert zk.get_children(zkpaths.UR_LEDGERS) == []  # empty hex levels are pruned
    assert not ur.clear(read)


def test_lock_is_exclusive_ephemeral_and_released_only_by_its_holder(zk, zk_connect):
    ur = UnderReplication(zk)
    other = zkclient.connect(zk_connect)
    try:
        assert UnderReplication(other).acquire(4)
        assert not ur.acquire(4)
        ur.release(4)  # not ours: stays
        assert ur.is_locked(4)
    finally:
        other.stop()
        other.close()
    assert not ur.is_locked(4)  # died with the holder's session
    assert ur.acquire(4)
    ur.release(4)
    assert not ur.is_locked(4)


def test_a_lock_watch_learns_from_watches_when_another_sessions_locks_go(zk, zk_connect, monkeypatch):
    """A repair that found ledgers locked by another repair waits for those locks to go: released, or gone with their
    holder's session. It learns it from ZooKeeper watches: waiting on locks that stay sends nothing."""
    other = zkclient.connect(zk_connect)
    try:
        holder = UnderReplication(other)
        assert holder.acquire_all([1, 2, 3], "other repair") == {1, 2, 3}
        watch = UnderReplication(zk).lock_watch()
        assert watch.watch([1, 2, 3, 4]) == {4}  # never locked: nothing to wait for

        requests = count_requests(zk, monkeypatch)
        assert watch.wait(1.0) == set()  # nothing went within the bound
        assert requests == []  # no polling
        monkeypatch.undo()

        other.set(zkpaths.underreplication_lock(2), b"still the other repair")
        holder.release(1)
        assert watch.wait(300) == {1}  # the data change is not a release; its watch is set again
    finally:
        other.stop()
        other.close()
    gone: set[int] = set()
    while gone != {2, 3}:  # the holder's session closed: its ephemeral locks went with it
        went = watch.wait(300)
        assert went and went <= {2, 3}, went
        gone |= went


def test_locks_of_a_fleets_first_repair_take_one_request_each(zk, monkeypatch):
    zk.ensure_path(zkpaths.UR_LEDGERS)  # marked, never locked
    requests = count_requests(zk, monkeypatch)
    assert UnderReplication(zk).acquire_all(range(50), "repair") == set(range(50))
    monkeypatch.undo()
    assert len(requests) <= 50 + 3, len(requests)  # + the locks' parent, once


def test_a_repair_over_many_markers_keeps_a_bounded_number_of_zookeeper_calls_in_flight(zk, monkeypatch):
    """A repair driver read and locked 46,000 markers in one pipeline each; its heartbeat queued behind them and its
    4 s session expired. Locking goes in windows of PIPELINE_WINDOW calls (reading and walking in a few multiRead
    requests: zk.read_many)."""
    window = 20
    monkeypatch.setattr(zkclient, "PIPELINE_WINDOW", window)
    ur = UnderReplication(zk)
    ur.mark_all(range(5 * window), ["lost"])
    issued, peak = [], [0]

    def counted(call):
        def start(*args, **kwargs):
            issued.append(call(*args, **kwargs))
            peak[0] = max(peak[0], sum(not result.ready() for result in issued))
            return issued[-1]

        return start

    for name in ("get_async", "create_async", "get_children_async"):
        monkeypatch.setattr(zk, name, counted(getattr(zk, name)))
    markers = ur.markers()
    locked = ur.acquire_all([marker.ledger_id for marker in markers], "repair")
    assert [marker.ledger_id for marker in markers] == sorted(locked) == list(range(5 * window))
    assert 0 < peak[0] <= window, peak[0]


def test_disable_switch(zk):
    ur = UnderReplication(zk)
    seen = []
    ur.watch_disabled(seen.append)
    assert not ur.is_disabled()
    ur.disable()
    ur.disable()
    assert ur.is_disabled()
    # A watch is level-based: a change made before it re-read the node is seen only as the final state.
    wait_for(lambda: seen == [False, True], timeout=60, what=f"the watch to see the switch on (saw {seen})")
    ur.enable()
    assert not ur.is_disabled()
    wait_for(lambda: seen == [False, True, False], timeout=60, what=f"the watch to see the switch off (saw {seen})")


def test_recovery_delay_changes_at_run_time_in_bookkeepers_whole_seconds(zk):
    ur = UnderReplication(zk)
    assert ur.recovery_delay(default=30.0) == 30.0
    seen = []
    ur.watch_recovery_delay(seen.append, default=30.0)
    ur.set_recovery_delay(2)
    assert ur.recovery_delay() == 2 and zk.get(zkpaths.UR_RECOVERY_DELAY)[0] == b"2"
    wait_for(lambda: seen == [30.0, 2.0], timeout=60, what=f"the watch to see the delay 2 (saw {seen})")
    ur.set_recovery_delay(0)
    wait_for(lambda: seen == [30.0, 2.0, 0.0], timeout=60, what=f"the watch to see the delay 0 (saw {seen})")
    for refused in (-1, 1.5):
        with pytest.raises(ValueError, match="lostBookieRecoveryDelay must be whole seconds >= 0"):
            ur.set_recovery_delay(refused)


def test_data_loss_records_merge_and_list(zk):
    ur = UnderReplication(zk)
    assert ur.data_loss(8) is None
    first = ur.mark_data_loss(8, [4, 2])
    assert ur.mark_data_loss(8, [3]).entries == (2, 3, 4)
    ur.mark_data_loss(12, [0])
    assert [(r.ledger_id, r.entries) for r in ur.data_losses()] == [(8, (2, 3, 4)), (12, (0,))]
    assert ur.data_loss(8).ctime == first.ctime

