"""Placement rules: write set striping, zone-aware ensembles and replacements, clear shortage errors."""

from __future__ import annotations

import random

import pytest

from bookfleet.client.placement import (
    NotEnoughBookies,
    PlacementPolicy,
    choose_ensemble,
    choose_replacement,
    quorum_zone_violations,
    write_sets_sharing_a_zone,
)
from bookfleet.client.writeset import stores_entry, write_set
from bookfleet.meta.registry import BookieInfo


def fleet(zones: str) -> list[BookieInfo]:
    """One bookie per character, the character naming its zone: "aab" -> b0 (a), b1 (a), b2 (b)."""
    return [BookieInfo(bookie_id=f"b{i}", address=f"127.0.0.1:{4000 + i}", zone=z) for i, z in enumerate(zones)]


def zones_of(ensemble, candidates):
    zone = {info.bookie_id: info.zone for info in candidates}
    return [zone[b] for b in ensemble]


def test_write_set_matches_the_seed_example():
    ensemble = ["bookie1", "bookie2", "bookie3", "bookie4"]
    stripes = [[ensemble[i] for i in write_set(e, 4, 3)] for e in range(3)]
    assert stripes == [
        ["bookie1", "bookie2", "bookie3"],
        ["bookie2", "bookie3", "bookie4"],
        ["bookie3", "bookie4", "bookie1"],
    ]
    assert all(stores_entry(p, e, 4, 3) == (p in write_set(e, 4, 3)) for p in range(4) for e in range(8))
    with pytest.raises(ValueError, match="write quorum 5 must be between 1 and the ensemble size 4"):
        write_set(0, 4, 5)


@pytest.mark.parametrize(
    ("zones", "size", "qw"), [("aaabbb", 4, 2), ("aaaabc", 3, 3), ("aabbcc", 6, 2), ("abcde", 5, 3)]
)
def test_zone_aware_ensembles_put_every_write_quorum_in_two_zones(zones, size, qw):
    candidates = fleet(zones)
    for seed in range(30):
        ensemble = choose_ensemble(candidates, size, qw, PlacementPolicy.ZONE_AWARE, rng=random.Random(seed))
        assert len(set(ensemble)) == size
        assert quorum_zone_violations(zones_of(ensemble, candidates), qw) == 0, ensemble


def test_zone_aware_does_its_best_when_one_zone_dominates():
    candidates = fleet("aaaab")
    ensemble = choose_ensemble(candidates, 4, 2, rng=random.Random(1))
    assert "b4" in ensemble  # the only other zone is used
    assert choose_ensemble(fleet("aaaa"), 3, 2)  # a single-zone fleet still gets an ensemble


def test_exclusions_and_shortage_name_the_available_bookies():
    candidates = fleet("abc")
    assert sorted(choose_ensemble(candidates, 2, 2, "random", exclude={"b1"})) == ["b0", "b2"]
    with pytest.raises(NotEnoughBookies, match="need 3 writable bookies, 2 available: b0, b2"):
        choose_ensemble(candidates, 3, 2, exclude={"b1"})
    with pytest.raises(NotEnoughBookies, match="need 1 writable bookie outside the ensemble, 0 available: none"):
        choose_replacement(candidates, ["b0", "b1", "b2"], 0, 2)
    with pytest.raises(ValueError, match="'nearest' is not a valid PlacementPolicy"):
        choose_ensemble(candidates, 2, 2, "nearest")


def test_replacement_keeps_quorums_in_two_zones():
    candidates = fleet("ababaa")  # b0 a, b1 b, b2 a, b3 b, b4 a, b5 a
    ensemble = ["b0", "b1", "b2", "b3"]  # a b a b; position 1 fails
    for seed in range(20):
        chosen = choose_replacement(candidates, ensemble, 1, 2, exclude={"b1"}, rng=random.Random(seed))
        assert chosen not in ensemble
        assert chosen in {"b4", "b5"}  # no zone-b bookie is left: best effort, still outside the ensemble
    for seed in range(20):
        chosen = choose_replacement(fleet("ababab"), ensemble, 1, 2, exclude={"b1"}, rng=random.Random(seed))
        assert chosen == "b5"  # b4 is zone a like both neighbours b0 and b2; b5 keeps both quorums in two zones


def test_random_replacement_avoids_the_ensemble():
    candidates = fleet("aaaaa")
    for seed in range(10):
        chosen = choose_replacement(candidates, ["b0", "b1", "b2"], 2, 2, "random", rng=random.Random(seed))
        assert chosen in {"b3", "b4"}


def test_ensembles_stay_in_the_zones_asked_for():
    candidates = fleet("aabbcc")
    for seed in range(20):
        ensemble = choose_ensemble(candidates, 3, 2, zones=["a", "c"], rng=random.Random(seed))
        assert set(zones_of(ensemble, candidates)) == {"a", "c"}
    with pytest.raises(NotEnoughBookies, match="need 3 writable bookies in zones b, 2 available: b2, b3"):
        choose_ensemble(candidates, 3, 2, zones=["b"])


def test_write_sets_sharing_a_zone_counts_those_a_zone_outage_takes_two_copies_of():
    assert write_sets_sharing_a_zone(list("abc"), 3) == 0  # E3/Qw3 on three zones
    assert write_sets_sharing_a_zone(list("bcb"), 3) == 3  # zone a lost, repaired onto b and c: every write set
    assert write_sets_sharing_a_zone(list("abcb"), 2) == 0
    assert write_sets_sharing_a_zone(list("aabc"), 2) == 1  # (a, a)
    assert write_sets_sharing_a_zone(["a", "", ""], 3) == 0  # unknown zones count as distinct
