"""Apache Pulsar 4.0's broker keeps a partitioned topic on a 4-bookie bookfleet fleet: produced with Pulsar's Python
client while a bookie of a current ledger's ensemble is killed -9 and then the broker is (its restart recovers the
ledgers it held open by fencing them), repaired by auto-recovery, unloaded and loaded again, consumed back whole and
in order per partition, each message found in the entry bookfleet stores at its MessageId."""

from __future__ import annotations

import pytest

from tests.pulsar import scenario
from tests.pulsar.broker import requires_pulsar
from tests.pulsar.fleet import fleet_with_broker

pytestmark = [
    requires_pulsar,
    pytest.mark.xdist_group("pulsar"),  # one fleet and one broker JVM for the module
    pytest.mark.timeout(900),  # the fleet's, the broker's and Spark's start: over 250 s at load 20
]

MESSAGES = 3000


@pytest.fixture(scope="module")
def fleet_and_broker(tmp_path_factory):
    with fleet_with_broker(tmp_path_factory.mktemp("pulsar")) as pair:
        yield pair


def test_a_partitioned_topic_survives_a_killed_bookie_and_broker_and_reads_back_from_bookfleet(fleet_and_broker):
    cluster, broker = fleet_and_broker
    figures = scenario.run(cluster, broker, "killed-bookie", MESSAGES)
    assert figures["acked"] == MESSAGES and figures["send_failures"] == 0, figures
    assert figures["lost"] == 0 and figures["reordered"] == 0, figures
    assert figures["not_where_acked"] == 0 and figures["not_in_bookfleet_entry"] == 0, figures
    assert all(bookie.running for bookie in cluster.fleet.bookies if bookie.bookie_id != figures["killed_bookie"])
    assert "Traceback" not in "".join(bookie.log_path.read_text() for bookie in cluster.fleet.bookies), figures
