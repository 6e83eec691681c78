"""The planner: which fragments, entries and replacement bookies a repair copies (pure, no Spark, no bookie)."""

from __future__ import annotations

import random

import pytest

from bookfleet.client.placement import NotEnoughBookies, choose_replacement, quorum_zone_violations
from bookfleet.client.writeset import write_set
from bookfleet.meta.metadata import new_metadata
from bookfleet.meta.registry import BookieInfo
from bookfleet.replication.planner import LedgerNotClosed, plan_ledger, tail_is_damaged

ZONES = {"b1": "a", "b2": "b", "b3": "c", "b4": "a", "b5": "b", "b6": "c"}
CANDIDATES = [
    BookieInfo(bookie_id=b, address=f"127.0.0.1:{4000 + n}", zone=z) for n, (b, z) in enumerate(ZONES.items())
]


def placement(candidates=CANDIDATES, seed=7):
    rng = random.Random(seed)

    def choose(ensemble, position, write_quorum, avoid):
        return choose_replacement(candidates, ensemble, position, write_quorum, exclude=avoid, rng=rng)

    return choose


def two_segment_ledger(write_quorum=2):
    """E=3 on b1,b2,b3 for entries 0..9, then b1,b4,b3 for 10..19 (closed)."""
    metadata = new_metadata(["b1", "b2", "b3"], write_quorum=write_quorum, ack_quorum=2)
    return metadata.with_ensemble_change(10, 1, "b4").with_closed(19, 20 * 100)


def test_only_fragments_that_lost_a_bookie_are_planned():
    plans = plan_ledger(7, two_segment_ledger(), {"b2"}, placement())
    assert [(p.segment_index, p.first_entry_id, p.last_entry_id, p.lost) for p in plans] == [(0, 0, 9, (1,))]
    (plan,) = plans
    assert plan.ledger_id == 7
    assert plan.replacements[0] not in {"b1", "b2", "b3"}


def test_a_bookie_in_every_segment_is_replaced_in_each():
    plans = plan_ledger(1, two_segment_ledger(), {"b3"}, placement())
    assert [(p.segment_index, p.lost) for p in plans] == [(0, (2,)), (1, (2,))]
    for plan in plans:
        assert plan.replacements[0] not in plan.bookies


def test_entries_for_a_position_follow_the_write_sets():
    (plan,) = plan_ledger(1, two_segment_ledger(write_quorum=2), {"b2"}, placement())
    expected = [e for e in range(0, 10) if 1 in write_set(e, 3, 2)]
    assert plan.entries_for(1) == expected == plan.needed_entries()
    assert expected == [0, 1, 3, 4, 6, 7, 9]
    # entry 0 lives on positions 0 and 1: b1 survives, b2 is lost, the copy goes to the replacement
    assert plan.replicas(0) == ["b1", "b2"] and plan.survivors == ("b1", "b3")
    assert plan.targets(0) == [plan.replacements[0]]
    assert plan.targets(2) == []


def test_two_lost_positions_get_distinct_replacements_and_keep_zones():
    metadata = new_metadata(["b1", "b2", "b3"], write_quorum=3, ack_quorum=2).with_closed(4, 500)
    (plan,) = plan_ledger(3, metadata, {"b1", "b2"}, placement())
    assert plan.lost == (0, 1)
    assert len(set(plan.replacements)) == 2
    assert not set(plan.replacements) & {"b1", "b2", "b3"}
    assert plan.needed_entries() == [0, 1, 2, 3, 4]
    assert plan.replicas(2) == ["b3", "b1", "b2"] and plan.survivors == ("b3",)
    new_ensemble = [*plan.replacements, "b3"]
    assert quorum_zone_violations([ZONES[b] for b in new_ensemble], 3) == 0


def test_healthy_ledgers_need_nothing_and_empty_ones_only_a_new_ensemble():
    assert plan_ledger(1, two_segment_ledger(), {"b6"}, placement()) == []
    empty = new_metadata(["b1", "b2", "b3"], write_quorum=2, ack_quorum=2).with_closed(-1, 0)
    (plan,) = plan_ledger(1, empty, {"b1"}, placement())
    assert plan.lost == (0,) and plan.needed_entries() == []


def test_an_open_ledger_whose_current_segment_lost_a_bookie_must_be_closed_first():
    metadata = new_metadata(["b1", "b2", "b3"], write_quorum=2, ack_quorum=2)
    assert tail_is_damaged(metadata, {"b1"})
    with pytest.raises(LedgerNotClosed, match="OPEN and its current segment lost a bookie"):
        plan_ledger(1, metadata, {"b1"}, placement())


def test_an_open_ledger_that_lost_a_bookie_only_in_closed_segments_is_planned_open():
    """BookKeeper's rule: the writer already replaced b2, so its segment is repaired and the writer goes on."""
    metadata = new_metadata(["b1", "b2", "b3"], write_quorum=2, ack_quorum=2).with_ensemble_change(10, 1, "b4")
    assert not tail_is_damaged(metadata, {"b2"})
    (plan,) = plan_ledger(1, metadata, {"b2"}, placement())
    assert (plan.segment_index, plan.first_entry_id, plan.last_entry_id, plan.lost) == (0, 0, 9, (1,))
    assert plan_ledger(1, metadata, {"b6"}, placement()) == []


def test_no_bookie_left_to_take_the_position():
    metadata = new_metadata(["b1", "b2", "b3"], write_quorum=2, ack_quorum=2).with_closed(3, 400)
    with pytest.raises(NotEnoughBookies, match="need 1 writable bookie outside the ensemble"):
        plan_ledger(1, metadata, {"b1"}, placement(CANDIDATES[:3]))
