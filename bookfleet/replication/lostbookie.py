"""The one lost-bookie rule, shared by the auditor and the operator: wait, mark its ledgers, or do nothing.

Pure: both sides gather the facts (when the bookie vanished, the time now, lostBookieRecoveryDelay and the disable
switch as ZooKeeper holds them, whether it is registered again and whether its data survived) and act on the answer.
A bookie that comes back with its data within the delay is not lost; one that comes back empty still is (its
replicas are gone). While auto-recovery is disabled nothing is marked, however long the bookie has been away. A bookie
that went away on purpose (drained or evicted through the eviction API, its node shut down gracefully) with its data
kept gets the planned-restart delay when that is longer: maintenance is not loss.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class LostBookieAction(enum.StrEnum):
    NOTHING = "nothing"
    WAIT = "wait"
    MARK = "mark"


@dataclass(frozen=True)
class LostBookieVerdict:
    action: LostBookieAction
    reason: str
    recheck_at: float | None = None
    """When a WAIT may turn into a MARK by itself (None: only a change of the facts, e.g. the switch, can)."""


def decide_lost_bookie(
    absent_since: float | None,
    now: float,
    delay: float,
    disabled: bool,
    registered: bool,
    data_present: bool,
    planned_delay: float | None = None,
) -> LostBookieVerdict:
    """What to do about a bookie; `absent_since` and `now` are seconds on one clock (None: it never went away).
    `planned_delay`: it went away on purpose, and may take that long to come back (None: an unplanned loss)."""
    if planned_delay is not None and data_present:
        delay = max(delay, planned_delay)
    if absent_since is None:
        return LostBookieVerdict(LostBookieAction.NOTHING, "the bookie is not absent")
    if registered and data_present:
        return LostBookieVerdict(LostBookieAction.NOTHING, "the bookie came back with its data")
    if disabled:
        return LostBookieVerdict(LostBookieAction.WAIT, "auto-recovery is disabled")
    if now < absent_since + delay:
        return LostBookieVerdict(
            LostBookieAction.WAIT, f"within lostBookieRecoveryDelay ({delay:g}s)", recheck_at=absent_since + delay
        )
    gone = "its data is gone" if not data_present else f"away for longer than {delay:g}s"
    return LostBookieVerdict(LostBookieAction.MARK, f"the bookie is lost: {gone}")
