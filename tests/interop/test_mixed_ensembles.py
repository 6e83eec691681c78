"""A stock Apache BookKeeper bookie beside three bookfleet bookies, in one ZooKeeper: BookKeeper's Java client writes
ledgers whose ensembles hold both kinds, kills one bookie of the ensemble with SIGKILL mid-write (a bookfleet one
over V3, the Java one over V2), replaces it by an ensemble change, closes, and reads every acknowledged entry back.
One fleet and one Java bookie for the module; the Java bookie is killed last."""

from __future__ import annotations

import re

import pytest

from bookfleet.fleet import StandaloneCluster
from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import MetadataStore
from tests.interop.javaside import JavaBookie, facts, java, requires_java, write_conf

pytestmark = [requires_java, pytest.mark.xdist_group("mixed-ensembles")]  # one fleet (and JVM set) for the module

ENTRIES = 300
KILL_AFTER = 100
"""The entry whose acknowledgement kills the victim: the adds after it (up to 20 in flight) meet a dead bookie."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with StandaloneCluster(tmp_path_factory.mktemp("mixed"), bookies=3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def java_bookie(fleet, tmp_path_factory):
    with zkclient.session(fleet.zk) as zk:
        bookie = JavaBookie(tmp_path_factory.mktemp("java-bookie"), fleet.zk).start(zk)
    yield bookie
    bookie.stop()


def ensembles(printed: str) -> dict[int, list[str]]:
    """`{0=[a, b, c], 105=[a, d, c]}` as the Java client prints a ledger's ensembles."""
    return {int(first): bookies.split(", ") for first, bookies in re.findall(r"(\d+)=\[([^\]]*)\]", printed)}


@pytest.mark.parametrize(("victim_kind", "protocol"), [("bookfleet", "v3"), ("java", "v2")])
def test_a_mixed_ensemble_loses_no_acknowledged_entry_when_a_bookie_of_either_kind_is_killed_mid_write(
    fleet, java_bookie, tmp_path, victim_kind, protocol
):
    bookfleet_victim = fleet.fleet.bookies[1]
    victim_id, victim_pid = (
        (bookfleet_victim.bookie_id, bookfleet_victim.process.pid) if victim_kind == "bookfleet"
        else (java_bookie.bookie_id, java_bookie.process.pid)
    )
    conf = write_conf(tmp_path / "bk.conf", fleet.zk, useV2WireProtocol=str(protocol == "v2").lower())
    need = dict.fromkeys([java_bookie.bookie_id, victim_id])  # both kinds, the victim among them
    written = java("LedgerInterop", conf, "write-killing", 3, 2, 2, ENTRIES, KILL_AFTER, victim_pid, ",".join(need))
    output = written.stdout
    assert written.returncode == 0, output[-3000:] + written.stderr[-3000:]

    assert sorted(int(entry) for entry in facts(output, "acked")) == list(range(ENTRIES)), output[-3000:]
    assert facts(output, "read") == [str(ENTRIES)], output[-3000:]  # a new client read each payload back
    (printed,) = facts(output, "ensembles")
    segments = ensembles(printed)
    first, *later = segments.values()
    assert set(need) <= set(first) and later and victim_id not in later[-1], printed
    (ledger,) = facts(output, "ledger")
    with zkclient.session(fleet.zk) as zk:
        metadata = MetadataStore(zk).read(int(ledger))[0]
    assert metadata.is_closed and metadata.last_entry_id == ENTRIES - 1
    assert [list(fragment.bookies) for fragment in metadata.fragments()] == list(segments.values())

    if victim_kind == "bookfleet":
        assert not bookfleet_victim.running
        bookfleet_victim.start().wait_ready()  # the next case's fleet is whole again
    else:
        assert not java_bookie.running
    for bookie in fleet.fleet.bookies:
        assert "Traceback" not in bookie.log_path.read_text(), bookie.log_tail()
