"""The one lost-bookie rule, as a table: every input that changes the answer, in microseconds."""

from __future__ import annotations

import pytest

from bookfleet.replication.lostbookie import LostBookieAction, decide_lost_bookie

NOTHING, WAIT, MARK = LostBookieAction.NOTHING, LostBookieAction.WAIT, LostBookieAction.MARK


@pytest.mark.parametrize(
    ("absent_since", "now", "delay", "disabled", "registered", "data_present", "action", "recheck_at"),
    [
        (None, 100.0, 30.0, False, True, True, NOTHING, None),  # never gone
        (None, 100.0, 30.0, True, False, False, NOTHING, None),  # never gone, switch off: still nothing
        (90.0, 100.0, 30.0, False, False, True, WAIT, 120.0),  # away, within the delay
        (90.0, 120.0, 30.0, False, False, True, MARK, None),  # the delay is over
        (90.0, 95.0, 0.0, False, False, True, MARK, None),  # no delay: lost at once
        (90.0, 100.0, 30.0, False, True, True, NOTHING, None),  # came back with its data
        (90.0, 500.0, 30.0, False, True, True, NOTHING, None),  # came back late, data intact: still nothing
        (90.0, 100.0, 30.0, False, True, False, WAIT, 120.0),  # came back empty: lost once the delay is over
        (90.0, 130.0, 30.0, False, True, False, MARK, None),
        (90.0, 10_000.0, 30.0, True, False, False, WAIT, None),  # disabled: never marked, whatever the time
        (90.0, 100.0, 30.0, True, True, True, NOTHING, None),  # disabled, but back with its data
    ],
)
def test_lost_bookie_decision(absent_since, now, delay, disabled, registered, data_present, action, recheck_at):
    verdict = decide_lost_bookie(absent_since, now, delay, disabled, registered, data_present)
    assert (verdict.action, verdict.recheck_at) == (action, recheck_at)
    assert verdict.reason


def test_verdicts_say_why():
    assert "disabled" in decide_lost_bookie(1.0, 2.0, 0.0, True, False, True).reason
    assert "data is gone" in decide_lost_bookie(1.0, 2.0, 0.0, False, False, False).reason
    assert "30s" in decide_lost_bookie(1.0, 2.0, 30.0, False, False, True).reason


@pytest.mark.parametrize(
    ("now", "planned_delay", "data_present", "action", "recheck_at"),
    [
        (200.0, None, True, MARK, None),  # unplanned: the usual delay (30 s) is long over
        (200.0, 600.0, True, WAIT, 690.0),  # drained or evicted: it may take the planned-restart delay
        (700.0, 600.0, True, MARK, None),  # and is lost once that is over too
        (100.0, 10.0, True, WAIT, 120.0),  # a shorter planned delay never shortens the usual one
        (200.0, 600.0, False, MARK, None),  # its data is gone: waiting longer brings nothing back
    ],
)
def test_a_planned_restart_gets_the_longer_delay(now, planned_delay, data_present, action, recheck_at):
    verdict = decide_lost_bookie(90.0, now, 30.0, False, False, data_present, planned_delay=planned_delay)
    assert (verdict.action, verdict.recheck_at) == (action, recheck_at)
