"""What a repair run reports and how it reads ledgers another repair held (pure: no ZooKeeper, no Spark)."""

from __future__ import annotations

import argparse

from bookfleet.meta.underreplication import Marker
from bookfleet.replication.spark_repair import RepairSummary, add_arguments, check_arguments, cleared_elsewhere


def test_a_ledger_whose_marker_went_while_another_repair_held_it_was_done_there():
    still = Marker(7, frozenset({"lost"}), 0, 3)
    done, marked = cleared_elsewhere({9: None, 7: still, 4: None})
    assert done == [4, 9]
    assert marked == {7: still}  # repaired by this run, from the marker as it is now


def test_the_summary_line_tells_done_elsewhere_from_still_locked_elsewhere():
    waited_for_all = RepairSummary(ledgers=5, done_elsewhere=[1, 2], seconds=1.0)
    assert waited_for_all.lines()[0].endswith("; 2 done by another repair, 0 still marked, 0 failure(s)")

    stuck = RepairSummary(ledgers=5, pending=[3, 8, 9], locked_elsewhere=[8, 9], seconds=1.0)
    assert stuck.lines()[0].endswith("; 3 still marked (2 locked by another repair), 0 failure(s)")

    alone = RepairSummary(ledgers=5, seconds=1.0)
    assert alone.lines()[0].endswith("; 0 still marked, 0 failure(s)")


def test_a_spark_submit_childs_summary_keeps_what_others_did():
    summary = RepairSummary(ledgers=1, pending=[8], locked_elsewhere=[8], done_elsewhere=[2, 5])
    assert RepairSummary.from_dict(summary.to_dict()) == summary


def test_the_lock_wait_is_a_flag_with_a_bound():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--zk", "zk:2181"]).lock_wait_s == 600
    assert check_arguments(parser.parse_args(["--zk", "zk:2181", "--lock-wait-s", "0"])) is None
    for bad in ("-1", "inf", "nan"):
        problem = check_arguments(parser.parse_args(["--zk", "zk:2181", "--lock-wait-s", bad]))
        assert problem == f"--lock-wait-s must be a number of seconds >= 0, got {float(bad)}"
