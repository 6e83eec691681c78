"""The time of the last full replica check, shared with Apache BookKeeper 4.17.2's auditor (the jars `make
bookkeeper-reference` fetches): BookKeeper's own AutoRecovery, taking office after bookfleet's auditor, schedules its
checkAllLedgers from the time bookfleet recorded; bookfleet's auditor takes the time BookKeeper's shell writes. So a
migration either way keeps one schedule, and the side that takes over checks at once when a check is due."""

from __future__ import annotations

import re
import time

import pytest

from bookfleet import polling
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.replication.auditor import Auditor
from bookfleet.zkserver import free_port
from tests.interop.javaside import JavaProcess, java_command, requires_java, shell, write_conf

pytestmark = requires_java

AUTORECOVERY_MAIN = "org.apache.bookkeeper.replication.AutoRecoveryMain"
DAY = 24 * 3600
SCHEDULE = re.compile(
    r"checkAllLedgers scheduling info\.\s+checkAllLedgersLastExecutedCTime: (-?\d+) "
    r"durationSinceLastExecutionInSecs: (-?\d+) initialDelay: (\d+) interval: (\d+)"
)
"""What BookKeeper's Auditor logs when it schedules checkAllLedgers on taking office."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def test_bookkeepers_auditor_counts_its_interval_from_the_check_bookfleets_auditor_recorded(
    zk, zk_connect, bookie_fleet, tmp_path
):
    bookie_fleet.start(1)  # the cluster's layout, as a migration finds it
    ur = UnderReplication(zk)
    with Auditor(zk, "bookfleet-auditor", check_interval=DAY):
        polling.wait_for(lambda: ur.check_all_ledgers_ctime() is not None, 30, "bookfleet's check on taking office")
    recorded = ur.check_all_ledgers_ctime()

    conf = write_conf(tmp_path / "autorecovery.conf", zk_connect, auditorPeriodicCheckInterval=DAY,
                      bookiePort=free_port(), advertisedAddress="127.0.0.1", httpServerEnabled="false")
    bookkeepers = JavaProcess(tmp_path / "autorecovery.log")
    bookkeepers.launch(java_command(AUTORECOVERY_MAIN, "-c", conf),
                       lambda: SCHEDULE.search(bookkeepers.log_path.read_text(errors="replace")), 180,
                       "BookKeeper's auditor did not schedule its check")
    bookkeepers.stop()
    last, since, delay, interval = map(int, SCHEDULE.search(bookkeepers.log_path.read_text()).groups())
    assert (last, interval) == (recorded, DAY), bookkeepers.log_tail()
    assert 0 <= since < DAY and delay == DAY - since, bookkeepers.log_tail()  # the rest of the interval, not at once
    assert ur.check_all_ledgers_ctime() == recorded  # and it did not check


def test_bookfleets_auditor_reads_the_time_bookkeepers_shell_writes_and_checks_when_it_is_overdue(
    zk, zk_connect, bookie_fleet, tmp_path
):
    """`bookkeeper shell forceauditchecks -calc` sets the time 21 days back, so the next auditor checks at once."""
    bookie_fleet.start(1)
    started = _now_ms()
    shell(write_conf(tmp_path / "admin.conf", zk_connect), "forceauditchecks", "-calc")
    ur = UnderReplication(zk)
    forced = ur.check_all_ledgers_ctime()
    assert forced == pytest.approx(started - 21 * DAY * 1000, abs=300_000)
    with Auditor(zk, "bookfleet-auditor", check_interval=DAY):
        polling.wait_for(lambda: ur.check_all_ledgers_ctime() >= started, 30, "bookfleet's overdue check")
