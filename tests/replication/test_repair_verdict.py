"""The DATA_LOSS rule (`entry_verdict`): copy, retry or give up one entry from what its replicas answered, and how
often a replica is asked before its silence counts."""

from __future__ import annotations

import asyncio

from bookfleet import wire
from bookfleet.meta.metadata import new_metadata
from bookfleet.meta.underreplication import Marker
from bookfleet.replication import repair
from bookfleet.replication.planner import FragmentPlan, plan_ledger
from bookfleet.replication.repair import Reply, Verdict, entry_verdict

REPLICAS = ["a", "b", "c"]


def test_any_good_copy_is_copied_whatever_the_others_said():
    replies = {"a": Reply.UNREACHABLE, "b": Reply.CORRUPT, "c": Reply.HAS}
    assert entry_verdict(REPLICAS, replies, {"a"}) is Verdict.COPY


def test_a_survivor_that_lacks_the_entry_and_a_lost_bookie_make_data_loss():
    assert entry_verdict(["a", "b"], {"b": Reply.LACKS}, {"a"}) is Verdict.LOST


def test_a_corrupt_replica_is_no_copy():
    assert entry_verdict(["a", "b"], {"a": Reply.UNREACHABLE, "b": Reply.CORRUPT}, {"a"}) is Verdict.LOST
    assert entry_verdict(["a", "b"], {"a": Reply.LACKS, "b": Reply.CORRUPT}, set()) is Verdict.LOST


def test_an_unreachable_survivor_is_retried_never_data_loss():
    assert entry_verdict(["a", "b"], {"a": Reply.UNREACHABLE, "b": Reply.UNREACHABLE}, {"a"}) is Verdict.RETRY
    # a survivor that was never asked counts as unreachable
    assert entry_verdict(REPLICAS, {"b": Reply.LACKS}, {"a"}) is Verdict.RETRY
    assert entry_verdict(REPLICAS, {"b": Reply.LACKS, "c": Reply.CORRUPT}, set()) is Verdict.RETRY


def test_every_replica_declared_lost_and_silent_is_data_loss():
    assert entry_verdict(["a", "b"], {}, {"a", "b"}) is Verdict.LOST


def test_a_declared_lost_bookie_that_answers_with_the_entry_is_copied():
    assert entry_verdict(["a", "b"], {"a": Reply.HAS, "b": Reply.LACKS}, {"a"}) is Verdict.COPY


def spare(ensemble, position, write_quorum, avoid) -> str:
    return min({"d", "e"} - set(avoid))


def test_only_a_bookie_the_lost_bookie_rule_declared_lost_counts_as_gone():
    """A marker names "a" as lost and "b" for entries a writer went on without (b is usually alive): b's timeout
    is retried, and only b's definite answer that it lacks the entry makes it lost."""
    metadata = new_metadata(["a", "b", "c"], write_quorum=2, ack_quorum=2).with_closed(9, 1000)
    marker = Marker(1, frozenset({"a", "b"}), 0, 0, missed_entries=frozenset({"b"}), lost_bookies=frozenset({"a"}))
    (plan,) = plan_ledger(1, metadata, marker.missing_bookies, spare, marker.lost_bookies)
    held_by_a_and_b = next(e for e in plan.needed_entries() if set(plan.replicas(e)) == {"a", "b"})

    assert plan.declared_lost == {"a"}
    replicas = plan.replicas(held_by_a_and_b)
    assert entry_verdict(replicas, {"b": Reply.UNREACHABLE}, plan.declared_lost) is Verdict.RETRY
    assert entry_verdict(replicas, {"a": Reply.UNREACHABLE, "b": Reply.LACKS}, plan.declared_lost) is Verdict.LOST


class SlowReplicas(repair.FragmentCopier):
    """A copier whose replicas time out `timeouts[bookie]` times before they answer with every entry."""

    def __init__(self, plan: FragmentPlan, timeouts: dict[str, float]):
        super().__init__(plan, repair.Connections({}), repair.RepairSettings({}), repair.TokenBucket(None))
        self.timeouts = timeouts
        self.asked: list[str] = []

    async def read_range(self, bookie: str, first: int, last: int) -> list[bytes]:
        self.asked.append(bookie)
        if self.timeouts.get(bookie, 0) > 0:
            self.timeouts[bookie] -= 1
            raise TimeoutError
        digester = wire.Digester(wire.DigestType.CRC32C, b"")
        return [wire.encode_entry(digester, 1, e, e - 1, 0, b"entry") for e in range(first, last + 1)]


PLAN = FragmentPlan(1, 0, 0, 3, ("a", "b"), 2, lost=(0, 1), replacements=("c", "d"), declared_lost=frozenset({"a"}))
"""Both replicas missing: "a" declared lost, "b" named for entries a writer went on without (alive, maybe slow)."""


def test_a_slow_bookie_that_may_be_alive_is_asked_again_a_declared_lost_one_once(monkeypatch):
    monkeypatch.setattr(repair, "RETRY_DELAY", 0.0)
    slow = SlowReplicas(PLAN, {"a": float("inf"), "b": repair.READ_ATTEMPTS - 1})
    found, _, _ = asyncio.run(slow.read([0, 1, 2, 3], 0))
    assert sorted(found) == [0, 1, 2, 3] and slow.asked == ["b"] * repair.READ_ATTEMPTS

    silent = SlowReplicas(PLAN, {"a": float("inf"), "b": float("inf")})
    found, replies, _ = asyncio.run(silent.read([0, 1, 2, 3], 0))
    assert found == {} and silent.asked == ["b"] * repair.READ_ATTEMPTS + ["a"]
    assert entry_verdict(PLAN.replicas(0), replies[0], PLAN.declared_lost) is Verdict.RETRY
