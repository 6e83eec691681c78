"""An Apache BookKeeper fleet (three Java bookies and their ZooKeeper) serving a Pulsar broker moves to bookfleet
bookies one Java bookie at a time while Pulsar's Python client keeps producing, and then back onto Java bookies on
fresh disks with BookKeeper's own AutoRecovery (its auditor and replication workers) moving the ledgers off each
bookfleet bookie in turn: no send fails, every acknowledged message is consumed back in order per partition and read
at its MessageId, and at the end every ledger's ensembles name the destination's bookies only and `bookfleet status`
calls the fleet healthy (tests/pulsar/migration.py). One fleet and broker for the module: the way back starts where
the migration ended."""

from __future__ import annotations

import json

import pytest

from tests.pulsar import migration
from tests.pulsar.broker import requires_pulsar

pytestmark = [
    requires_pulsar,
    pytest.mark.xdist_group("pulsar"),  # one broker JVM at a time beside the other test
    pytest.mark.timeout(900),  # five JVMs and Spark starting on two cores: minutes on a loaded machine
]


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    """The fleet after the migration to bookfleet, and the migration's figures."""
    with migration.migration_setup(tmp_path_factory.mktemp("migration")) as setup:
        figures = migration.run(setup, "migrating", migration.to_bookfleet)
        print(json.dumps(figures))
        yield setup, figures


def assert_moved(figures: dict) -> None:
    assert figures["acked"] > 0 and figures["send_failures"] == 0, figures
    assert figures["lost"] == 0 and figures["reordered"] == 0, figures
    assert figures["not_in_bookfleet_entry"] == 0 and figures["not_where_acked"] == 0, figures
    assert figures["ledgers_moved"] > 0, figures
    assert figures["bookies_holding_ledgers"] and set(figures["bookies_holding_ledgers"]) <= set(
        figures["destination_bookies"]), figures
    assert figures["healthy"], figures


def test_a_bookkeeper_fleet_under_a_running_producer_moves_to_bookfleet_bookie_by_bookie(migrated):
    setup, figures = migrated
    assert_moved(figures)
    assert "Traceback" not in "".join(bookie.log_path.read_text() for bookie in setup.ours.bookies)


def test_the_way_back_bookkeepers_autorecovery_moves_every_ledger_off_bookfleet_bookies_onto_java_bookies(migrated):
    setup, _ = migrated
    figures = migration.run(setup, "returning", migration.back_to_bookkeeper)
    print(json.dumps(figures))
    assert_moved(figures)  # not_where_acked covers the first topic too: its ledgers moved twice
    assert not any(bookie.running for bookie in setup.ours.bookies)
