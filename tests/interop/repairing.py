"""bookfleet's auditor and Spark repair mending one ledger after a bookie of its ensemble is killed: shared by the
interop tests whose ledgers a Java client wrote or a Java bookie holds."""

from __future__ import annotations

from bookfleet import polling
from bookfleet.meta.metadata import LedgerMetadata, MetadataStore
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.replication.auditor import Auditor
from bookfleet.replication.spark_repair import run_repair


def repaired_after_killing(zk, zk_connect: str, ledger_id: int, victim) -> LedgerMetadata:
    """Kill `victim` (a bookie with `kill9`) under an active auditor, wait for its marker on the ledger (the only
    one), run the repair, check it copied everything and cleared the marker; the repaired metadata."""
    under_replication = UnderReplication(zk)
    under_replication.set_recovery_delay(0)
    with Auditor(zk, "interop-auditor") as auditor:
        assert auditor.wait_active(30)
        victim.kill9()
        polling.wait_for(lambda: under_replication.ledger_ids() == [ledger_id], 60, "the auditor's marker")
    summary = run_repair(zk_connect)
    assert (summary.ledgers, summary.failures, summary.data_loss) == (1, [], {}), summary
    assert under_replication.ledger_ids() == []
    return MetadataStore(zk).read(ledger_id)[0]
