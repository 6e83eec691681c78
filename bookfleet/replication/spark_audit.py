"""The replica audit job: does every entry (or a sample) have its Qw replicas on the bookies its segment names?

The auditor's periodic check reads only the first and last entry of each fragment; this job reads them all
(READ_RANGE per bookie and fragment, digests verified) or a seeded sample (READ_ENTRY), on Spark, with the one
replica checker (`replicacheck`) the auditor and the benchmarks use too, and marks every ledger that falls short
with the bookies that lack replicas, so the repair job copies them back. Only a definite answer counts as short
(no such entry or ledger, a corrupt copy); a bookie that cannot be asked, even at the address it last registered
with, is a failure of this run, never a mark.
Entries recorded as DATA_LOSS are skipped: nothing can bring them back, and re-marking them would loop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from kazoo.client import KazooClient

from bookfleet import spark as sparksettings
from bookfleet import wire
from bookfleet.client.connection import BookieError
from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import MetadataStore, NoSuchLedgerError
from bookfleet.meta.registry import BookieRegistry
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.replication.planner import FragmentPlan
from bookfleet.replication.repair import Connections, Reply
from bookfleet.replication.replicacheck import (
    Coverage,
    ReplicaRange,
    Scope,
    entries_to_check,
    read_copies,
    verdict,
)
from bookfleet.replication.spark_repair import TASKS_PER_CORE

READS_IN_FLIGHT = 64
CHECK_TIMEOUT = 120.0
"""A hung bookie fails its check (reported, not marked) instead of hanging the task."""


@dataclass(frozen=True, slots=True)
class AuditUnit:
    """One closed fragment to check; `fragment` has no lost positions, only the range, ensemble and quorum."""

    fragment: FragmentPlan
    skip: frozenset[int] = frozenset()
    """Entries recorded as DATA_LOSS."""


@dataclass(slots=True)
class AuditResult:
    ledger_id: int
    entries: int = 0
    replicas: int = 0
    short: dict[str, int] = field(default_factory=dict)
    """bookie id -> entries it should hold but does not (absent or corrupt)."""
    error: str | None = None


@dataclass
class AuditSummary:
    ledgers: int = 0
    fragments: int = 0
    entries: int = 0
    replicas: int = 0
    seconds: float = 0.0
    sample: float = 1.0
    marked: dict[int, list[str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        document = asdict(self)
        document["marked"] = {str(k): v for k, v in self.marked.items()}
        return document

    def lines(self) -> list[str]:
        lines = [
            f"audited {self.ledgers} ledger(s), {self.fragments} fragment(s), {self.entries} entries "
            f"({self.replicas} replicas) in {self.seconds:.1f}s; {len(self.marked)} ledger(s) marked under-replicated"
        ]
        lines += [f"marked ledger {ledger_id}: short on {', '.join(b)}" for ledger_id, b in sorted(self.marked.items())]
        lines += [f"failure: {failure}" for failure in self.failures]
        return lines


async def check_replica(
    unit: AuditUnit,
    position: int,
    connections: Connections,
    digester: wire.Digester,
    coverage: Coverage,
    slots: asyncio.Semaphore,
) -> tuple[int, int]:
    """(entries expected, entries absent or corrupt) for one bookie of one fragment, within CHECK_TIMEOUT."""
    fragment = unit.fragment
    expected = entries_to_check(ReplicaRange.of_plan(fragment, position), coverage, unit.skip)
    if not expected:
        return 0, 0
    async with asyncio.timeout(CHECK_TIMEOUT):
        client = await connections.get(fragment.bookies[position])  # no address or no answer: an error, never absent
        async with slots:
            copies = await read_copies(client, fragment.ledger_id, expected, whole_range=coverage.scope is Scope.ALL)
    short = [e for e in expected if verdict(copies.get(e), fragment.ledger_id, e, digester) is not Reply.HAS]
    return len(expected), len(short)


async def audit_unit(
    unit: AuditUnit, connections: Connections, coverage: Coverage, slots: asyncio.Semaphore
) -> AuditResult:
    """Check every bookie of one fragment at once; digests with the ledger's own type and password."""
    fragment = unit.fragment
    result = AuditResult(fragment.ledger_id)
    digester = wire.Digester(fragment.digest_type, fragment.password)
    positions = range(fragment.ensemble_size)
    checks = await asyncio.gather(
        *(check_replica(unit, p, connections, digester, coverage, slots) for p in positions),
        return_exceptions=True,
    )
    for position, outcome in zip(positions, checks, strict=True):
        bookie = fragment.bookies[position]
        if isinstance(outcome, (OSError, BookieError, wire.ProtocolError)):
            result.error = f"ledger {fragment.ledger_id}: bookie {bookie}: {outcome}"
            continue
        if isinstance(outcome, BaseException):
            raise outcome
        expected, absent = outcome
        result.replicas += expected
        if absent:
            result.short[bookie] = result.short.get(bookie, 0) + absent
    checked = (entries_to_check(ReplicaRange.of_plan(fragment, p), coverage, unit.skip) for p in positions)
    result.entries = len({e for entries in checked for e in entries})
    return result


async def audit_units(units: list[AuditUnit], addresses: dict[str, str], sample: float):
    """All fragments of a task concurrently; READS_IN_FLIGHT bounds the reads outstanding."""
    connections = Connections(addresses)
    slots = asyncio.Semaphore(READS_IN_FLIGHT)
    coverage = Coverage.sampled(sample)
    try:
        return await asyncio.gather(*(audit_unit(unit, connections, coverage, slots) for unit in units))
    finally:
        await connections.close()


def audit_partition(units: Iterable[AuditUnit], addresses: dict[str, str], sample: float):
    """The Spark task body."""
    return asyncio.run(audit_units(list(units), addresses, sample))


def plan_audit(zk: KazooClient) -> tuple[list[AuditUnit], int]:
    """Every closed fragment of every ledger (the open tail of a ledger being written has no known end)."""
    store = MetadataStore(zk)
    under_replication = UnderReplication(zk)
    units = []
    ledgers = 0
    for ledger_id in store.ledger_ids():
        try:
            metadata, _ = store.read(ledger_id)
        except NoSuchLedgerError:
            continue
        ledgers += 1
        loss = under_replication.data_loss(ledger_id)
        skip = frozenset(loss.entries if loss else ())
        for fragment in metadata.fragments():
            if fragment.last_entry_id is None or fragment.is_empty:
                continue
            plan = FragmentPlan(
                ledger_id,
                fragment.index,
                fragment.first_entry_id,
                fragment.last_entry_id,
                fragment.bookies,
                metadata.write_quorum,
                lost=(),
                replacements=(),
                digest_type=str(metadata.digest_type),
                password=metadata.password,
            )
            units.append(AuditUnit(plan, skip))
    return units, ledgers


def run_audit(zk: str, sample: float = 1.0, master: str | None = sparksettings.DEFAULT_MASTER) -> AuditSummary:
    """Audit every ledger's replicas once and mark the ledgers that fall short; the library entry point."""
    if not 0 < sample <= 1:
        raise ValueError(f"sample must be in (0, 1], got {sample}")
    started = time.monotonic()
    summary = AuditSummary(sample=sample)
    with zkclient.session(zk) as client:
        units, summary.ledgers = plan_audit(client)
        summary.fragments = len(units)
        addresses = BookieRegistry(client).last_known_addresses(b for unit in units for b in unit.fragment.bookies)
        results = []
        if units:
            context = sparksettings.session(master, app_name="bookfleet-audit").sparkContext
            slices = min(len(units), max(1, context.defaultParallelism) * TASKS_PER_CORE)
            results = (
                context.parallelize(units, slices)
                .mapPartitions(lambda part: audit_partition(part, addresses, sample))
                .collect()
            )
        short: dict[int, set[str]] = {}
        for result in results:
            summary.entries += result.entries
            summary.replicas += result.replicas
            if result.error:
                summary.failures.append(result.error)
            if result.short:
                short.setdefault(result.ledger_id, set()).update(result.short)
        under_replication = UnderReplication(client)
        for ledger_id, bookies in sorted(short.items()):
            under_replication.mark(ledger_id, bookies)
            summary.marked[ledger_id] = sorted(bookies)
    summary.seconds = time.monotonic() - started
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--zk", default=os.environ.get("BOOKFLEET_ZK"), help="ZooKeeper connect string")
    parser.add_argument("--sample", type=float, default=1.0, help="fraction of entries to check, in (0, 1]")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def check_arguments(args: argparse.Namespace) -> str | None:
    if not args.zk:
        return "no ZooKeeper given: pass --zk HOST:PORT or set BOOKFLEET_ZK"
    if not 0 < args.sample <= 1:
        return f"--sample must be a fraction in (0, 1], got {args.sample}"
    return None


def main(argv: list[str] | None = None) -> int:
    return sparksettings.job_main(
        argv, "spark_audit.py", "bookfleet replica audit job", add_arguments, check_arguments,
        lambda args: run_audit(args.zk, args.sample, args.master),
    )


if __name__ == "__main__":
    sys.exit(main())
