"""The DATA_LOSS rule (`entry_verdict`): copy, retry or give up one entry from what its replicas answered."""

from __future__ import annotations

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
