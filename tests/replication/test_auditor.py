"""The auditor against real bookies: lost-bookie delay, returns, election failover, stale markers, replica check and
its schedule."""

import asyncio
import contextlib
import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from bookfleet import polling, wire
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.connection import BookieClient
from bookfleet.client.pool import BookiePool
from bookfleet.meta import zk as zkclient
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import MetadataStore, new_metadata
from bookfleet.meta.underreplication import UnderReplication, auditor_of_vote
from bookfleet.replication import auditor as auditor_module
from bookfleet.replication.auditor import (
    WEEK,
    Auditor,
    check_ledgers,
    clear_stale_markers,
    first_check_delay,
    mark_lost_bookie,
    read_checks,
)
from tests.fixtures.bookies import paused

DAY = 24 * 3600
NOW_MS = 1_700_000_000_000


def wait_for(condition, timeout=15.0, what="condition"):
    return polling.wait_for(condition, timeout, what, interval=0.02)


def stays(condition, seconds):
    """`condition` holds throughout `seconds` (for things that must NOT happen)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert condition(), condition.__doc__ or "a condition that must hold broke"
        time.sleep(0.05)


async def _write_ledgers(zk, count):
    async with BookKeeper(zk) as bk:
        for n in range(count):
            writer = await bk.create_ledger(3, 2, 2)
            for e in range(5):
                await writer.add(f"ledger {n} entry {e}".encode())
            await writer.close()


def _start_fleet(zk, bookie_fleet, **bookie_flags):
    bookies = bookie_fleet.start(4, **bookie_flags)
    asyncio.run(_write_ledgers(zk, 8))
    return bookies


@pytest.fixture
def fleet(zk, bookie_fleet):
    """Four bookies holding eight closed ledgers (E=3, Qw=2), so every bookie has some."""
    return _start_fleet(zk, bookie_fleet)


FREEZE_SESSION_TIMEOUT = 40.0
"""ZooKeeper's cap at its 2 s tick: a bookie frozen for less keeps its registration."""


@pytest.fixture
def freezable_fleet(zk, bookie_fleet, monkeypatch):
    """The fleet, where a frozen bookie holds the replica check for exactly as long as the test freezes it: its reads
    wait for the bookie, not for a deadline, and the bookie keeps its registration meanwhile (a loss the test does
    not make would be marked otherwise)."""
    monkeypatch.setattr(auditor_module, "READ_TIMEOUT", 3600.0)
    return _start_fleet(zk, bookie_fleet, zk_session_timeout=FREEZE_SESSION_TIMEOUT)


@pytest.fixture
def auditor_sessions(zk_connect):
    """Factory of auditors, each with its own ZooKeeper session; all stopped and closed at teardown."""
    started = []

    def make(name, **settings):
        client = zkclient.connect(zk_connect)
        auditor = Auditor(client, name, **settings)
        started.append((auditor, client))
        return auditor.start(), client

    yield make
    for auditor, client in started:
        auditor.stop()
        client.stop()
        client.close()


def _markers(zk):
    return {m.ledger_id: m.missing_bookies for m in UnderReplication(zk).markers()}


def _emptied(zk, bookie):
    """`bookie` back on empty disks under its old id: registered, answering "no such ledger" for every replica it
    had; returns the markers a replica check makes of that."""
    bookie.stop()
    bookie.wipe()
    zk.delete(zkpaths.cookie(bookie.bookie_id))
    bookie.start().wait_ready()
    return {ledger_id: {bookie.bookie_id} for ledger_id in MetadataStore(zk).ledgers_on_bookie(bookie.bookie_id)}


def _now_ms():
    return int(time.time() * 1000)


def _connected_to(port):
    """Whether this host holds an established TCP connection to 127.0.0.1:`port` (a frozen bookie's, in its accept
    queue: the client side's line is the one whose remote end is the port)."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return any(remote == f"0100007F:{port:04X}" and state == "01" for _, _, remote, state, *_ in rows)


def _checked_since(ur, since_ms):
    """Whether a full check finished at or after `since_ms` (a record that does not parse yet: not)."""
    try:
        return (ur.check_all_ledgers_ctime() or 0) >= since_ms
    except ValueError:
        return False


def test_with_no_check_recorded_the_first_check_is_at_once():
    assert first_check_delay(None, NOW_MS, WEEK) == 0


def test_a_recent_check_is_waited_out_for_the_rest_of_the_interval_and_an_overdue_one_not():
    assert first_check_delay(NOW_MS - 3600_000, NOW_MS, WEEK) == WEEK - 3600
    assert first_check_delay(NOW_MS - int(WEEK * 1000), NOW_MS, WEEK) == 0
    assert first_check_delay(NOW_MS - 30 * DAY * 1000, NOW_MS, WEEK) == 0


def test_a_check_recorded_ahead_of_this_hosts_clock_counts_as_just_now():
    assert first_check_delay(NOW_MS + 60_000, NOW_MS, WEEK) == WEEK


def test_restarts_more_often_than_the_interval_never_push_the_check_back():
    """An auditor that took office every day once set its weekly check a week from each start: it never ran."""
    restarts = range(NOW_MS, NOW_MS + 7 * DAY * 1000, DAY * 1000)
    assert {restart + first_check_delay(NOW_MS, restart, WEEK) * 1000 for restart in restarts} == {
        NOW_MS + WEEK * 1000}


def test_lost_bookie_is_marked_after_the_delay_read_at_run_time(zk, fleet, auditor_sessions):
    ur = UnderReplication(zk)
    ur.set_recovery_delay(60)
    auditor, _ = auditor_sessions("a1")
    assert auditor.wait_active(10)
    lost = fleet[0]
    expected = MetadataStore(zk).ledgers_on_bookie(lost.bookie_id)
    assert expected

    lost.stop()
    stays(lambda: _markers(zk) == {}, 0.5)  # 60 s delay: not lost yet
    ur.set_recovery_delay(1)  # the running auditor picks the new delay up through its watch
    wait_for(lambda: _markers(zk) == {ledger_id: {lost.bookie_id} for ledger_id in expected}, what="all marked")


def test_bookie_returning_within_the_delay_marks_nothing(zk, fleet, auditor_sessions):
    ur = UnderReplication(zk)
    ur.set_recovery_delay(10)
    auditor, _ = auditor_sessions("a1")
    assert auditor.wait_active(10)
    fleet[1].stop()
    fleet[1].start().wait_ready()  # same id, same cookie and data
    ur.set_recovery_delay(0)  # a loss still pending would be marked at once now
    stays(lambda: _markers(zk) == {}, 1.0)


def test_disable_switch_defers_marking_until_enabled(zk, fleet, auditor_sessions):
    ur = UnderReplication(zk)
    ur.set_recovery_delay(1)
    ur.disable()
    auditor, _ = auditor_sessions("a1")
    assert auditor.wait_active(10)
    fleet[2].stop()
    stays(lambda: _markers(zk) == {}, 0.8)
    ur.enable()
    expected = set(MetadataStore(zk).ledgers_on_bookie(fleet[2].bookie_id))
    wait_for(lambda: set(_markers(zk)) == expected, what="marking after enable")


def test_standby_takes_over_when_the_active_auditor_dies_and_still_marks(zk, fleet, auditor_sessions):
    UnderReplication(zk).set_recovery_delay(1)
    first, first_session = auditor_sessions("a1")
    assert first.wait_active(10)
    standby, _ = auditor_sessions("a2")
    stays(lambda: not standby.is_active, 0.3)

    first_session.stop()  # the active auditor's ZooKeeper session dies
    assert standby.wait_active(10)
    wait_for(lambda: not first.is_active, what="old auditor stepping down")
    lost = fleet[3]
    lost.stop()
    expected = set(MetadataStore(zk).ledgers_on_bookie(lost.bookie_id))
    wait_for(lambda: set(_markers(zk)) == expected, what="marking by the standby")


def test_new_auditor_clears_stale_markers_and_catches_bookies_lost_while_none_ran(zk, fleet, auditor_sessions):
    store = MetadataStore(zk)
    back, gone = fleet[0], fleet[1]
    stale = mark_lost_bookie(zk, back.bookie_id)  # marked, but the bookie is up with all its replicas
    gone.stop()  # vanished while no auditor ran
    only_gone = set(store.ledgers_on_bookie(gone.bookie_id)) - set(stale)
    UnderReplication(zk).set_recovery_delay(1)

    auditor, _ = auditor_sessions("a1")
    assert auditor.wait_active(10)
    expected = {ledger_id: {gone.bookie_id} for ledger_id in store.ledgers_on_bookie(gone.bookie_id)}
    wait_for(lambda: _markers(zk) == expected, what="stale markers cleared and the vanished bookie marked")
    assert only_gone <= set(expected)


def test_periodic_replica_check_marks_only_replicas_that_answer_they_are_gone(zk, fleet, auditor_sessions):
    assert check_ledgers(zk) == []  # every replica answers
    UnderReplication(zk).set_recovery_delay(3600)  # only the replica check may mark in this test
    expected = _emptied(zk, fleet[2])
    down = fleet[3]
    down.stop()  # unreachable: the lost-bookie rule's to judge after the delay, not the check's
    auditor, _ = auditor_sessions("a1", check_interval=0.5)
    assert auditor.wait_active(10)
    wait_for(lambda: _markers(zk) == expected, what="marking by the periodic check")
    assert auditor.check_now() == sorted(expected)  # idempotent: same markers again
    assert MetadataStore(zk).ledgers_on_bookie(down.bookie_id)  # the silent bookie had replicas, none was marked


@pytest.mark.parametrize("record", [None, b"not a CheckAllLedgersFormat"], ids=["none", "unreadable"])
def test_an_auditor_taking_office_with_no_check_recorded_checks_at_once_and_records_when(
    zk, fleet, auditor_sessions, record
):
    """A week's interval, as `bookfleet auditor` has by default: the check must not wait for it on a first election
    (BookKeeper's auditor does not either; a ledger a migration left short was found by it alone). A record that does
    not parse counts as none, as in BookKeeper."""
    ur = UnderReplication(zk)
    ur.set_recovery_delay(3600)  # only the replica check may mark in this test
    if record is not None:
        zk.create(zkpaths.UR_CHECK_ALL_LEDGERS_CTIME, record, makepath=True)
    expected = _emptied(zk, fleet[2])
    started = _now_ms()
    auditor_sessions("a1")
    wait_for(lambda: _markers(zk) == expected, what="the check on taking office")
    wait_for(lambda: _checked_since(ur, started), what="the check's time recorded")


def test_a_restarted_auditor_waits_out_a_recent_check_and_checks_at_once_when_one_is_overdue(
    zk, fleet, auditor_sessions
):
    """A day's interval. The record is moved back to stand for the time that passes between the two starts."""
    ur = UnderReplication(zk)
    ur.set_recovery_delay(3600)
    expected = _emptied(zk, fleet[2])
    recent = _now_ms() - 3600_000
    ur.set_check_all_ledgers_ctime(recent)
    first, _ = auditor_sessions("a1", check_interval=DAY)
    assert first.wait_active(10)
    stays(lambda: _markers(zk) == {} and ur.check_all_ledgers_ctime() == recent, 1.0)
    first.stop()

    overdue = _now_ms() - (DAY + 60) * 1000  # restarted once the check came due
    ur.set_check_all_ledgers_ctime(overdue)
    auditor_sessions("a1", check_interval=DAY)
    wait_for(lambda: _markers(zk) == expected, what="the overdue check on taking office again")
    wait_for(lambda: _checked_since(ur, overdue + 1), what="the check's time recorded")


def test_replica_check_verifies_a_mac_copy_with_the_ledgers_own_password(zk, fleet):
    """A copy whose ids are right but whose HMAC is not the ledger's (forged, or corrupt in a way that keeps the
    header) is found: the check takes the ledger's password from its metadata, as BookKeeper's auditor does."""
    password = b"the ledger's own"

    async def write_and_forge() -> tuple[int, str]:
        async with BookKeeper(zk) as bk:
            writer = await bk.create_ledger(3, 2, 2, digest_type="mac", password=password)
            for e in range(4):
                await writer.add(b"entry %d" % e)
            await writer.close()
        holder = writer.metadata.segments[0].bookies[0]  # entry 0's write set starts there
        address = {bookie.bookie_id: bookie.address for bookie in fleet}[holder]
        forged = wire.encode_entry(wire.Digester("mac", b"not the password"), writer.ledger_id, 0, -1, 7, b"entry 0")
        async with await BookieClient.connect(address) as client:
            await client.add_entry(wire.master_key(password), forged, recovery=True)
        return writer.ledger_id, holder

    ledger_id, holder = asyncio.run(write_and_forge())
    assert check_ledgers(zk, [ledger_id]) == [ledger_id]
    assert _markers(zk) == {ledger_id: {holder}}


def test_replica_check_of_a_frozen_bookie_times_out_retries_and_marks_nothing(zk, fleet):
    frozen = fleet[1]
    os.kill(frozen.process.pid, signal.SIGSTOP)
    try:
        done = threading.Event()
        marked = []
        checker = threading.Thread(target=lambda: (marked.extend(check_ledgers(zk)), done.set()), daemon=True)
        checker.start()
        wait_for(done.is_set, 120, "the replica check to give up on the frozen bookie")
    finally:
        os.kill(frozen.process.pid, signal.SIGCONT)
    assert marked == [] and _markers(zk) == {}


@contextlib.contextmanager
def _check_held_by(frozen, auditor_sessions):
    """An active auditor whose full check (none is recorded: it checks at once) is under way and held by `frozen`
    (SIGSTOP) until the `with` ends."""
    with paused(frozen):
        auditor, _ = auditor_sessions("a1")
        assert auditor.wait_active(10)
        wait_for(lambda: _connected_to(frozen.port), what="the check asking the frozen bookie")
        yield auditor


LOSS_SLACK = 30.0
"""Beyond the loss delay, for noticing the loss and writing its markers on a loaded machine."""


def test_a_bookie_lost_while_a_frozen_bookie_holds_the_full_check_is_marked_before_the_check_ends(
    zk, freezable_fleet, auditor_sessions
):
    """The full check reads every ledger's replicas: minutes on a large fleet, longer while silent bookies make it
    wait. A bookie lost meanwhile is marked once the loss delay is over, while the check still reads (it ran on the
    auditor's one loop and held the marking up until it ended); the check's own findings, marked once it ends, merge
    into the loss's markers and remove none."""
    ur = UnderReplication(zk)
    ur.set_recovery_delay(1)
    frozen, lost, emptied = freezable_fleet[:3]
    found_by_check = _emptied(zk, emptied)
    marked_for_loss = {ledger_id: {lost.bookie_id} for ledger_id in MetadataStore(zk).ledgers_on_bookie(lost.bookie_id)}
    started = _now_ms()
    with _check_held_by(frozen, auditor_sessions):
        lost.stop()
        wait_for(lambda: _markers(zk) == marked_for_loss, timeout=1 + LOSS_SLACK, what="the lost bookie marked")
        assert not _checked_since(ur, started)  # before the check ended
    wait_for(lambda: _checked_since(ur, started), what="the check ending once the bookie thaws")
    expected = {ledger_id: set(missing) for ledger_id, missing in marked_for_loss.items()}
    for ledger_id, missing in found_by_check.items():
        expected[ledger_id] = expected.get(ledger_id, set()) | missing
    assert _markers(zk) == expected
    assert all(ur.marker(ledger_id).lost_bookies == {lost.bookie_id} for ledger_id in marked_for_loss)


def test_an_auditor_leaving_office_mid_check_lets_its_check_mark_and_record_nothing(
    zk, freezable_fleet, auditor_sessions
):
    """One auditor acts at a time: a check its auditor left behind would mark on (and record a check no one
    finished) while a successor takes office."""
    ur = UnderReplication(zk)
    ur.set_recovery_delay(3600)  # only the replica check may mark in this test
    frozen = freezable_fleet[0]
    assert _emptied(zk, freezable_fleet[2])  # what a check that ran to its end would mark
    started = _now_ms()
    with _check_held_by(frozen, auditor_sessions) as auditor:
        auditor.stop()
    stays(lambda: _markers(zk) == {} and not _checked_since(ur, started), 1.0)


def test_the_disable_switch_cancels_a_running_check_and_enabling_runs_it_again(zk, freezable_fleet, auditor_sessions):
    """While disabled the auditor marks nothing, a check already running included."""
    ur = UnderReplication(zk)
    ur.set_recovery_delay(3600)  # only the replica check may mark in this test
    frozen = freezable_fleet[0]
    found_by_check = _emptied(zk, freezable_fleet[2])
    started = _now_ms()
    with _check_held_by(frozen, auditor_sessions):
        ur.disable()
        wait_for(lambda: not _connected_to(frozen.port), what="the check cancelled, its connections closed")
    stays(lambda: _markers(zk) == {} and not _checked_since(ur, started), 1.0)
    ur.enable()
    wait_for(lambda: _markers(zk) == found_by_check, what="the check run again once enabled")
    wait_for(lambda: _checked_since(ur, started), what="the check's time recorded")


def _on_taking_office_with_stale_markers(zk, *bookies):
    """`bookies`, up with every replica, marked lost anyway (as a bookie that returned while no auditor ran is); a
    check is recorded as just made, so that only the stale-marker clean-up reads replicas once an auditor takes office.
    Returns the markers."""
    ur = UnderReplication(zk)
    ur.set_recovery_delay(1)
    ur.set_check_all_ledgers_ctime(_now_ms())
    for bookie in bookies:
        mark_lost_bookie(zk, bookie.bookie_id)
    return _markers(zk)


@contextlib.contextmanager
def _cleanup_held_by(frozen, auditor_sessions):
    """An active auditor whose stale-marker clean-up is under way and held by `frozen` (SIGSTOP) until the `with`
    ends."""
    with paused(frozen):
        auditor, _ = auditor_sessions("a1")
        assert auditor.wait_active(10)
        wait_for(lambda: _connected_to(frozen.port), what="the clean-up asking the frozen bookie")
        yield auditor


def test_a_bookie_lost_while_a_frozen_returning_bookie_holds_the_stale_marker_clean_up_is_marked_before_it_ends(
    zk, freezable_fleet, auditor_sessions
):
    """The clean-up reads the replicas of bookies that came back (on taking office, on each return): it ran on the
    auditor's loop, so a frozen returning bookie held the marking of a bookie lost meanwhile until its reads ended.
    The loss's markers merge into the stale ones and the clean-up, once it ends, clears none of them; the lost
    bookie's return has its markers cleared in turn."""
    back, lost = freezable_fleet[:2]
    stale = _on_taking_office_with_stale_markers(zk, back)
    on_lost = MetadataStore(zk).ledgers_on_bookie(lost.bookie_id)
    merged = {**stale, **{ledger_id: stale.get(ledger_id, set()) | {lost.bookie_id} for ledger_id in on_lost}}
    with _cleanup_held_by(back, auditor_sessions):
        lost.stop()
        wait_for(lambda: _markers(zk) == merged, timeout=1 + LOSS_SLACK, what="the lost bookie marked")
        assert _connected_to(back.port)  # before the clean-up ended
    wait_for(lambda: _markers(zk) == {ledger_id: merged[ledger_id] for ledger_id in on_lost},
             what="the clean-up ending, the stale markers the loss left alone cleared")
    lost.start().wait_ready()  # same id, same cookie and data
    wait_for(lambda: _markers(zk) == {}, what="the returned bookie's markers cleared")


def test_a_bookie_returning_while_a_clean_up_runs_has_its_markers_cleared_by_the_next_one(
    zk, freezable_fleet, auditor_sessions
):
    """One clean-up runs at a time: a bookie that registers again meanwhile is looked at once it ends."""
    back, returning = freezable_fleet[:2]
    _on_taking_office_with_stale_markers(zk, back)
    on_returning = set(MetadataStore(zk).ledgers_on_bookie(returning.bookie_id))
    with _cleanup_held_by(back, auditor_sessions):
        returning.stop()
        wait_for(lambda: {ledger_id for ledger_id, missing in _markers(zk).items() if returning.bookie_id in missing}
                 == on_returning, timeout=1 + LOSS_SLACK, what="the returning bookie marked lost")
        returning.start().wait_ready()  # same id, same cookie and data
    wait_for(lambda: _markers(zk) == {}, what="both clean-ups' clears")


def test_the_stale_marker_clean_up_keeps_the_markers_of_a_bookie_lost_again_while_it_reads(
    zk, freezable_fleet, auditor_sessions, caplog
):
    """Its replicas answered, then the bookie went again and its loss was marked on markers that named it lost
    already: a loss that changes nothing leaves no version for the clean-up's compare-and-set to trip on, so the
    clean-up itself keeps every marker naming a bookie gone since it began."""
    on = {bookie: set(MetadataStore(zk).ledgers_on_bookie(bookie.bookie_id)) for bookie in freezable_fleet}
    back, again = next((b, a) for b in freezable_fleet for a in freezable_fleet if on[a] and on[b] - on[a])
    stale = _on_taking_office_with_stale_markers(zk, back, again)
    caplog.set_level(logging.INFO, logger=auditor_module.__name__)  # the auditor's lines from here on
    with _cleanup_held_by(back, auditor_sessions):
        again.stop()
        wait_for(lambda: f"bookie {again.bookie_id} is lost" in caplog.text, timeout=1 + LOSS_SLACK,
                 what="the loss marked again")
    wait_for(lambda: "stale under-replication marker(s)" in caplog.text, what="the clean-up clearing the others")
    assert _markers(zk) == {ledger_id: stale[ledger_id] for ledger_id in on[again]}


def test_a_check_failing_as_it_is_cancelled_has_its_error_logged_not_left_to_asyncio(
    zk, freezable_fleet, auditor_sessions, caplog, monkeypatch
):
    """A check cancelled (here by the disable switch) may fail on its way out, closing its connections: the auditor
    takes its error and logs it with its traceback. Left unread, asyncio logged "Task exception was never retrieved"
    once the task was collected."""
    UnderReplication(zk).set_recovery_delay(3600)  # only the replica check may act in this test
    close = BookiePool.close

    async def close_failing(pool):
        await close(pool)
        raise OSError("a connection that would not close")

    monkeypatch.setattr(BookiePool, "close", close_failing)
    with _check_held_by(freezable_fleet[0], auditor_sessions):
        UnderReplication(zk).disable()
        wait_for(lambda: "failed as it was cancelled" in caplog.text, what="the check cancelled")
    gc.collect()
    assert "a connection that would not close" in caplog.text and "never retrieved" not in caplog.text


def test_a_writers_missed_entries_marker_is_never_cleared_as_stale(zk, fleet, auditor_sessions):
    ur = UnderReplication(zk)
    skipped = fleet[0]
    ledger_ids = MetadataStore(zk).ledgers_on_bookie(skipped.bookie_id)
    ur.mark(ledger_ids[0], [skipped.bookie_id], missed_entries=True)  # the writer went on without it
    for ledger_id in ledger_ids[1:]:
        ur.mark(ledger_id, [skipped.bookie_id])  # lost, then back with its replicas: stale
    assert ur.marker(ledger_ids[0]).missed_entries == {skipped.bookie_id}

    assert clear_stale_markers(zk) == ledger_ids[1:]
    assert _markers(zk) == {ledger_ids[0]: {skipped.bookie_id}}


def as_in_a_terminal() -> None:
    """Ctrl-C as a terminal's foreground process gets it: SIGINT neither ignored nor blocked. A child inherits both
    from the test worker, which may hold either (a worker started by a non-interactive shell's `&` ignores SIGINT;
    libraries block signals around their own forks), and a CLI that inherited them keeps them, as POSIX has it."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


SYS_TGKILL = 234
"""x86_64's tgkill(2): a signal to one thread of another process, as the kernel may pick any thread for Ctrl-C."""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="tgkill's syscall number is x86_64's")
def test_cli_auditor_exits_on_a_ctrl_c_the_kernel_hands_to_one_of_kazoos_threads(zk_connect):
    """A process-directed signal goes to any thread that does not block it; one handed to a kazoo thread must still
    stop the CLI (its main thread waited on a lock for ever: CI saw the Ctrl-C test hang twice)."""
    import ctypes

    env = {**os.environ, "BOOKFLEET_ZK": zk_connect}
    cli = subprocess.Popen([sys.executable, "-m", "bookfleet", "auditor", "--id", "cli"], env=env,
                           preexec_fn=as_in_a_terminal)
    try:
        threads = wait_for(lambda: len(tasks := sorted(os.listdir(f"/proc/{cli.pid}/task"))) >= 3 and tasks,
                           timeout=60, what="the CLI auditor's threads")
        time.sleep(1.0)  # it is waiting for Ctrl-C now
        other = next(int(tid) for tid in threads if int(tid) != cli.pid)
        assert ctypes.CDLL(None, use_errno=True).syscall(SYS_TGKILL, cli.pid, other, signal.SIGINT) == 0
        assert cli.wait(10) == 130
    finally:
        cli.kill()
        cli.wait()


def test_cli_auditor_marks_and_hands_over_on_ctrl_c(zk, zk_connect, fleet, auditor_sessions):
    UnderReplication(zk).set_recovery_delay(1)
    env = {**os.environ, "BOOKFLEET_ZK": zk_connect, "PYTHONFAULTHANDLER": "1"}  # SIGABRT prints every thread
    cli = subprocess.Popen([sys.executable, "-m", "bookfleet", "auditor", "--id", "cli"], env=env,
                           preexec_fn=as_in_a_terminal)
    try:
        wait_for(lambda: _active_auditor(zk) == "cli", timeout=60, what="the CLI auditor leading")  # a cold start
        standby, _ = auditor_sessions("standby")
        fleet[0].stop()
        expected = set(MetadataStore(zk).ledgers_on_bookie(fleet[0].bookie_id))
        wait_for(lambda: set(_markers(zk)) == expected, what="marking by the CLI auditor")
        assert not standby.is_active
        cli.send_signal(signal.SIGINT)
        try:
            assert cli.wait(20) == 130
        except subprocess.TimeoutExpired:
            cli.send_signal(signal.SIGABRT)  # its threads' stacks, in the captured stderr, say where it hung
            cli.wait(10)
            pytest.fail("the CLI auditor did not exit within 20 s of Ctrl-C (its threads' stacks are above)")
        assert standby.wait_active(10)
    finally:
        cli.kill()
        cli.wait()


def _active_auditor(zk):
    candidates = sorted(zk.get_children(zkpaths.AUDITOR_ELECTION)) if zk.exists(zkpaths.AUDITOR_ELECTION) else []
    return auditor_of_vote(zk.get(f"{zkpaths.AUDITOR_ELECTION}/{candidates[0]}")[0]) if candidates else None


def test_the_auditors_passes_read_metadata_in_pipelines_not_a_round_trip_per_ledger(zk, monkeypatch):
    """The check pass over every ledger and the pass over every marker on taking office read the metadata they
    look at with asynchronous gets in pipelines: at 100,000 ledgers a round trip each took minutes."""
    store, under_replication = MetadataStore(zk), UnderReplication(zk)
    ledger_ids = [store.create(new_metadata(["a:1", "b:1", "c:1"], 3, 2)) for _ in range(30)]
    under_replication.mark_all(ledger_ids, ["a:1"])  # a:1 is not registered: no marker is stale
    under_replication.mark(10**6, ["a:1"])  # the marker of a ledger deleted since: cleared
    sync_gets = []
    get = zk.get
    monkeypatch.setattr(zk, "get", lambda path, *args, **kwargs: sync_gets.append(path) or get(path, *args, **kwargs))

    assert set(read_checks(store, [*ledger_ids, 10**6])) == set(ledger_ids)
    assert clear_stale_markers(zk) == [10**6]
    assert [path for path in sync_gets if path.startswith(zkpaths.ROOT)] == []
