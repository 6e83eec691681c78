"""The one replica checker's pure parts: which entries a check reads, and what a copy says."""

from __future__ import annotations

import pytest

from bookfleet import wire
from bookfleet.client.writeset import stores_entry
from bookfleet.meta.metadata import Fragment
from bookfleet.replication.repair import Reply
from bookfleet.replication.replicacheck import (
    ALL,
    ENDS,
    Coverage,
    ReplicaRange,
    Scope,
    entries_to_check,
    verdict,
)


def replica(position: int, first: int = 0, last: int = 99, ensemble: int = 3, write_quorum: int = 2):
    return ReplicaRange(7, 0, first, last, position, ensemble, write_quorum)


def test_all_is_every_entry_the_position_stores_and_ends_are_its_first_and_last():
    for position in range(3):
        stored = [e for e in range(100) if stores_entry(position, e, 3, 2)]
        assert entries_to_check(replica(position), ALL) == stored
        assert entries_to_check(replica(position), ENDS) == [stored[0], stored[-1]]


def test_ends_of_short_empty_and_skipped_ranges():
    assert entries_to_check(replica(0, first=5, last=4), ENDS) == []  # an empty fragment
    assert entries_to_check(replica(2, first=0, last=0, ensemble=3, write_quorum=1), ENDS) == []  # stores nothing
    assert entries_to_check(replica(0, first=3, last=3), ENDS) == [3]  # one entry: one read
    stored = entries_to_check(replica(0), ALL)
    skip = frozenset({stored[0], stored[-1]})
    assert entries_to_check(replica(0), ENDS, skip) == [stored[1], stored[-2]]
    assert entries_to_check(replica(0), ALL, skip) == stored[1:-1]


def test_a_sample_is_seeded_a_subset_and_at_least_one_entry():
    stored = entries_to_check(replica(1), ALL)
    sample = entries_to_check(replica(1), Coverage.sampled(0.25))
    assert set(sample) <= set(stored) and len(sample) == round(len(stored) * 0.25) and sample == sorted(sample)
    assert entries_to_check(replica(1), Coverage.sampled(0.25)) == sample  # a rerun checks the same entries
    assert len(entries_to_check(replica(1), Coverage.sampled(0.0001))) == 1
    assert Coverage.sampled(1.0) == ALL and Coverage.sampled(0.5).scope is Scope.SAMPLE
    for fraction in (0, -0.5, 1.5):
        with pytest.raises(ValueError, match="in \\(0, 1\\]"):
            Coverage.sampled(fraction)


def test_a_replica_range_comes_from_a_closed_fragment_only():
    fragment = Fragment(2, 10, 19, ("a", "b", "c"))
    assert ReplicaRange.of_fragment(7, fragment, 1, 2) == ReplicaRange(7, 2, 10, 19, 1, 3, 2)
    with pytest.raises(ValueError, match="still open"):
        ReplicaRange.of_fragment(7, Fragment(3, 20, None, ("a", "b", "c")), 0, 2)


def test_verdict_of_a_copy():
    crc = wire.Digester("crc32c")
    good = wire.encode_entry(crc, 7, 3, 2, 30, b"payload")
    assert verdict(good, 7, 3, crc) is Reply.HAS
    assert verdict(None, 7, 3, crc) is Reply.LACKS
    assert verdict(good, 7, 4, crc) is Reply.CORRUPT  # another entry's copy
    assert verdict(good[:-1] + b"X", 7, 3, crc) is Reply.CORRUPT  # digest fails
    assert verdict(good[:5], 7, 3, crc) is Reply.CORRUPT  # shorter than a header
    mac = wire.Digester("mac", b"secret")
    signed = wire.encode_entry(mac, 7, 3, 2, 30, b"payload")
    assert verdict(signed, 7, 3, mac) is Reply.HAS and verdict(signed, 8, 3, mac) is Reply.CORRUPT
    assert verdict(signed, 7, 3, wire.Digester("mac", b"wrong")) is Reply.CORRUPT
