"""An Apache BookKeeper fleet (three Java bookies and their ZooKeeper) serving a Pulsar broker moves to bookfleet
bookies one Java bookie at a time while Pulsar's Python client keeps producing: no send fails, every acknowledged
message is consumed back in order per partition from entries bookfleet's client reads, and at the end every ledger's
ensembles name bookfleet bookies only and `bookfleet status` calls the fleet healthy (tests/pulsar/migration.py)."""

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


def test_a_bookkeeper_fleet_under_a_running_producer_moves_to_bookfleet_bookie_by_bookie(tmp_path):
    with migration.migration_setup(tmp_path) as setup:
        figures = migration.run(setup, "migrating")
    print(json.dumps(figures))
    assert figures["acked"] > 0 and figures["send_failures"] == 0, figures
    assert figures["lost"] == 0 and figures["reordered"] == 0 and figures["not_in_bookfleet_entry"] == 0, figures
    assert figures["ledgers_moved"] > 0, figures
    assert figures["bookies_holding_ledgers"] and set(figures["bookies_holding_ledgers"]) <= set(
        figures["bookfleet_bookies"]), figures
    assert figures["healthy"], figures
    assert "Traceback" not in "".join(bookie.log_path.read_text() for bookie in setup.ours.bookies)
