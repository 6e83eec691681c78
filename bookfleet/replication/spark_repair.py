"""The Spark repair job: markers in, fully replicated ledgers out.

The driver reads the markers (or the ledgers it was given), takes each ledger's repair lock, fences and closes an
OPEN ledger only when its current segment lost a bookie and the grace period is over (a ledger that lost bookies
only in earlier segments is repaired while its writer goes on), plans the damaged fragments and ships batches of
them to Spark tasks (bookfleet.replication.repair). The driver, not the task, holds the lock: from planning through
the metadata swap, so the ephemeral lock covers the whole repair of a ledger and dies with a killed driver; tasks
only copy.
As each batch returns, every ledger in it whose copies all succeeded gets its segments rewritten by
compare-and-set and its marker cleared by compare-and-set, so a run killed half-way keeps what it finished and a
rerun converges: a copy whose metadata update never happened is simply made again.

A bookie is missing only when a marker names it (the auditor marks after lostBookieRecoveryDelay, a replica check
on a definite answer, a writer for a bookie that missed entries); an unregistered bookie the marker does not name
is a survivor, asked at the address it last registered with. A ledger whose copy could not be made (a survivor
that did not answer) keeps its marker and its metadata, and the runner retries it with backoff.

Run it in process (`run_repair`, `bookfleet repair`) or through spark-submit (`python spark_repair.py --zk ...`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, fields

from kazoo.client import KazooClient
from prometheus_client import Counter

from bookfleet import spark as sparksettings
from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.placement import NotEnoughBookies, PlacementPolicy, choose_replacement
from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import (
    LedgerMetadata,
    MetadataStore,
    MetadataVersionConflict,
)
from bookfleet.meta.registry import BookieInfo, BookieRegistry
from bookfleet.meta.underreplication import Marker, UnderReplication
from bookfleet.replication.metricsserver import served
from bookfleet.replication.planner import (
    FragmentPlan,
    choose_replacements,
    lost_positions,
    plan_ledger,
    tail_is_damaged,
)
from bookfleet.replication.repair import FragmentResult, RepairSettings, repair_partition

log = logging.getLogger(__name__)

DEFAULT_OPEN_GRACE_S = 30.0
"""How long an OPEN ledger's writer gets to replace a lost bookie itself before repair fences the ledger."""
BATCH_BYTES = 64 * 1024 * 1024
"""Upper bound of data per Spark task: small enough to report progress and commit often."""
TASKS_PER_CORE = 2
"""Batches per Spark core: two waves, so the first wave commits while the second copies; more tasks cost more
than they overlap (each Spark task pays a fixed start-up: job scheduling, the Python worker's file setup)."""
CAS_ATTEMPTS = 10
ZK_THREADS = 16
"""ZooKeeper calls in flight while planning and committing: each ledger costs a few round trips and fsyncs."""
ZK_SESSION_TIMEOUT = 4.0
"""Short, so the ledger locks of a killed driver expire soon and a rerun can take them."""

REPAIRED_ENTRIES = Counter("bookfleet_repair_entries", "Entries copied to replacement bookies by repair")
REPAIRED_BYTES = Counter("bookfleet_repair_bytes", "Bytes copied to replacement bookies by repair")
REPAIRED_LEDGERS = Counter("bookfleet_repair_ledgers", "Ledgers brought back to full replication by repair")
LOST_ENTRIES = Counter("bookfleet_repair_data_loss_entries", "Entries repair found with no surviving replica")


@dataclass
class RepairSummary:
    """What one run did; `pending` ledgers are still marked (a failure, a young open ledger, or a lock another repair
held for all of the run's lock wait: those are also in `locked_elsewhere`); `done_elsewhere` ledgers were locked by
another repair, which cleared their markers while this run waited."""

    ledgers: int = 0
    fragments: int = 0
    entries: int = 0
    bytes: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    data_loss: dict[int, list[int]] = field(default_factory=dict)
    pending: list[int] = field(default_factory=list)
    locked_elsewhere: list[int] = field(default_factory=list)
    done_elsewhere: list[int] = field(default_factory=list)
    disabled: bool = False

    def to_dict(self) -> dict:
        document = asdict(self)
        document["data_loss"] = {str(k): v for k, v in self.data_loss.items()}
        document["mb_per_s"] = round(self.bytes / 1e6 / self.seconds, 3) if self.seconds else 0.0
        return document

    @classmethod
    def from_dict(cls, document: dict) -> RepairSummary:
        """The inverse of to_dict (what a spark-submit child prints with --json)."""
        names = {f.name for f in fields(cls)}
        values = {key: value for key, value in document.items() if key in names}
        values["data_loss"] = {int(k): v for k, v in values.get("data_loss", {}).items()}
        return cls(**values)

    def lines(self) -> list[str]:
        """The human summary: one line of totals, then one per failure and per ledger with lost data."""
        if self.disabled:
            return ["repair skipped: ledger replication is disabled (UnderReplication switch)"]
        rate = self.to_dict()["mb_per_s"]
        elsewhere = f"{len(self.done_elsewhere)} done by another repair, " if self.done_elsewhere else ""
        locked = f" ({len(self.locked_elsewhere)} locked by another repair)" if self.locked_elsewhere else ""
        lines = [
            f"repaired {self.ledgers} ledger(s): {self.fragments} fragment(s), {self.entries} entries, "
            f"{self.bytes / 1e6:.1f} MB in {self.seconds:.1f}s ({rate:.1f} MB/s); "
            f"{elsewhere}{len(self.pending)} still marked{locked}, {len(self.failures)} failure(s)"
        ]
        lines += [f"failure: {failure}" for failure in self.failures]
        lines += [
            f"DATA LOSS: ledger {ledger_id} has no surviving replica of {len(entries)} entr"
            f"{'y' if len(entries) == 1 else 'ies'} ({describe_ranges(entries)})"
            for ledger_id, entries in sorted(self.data_loss.items())
        ]
        return lines


def cleared_elsewhere(markers: dict[int, Marker | None]) -> tuple[list[int], dict[int, Marker]]:
    """Split ledgers another repair held, read again once their locks went: (the ids whose marker is gone, done by
    that repair; the markers still there, for this run to repair)."""
    done = sorted(ledger_id for ledger_id, marker in markers.items() if marker is None)
    return done, {ledger_id: marker for ledger_id, marker in markers.items() if marker is not None}


def describe_ranges(ids: Sequence[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    ranges: list[list[int]] = []
    for value in sorted(ids):
        if ranges and value == ranges[-1][1] + 1:
            ranges[-1][1] = value
        else:
            ranges.append([value, value])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in ranges)


@dataclass
class LedgerWork:
    """One locked ledger on its way through the run."""

    ledger_id: int
    marker: Marker | None
    plans: list[FragmentPlan]
    metadata: LedgerMetadata
    version: int
    """The metadata the plans were made from, and its znode version: the commit's compare-and-set expects it."""

    @property
    def size(self) -> int:
        return sum(len(p.needed_entries()) * p.entry_size_hint * len(p.lost) for p in self.plans)


ProgressCallback = Callable[[int, int, int], None]
"""(ledgers done, ledgers planned, bytes copied so far)."""
SessionFactory = Callable[[int], object]
"""The SparkSession to copy `planned bytes` on (the active one once started)."""


class RepairJob:
    """One run of the driver over one ZooKeeper session."""

    def __init__(
        self,
        zk: KazooClient,
        throttle_mb_s: float | None = None,
        open_grace_s: float = DEFAULT_OPEN_GRACE_S,
        policy: PlacementPolicy | str = PlacementPolicy.ZONE_AWARE,
        lock_wait_s: float = sparksettings.DEFAULT_LOCK_WAIT_S,
    ):
        self.zk = zk
        self.metadata = MetadataStore(zk)
        self.registry = BookieRegistry(zk)
        self.under_replication = UnderReplication(zk)
        self.throttle_mb_s = throttle_mb_s
        self.open_grace_s = open_grace_s
        self.policy = policy
        self.lock_wait_s = lock_wait_s
        self.locked_elsewhere: set[int] = set()
        """Ledgers this run wanted whose lock another repair held when it tried; see wait_for_other_repairs."""
        self.holder = f"repair:{socket.gethostname()}:{os.getpid()}"
        self.summary = RepairSummary()
        self.lock = threading.Lock()

    def run(
        self,
        spark: SessionFactory,
        ledgers: Sequence[int] | None = None,
        progress: ProgressCallback | None = None,
    ) -> RepairSummary:
        """One pass; `spark` makes the SparkSession for the bytes planned, called only when there is something to
        copy. The run's own work comes first, then the ledgers another repair had locked (wait_for_other_repairs)."""
        started = time.monotonic()
        try:
            if self.under_replication.is_disabled():
                self.summary.disabled = True
                return self.summary
            works = self.prepare(ledgers)
            log.info("repair: %d ledger(s) locked and planned in %.1fs", len(works), time.monotonic() - started)
            self.copy(spark, works, progress)
            self.wait_for_other_repairs(spark, progress)
        finally:
            self.summary.seconds = time.monotonic() - started
        return self.summary

    # --- planning ---------------------------------------------------------------------------------------------

    def prepare(self, ledgers: Sequence[int] | None) -> list[LedgerWork]:
        """Lock and plan every ledger to repair now; the others land in `pending` or `failures`.

        Markers, locks and metadata are read and taken in pipelines of asynchronous ZooKeeper calls, not one
        round trip after another per ledger."""
        if ledgers is None:
            markers: dict[int, Marker | None] = {m.ledger_id: m for m in self.under_replication.markers()}
        else:
            markers = self.under_replication.read_markers(ledgers)
        return self.lock_and_plan(markers)

    def lock_and_plan(self, markers: dict[int, Marker | None]) -> list[LedgerWork]:
        """prepare() of ledgers whose markers were read; those locked elsewhere go to `locked_elsewhere`."""
        writable = self.registry.writable()
        locked = self.under_replication.acquire_all(markers, self.holder)
        self.locked_elsewhere.update(ledger_id for ledger_id in markers if ledger_id not in locked)
        stored = self.metadata.read_all(ledger_id for ledger_id in markers if ledger_id in locked)

        def plan(ledger_id: int) -> LedgerWork | None:
            return self.plan_locked(ledger_id, markers[ledger_id], stored[ledger_id], writable)

        with ThreadPoolExecutor(ZK_THREADS, thread_name_prefix="repair-plan") as pool:  # recovery opens block
            return [work for work in pool.map(plan, stored) if work is not None]

    def wait_for_other_repairs(self, spark: SessionFactory, progress: ProgressCallback | None) -> None:
        """Follow up the ledgers another repair had locked, as a BookKeeper replication worker does, rather than leave
        them to a later run: as each lock goes (watched in ZooKeeper, not polled) re-read the markers of those ledgers
        (one pipeline); a marker gone was cleared by the other repair, a marker still there is locked, planned and
        copied here. Up to lock_wait_s in all; what another repair still holds then stays pending."""
        if not self.locked_elsewhere:
            return
        log.info("repair: waiting up to %.0fs for %d ledger(s) another repair has locked (%s)", self.lock_wait_s,
                 len(self.locked_elsewhere), describe_ranges(sorted(self.locked_elsewhere)))
        watch = self.under_replication.lock_watch()
        deadline = time.monotonic() + self.lock_wait_s
        gone = watch.watch(self.locked_elsewhere)
        while self.locked_elsewhere:
            gone = gone or watch.wait(deadline - time.monotonic())
            if not gone:
                break
            self.locked_elsewhere -= gone
            done, marked = cleared_elsewhere(self.under_replication.read_markers(sorted(gone)))
            self.summary.done_elsewhere += done
            held = set(self.locked_elsewhere)
            self.copy(spark, self.lock_and_plan(marked), progress)
            gone = watch.watch(self.locked_elsewhere - held)  # taken again by yet another repair meanwhile
        self.summary.done_elsewhere.sort()
        self.summary.locked_elsewhere = sorted(self.locked_elsewhere)
        if self.locked_elsewhere:
            log.warning("repair: %d ledger(s) still locked by another repair after %.0fs, left marked (%s)",
                        len(self.locked_elsewhere), self.lock_wait_s, describe_ranges(self.summary.locked_elsewhere))
        self.summary.pending += self.summary.locked_elsewhere

    def plan_locked(
        self,
        ledger_id: int,
        marker: Marker | None,
        stored: tuple[LedgerMetadata, int] | None,
        writable: list[BookieInfo],
    ) -> LedgerWork | None:
        """plan(), releasing the lock when there is nothing to copy."""
        work = None
        try:
            work = self.plan(ledger_id, marker, stored, writable)
        finally:
            if work is None:
                self.under_replication.release(ledger_id)
        return work

    def plan(
        self,
        ledger_id: int,
        marker: Marker | None,
        stored: tuple[LedgerMetadata, int] | None,
        writable: list[BookieInfo],
    ) -> LedgerWork | None:
        if stored is None:
            if marker is not None:
                self.under_replication.clear(marker)  # deleted ledgers need no replicas
            return None
        metadata, version = stored
        missing = marker.missing_bookies if marker else frozenset()
        choose = self.chooser(writable)
        if tail_is_damaged(metadata, missing):
            tail = metadata.segments[-1].bookies
            try:  # a writer going on at Qa is better than a fenced ledger nobody can repair
                choose_replacements(tail, lost_positions(tail, missing), metadata.write_quorum, missing, choose)
            except NotEnoughBookies as exc:
                self.fail(ledger_id, f"ledger {ledger_id}: not fencing its writer, no replacement bookie: {exc}")
                return None
            if self.close_open_ledger(ledger_id, marker, metadata) is None:
                return None
            metadata, version = self.metadata.read(ledger_id)
        try:
            plans = plan_ledger(ledger_id, metadata, missing, choose, marker.lost_bookies if marker else ())
        except NotEnoughBookies as exc:
            self.fail(ledger_id, f"ledger {ledger_id}: no replacement bookie: {exc}")
            return None
        if not plans:
            self.finish(ledger_id, marker, metadata)
            return None
        return LedgerWork(ledger_id, marker, plans, metadata, version)

    def chooser(self, writable: list[BookieInfo]):
        def choose(ensemble, position, write_quorum, avoid) -> str:
            return choose_replacement(writable, ensemble, position, write_quorum, self.policy, exclude=avoid)

        return choose

    def close_open_ledger(
        self, ledger_id: int, marker: Marker | None, metadata: LedgerMetadata
    ) -> LedgerMetadata | None:
        """Fence and close an OPEN ledger whose current segment lost a bookie, once its marker is older than the
        grace period its writer gets to replace the bookie itself (recovery open). The grace counts from the
        writer's newest mark of missed entries when that is later than the marker's creation: a writer riding
        through marks again, and is not fenced the moment it does."""
        age = time.time() - (marker.grace_start / 1000 if marker else metadata.ctime)
        if age < self.open_grace_s:
            self.summary.pending.append(ledger_id)
            return None
        try:
            return asyncio.run(self.recover(ledger_id, metadata.password))
        except Exception as exc:  # any recovery failure leaves the ledger marked for the next run
            self.fail(ledger_id, f"ledger {ledger_id}: recovery open failed: {exc}")
            return None

    async def recover(self, ledger_id: int, password: bytes) -> LedgerMetadata:
        """Recovery open with the ledger's own password (from its metadata), as BookKeeper's admin opens it."""
        bookkeeper = BookKeeper(self.zk)
        try:
            return await bookkeeper.recover_ledger(ledger_id, password)
        finally:
            await bookkeeper.close()

    # --- copying ----------------------------------------------------------------------------------------------

    def copy(self, spark: SessionFactory, works: list[LedgerWork], progress: ProgressCallback | None) -> None:
        """Run batches of ledgers as concurrent single-task Spark jobs; commit each ledger as its batch returns."""
        if not works:
            return
        started = time.monotonic()
        context = spark(sum(work.size for work in works)).sparkContext
        parallelism = max(1, context.defaultParallelism)
        batches = self.batches(works, parallelism * TASKS_PER_CORE)
        settings = RepairSettings(
            addresses=self.registry.last_known_addresses(
                bookie for work in works for plan in work.plans for bookie in plan.bookies
            ),
            throttle_bytes_per_s=self.throttle_mb_s * 1e6 / parallelism if self.throttle_mb_s else None,
        )
        done = 0
        if progress:
            progress(done, len(works), 0)

        def run_batch(batch: list[LedgerWork]) -> list[FragmentResult]:
            plans = [plan for work in batch for plan in work.plans]
            rdd = context.parallelize([plans], 1)
            return rdd.flatMap(lambda fragment_plans: repair_partition(fragment_plans, settings)).collect()

        def committed() -> None:
            nonlocal done
            with self.lock:
                done += 1
                if progress:
                    progress(done, len(works), self.summary.bytes)

        with (
            ThreadPoolExecutor(parallelism, thread_name_prefix="repair-batch") as spark_pool,
            ThreadPoolExecutor(ZK_THREADS, thread_name_prefix="repair-commit") as zk_pool,
        ):
            futures = {spark_pool.submit(run_batch, batch): batch for batch in batches}
            try:
                for future in as_completed(futures):
                    batch = futures[future]
                    try:
                        results = future.result()
                    except Exception as exc:  # a task that failed twice: keep the markers, report, go on
                        results = []
                        error = f"Spark task failed: {exc}"
                    else:
                        error = None
                    by_ledger: dict[int, list[FragmentResult]] = {}
                    for result in results:
                        by_ledger.setdefault(result.ledger_id, []).append(result)
                    zk_pool.submit(self.commit_batch, batch, by_ledger, error, committed)
            finally:
                for future in futures:
                    future.cancel()
        log.info("repair: %d ledger(s) copied and committed in %.1fs", len(works), time.monotonic() - started)

    @staticmethod
    def batches(works: list[LedgerWork], count: int) -> list[list[LedgerWork]]:
        """Whole ledgers per batch (a ledger commits once): about `count` batches of equal data when there is
        enough work, more when that would put over about BATCH_BYTES in one."""
        limit = max(1.0, min(BATCH_BYTES, sum(work.size for work in works) / count))
        batches: list[list[LedgerWork]] = [[]]
        filled = 0
        for work in works:
            if batches[-1] and filled + work.size / 2 > limit:  # a ledger joins the batch it fits best
                batches.append([])
                filled = 0
            batches[-1].append(work)
            filled += work.size
        return batches

    # --- committing -------------------------------------------------------------------------------------------

    def commit_batch(
        self,
        batch: list[LedgerWork],
        by_ledger: dict[int, list[FragmentResult]],
        error: str | None,
        committed: Callable[[], None],
    ) -> None:
        """Commit the ledgers of a returned batch, one ZooKeeper transaction each, all in flight at once."""
        started = []
        for work in batch:
            try:
                if self.account(work, by_ledger.get(work.ledger_id, []), error):
                    started.append((work, *self.start_swap(work)))
                    continue
            except Exception as exc:  # ZooKeeper trouble: the ledger stays marked for the next run
                self.fail(work.ledger_id, f"ledger {work.ledger_id}: commit failed: {exc}")
            self.under_replication.release(work.ledger_id)
            committed()
        cleared = []
        for work, clears, releases, transaction in started:
            applied = False
            try:
                applied = self.end_swap(work, clears, transaction)
            except Exception as exc:
                self.fail(work.ledger_id, f"ledger {work.ledger_id}: commit failed: {exc}")
            finally:
                if not (applied and releases):
                    self.under_replication.release(work.ledger_id)
            if applied and clears:
                cleared.append(work.ledger_id)
            committed()
        self.under_replication.prune_levels(self.under_replication.shared_levels(cleared))

    def account(self, work: LedgerWork, results: list[FragmentResult], error: str | None = None) -> bool:
        """Count a ledger's copies and record its lost entries; False (and a failure) unless all copies succeeded."""
        errors = [error] if error else [r.error for r in results if r.error]
        if not errors and len(results) != len(work.plans):
            errors.append(f"{len(work.plans) - len(results)} fragment(s) returned no result")
        copied_entries = sum(r.entries for r in results)
        copied_bytes = sum(r.bytes for r in results)
        with self.lock:
            self.summary.fragments += sum(r.error is None for r in results)
            self.summary.entries += copied_entries
            self.summary.bytes += copied_bytes
        REPAIRED_ENTRIES.inc(copied_entries)
        REPAIRED_BYTES.inc(copied_bytes)
        if errors:
            self.fail(work.ledger_id, f"ledger {work.ledger_id}: {errors[0]}")
            return False
        lost = sorted({e for r in results for e in r.lost})
        if lost:
            self.under_replication.mark_data_loss(work.ledger_id, lost)
            self.summary.data_loss[work.ledger_id] = lost
            LOST_ENTRIES.inc(len(lost))
            log.error("DATA LOSS: ledger %d lost entries %s", work.ledger_id, describe_ranges(lost))
        return True

    def start_swap(self, work: LedgerWork):
        """Send the commit of a ledger as one transaction: its bookie swap by compare-and-set against the planned
        metadata, the marker's clear by compare-and-set when nothing it names is left, and the lock's release.
        Returns (clears the marker, releases the lock, the transaction's asynchronous result)."""
        updated = self.replaced(work, work.metadata)
        txn = self.zk.transaction()
        self.metadata.update_in(txn, work.ledger_id, updated, work.version)
        clears = work.marker is not None and self.clearable(work.marker, updated)
        if clears:
            self.under_replication.clear_in(txn, work.marker)
        releases = self.under_replication.release_in(txn, work.ledger_id)
        return clears, releases, txn.commit_async()

    def end_swap(self, work: LedgerWork, clears: bool, transaction) -> bool:
        """Wait for start_swap's transaction; True if it was applied. If any part failed (metadata or marker changed
        meanwhile, a new bookie's index parent missing, the lock lost), nothing was: redo it step by step from a
        fresh read."""
        if not any(isinstance(result, Exception) for result in transaction.get()):
            self.count_repaired()
            if work.marker is not None and not clears:
                self.summary.pending.append(work.ledger_id)
            return True
        metadata = self.replace_bookies(work)
        if metadata is not None:
            self.finish(work.ledger_id, work.marker, metadata)
        return False

    def replace_bookies(self, work: LedgerWork) -> LedgerMetadata | None:
        """Put each replacement into its segment by compare-and-set, re-reading and re-applying on conflict."""
        for _ in range(CAS_ATTEMPTS):
            metadata, version = self.metadata.read(work.ledger_id)
            updated = self.replaced(work, metadata)
            if updated is None or updated == metadata:
                return updated
            try:
                self.metadata.update(work.ledger_id, updated, version)
                return updated
            except MetadataVersionConflict:
                continue
        self.fail(work.ledger_id, f"ledger {work.ledger_id}: metadata kept changing; {CAS_ATTEMPTS} updates failed")
        return None

    def replaced(self, work: LedgerWork, metadata: LedgerMetadata) -> LedgerMetadata | None:
        """`metadata` with the work's replacements in their segments; None (and a failure) if those changed."""
        updated = metadata
        for plan in work.plans:
            segment = updated.segments[plan.segment_index] if plan.segment_index < len(updated.segments) else None
            if segment is None or segment.first_entry_id != plan.first_entry_id:
                self.fail(work.ledger_id, f"ledger {work.ledger_id}: segments changed during repair; rerun")
                return None
            for position, replacement in zip(plan.lost, plan.replacements, strict=True):
                current = segment.bookies[position]
                if current == replacement:
                    continue  # a previous run got this far
                if current != plan.bookies[position]:
                    self.fail(work.ledger_id, f"ledger {work.ledger_id}: position {position} changed to {current}")
                    return None
                updated = updated.with_replaced_bookie(plan.segment_index, position, replacement)
        return updated

    def finish(self, ledger_id: int, marker: Marker | None, metadata: LedgerMetadata) -> None:
        """Clear the marker when no missing bookie is left in the ledger; a marker changed meanwhile stays."""
        self.count_repaired()
        if marker is not None and not (self.clearable(marker, metadata) and self.under_replication.clear(marker)):
            self.summary.pending.append(ledger_id)

    @staticmethod
    def clearable(marker: Marker, metadata: LedgerMetadata) -> bool:
        """No bookie the marker names is left in the ledger."""
        return not metadata.bookies() & marker.missing_bookies

    def count_repaired(self) -> None:
        with self.lock:
            self.summary.ledgers += 1
        REPAIRED_LEDGERS.inc()

    def fail(self, ledger_id: int, message: str) -> None:
        log.warning("repair: %s", message)
        self.summary.failures.append(message)
        self.summary.pending.append(ledger_id)


def run_repair(
    zk: str,
    ledgers: Sequence[int] | None = None,
    master: str | None = sparksettings.DEFAULT_MASTER,
    throttle_mb_s: float | None = None,
    open_grace_s: float = DEFAULT_OPEN_GRACE_S,
    progress: ProgressCallback | None = None,
    lock_wait_s: float = sparksettings.DEFAULT_LOCK_WAIT_S,
    local_max_mb: float = 0.0,
    local_cores: int = 2,
) -> RepairSummary:
    """Repair the marked ledgers (or `ledgers`) once; the library entry point of `bookfleet repair`. A plan of at
    most `local_max_mb` MB runs in this process alone, `local[local_cores]`, whatever the master (sparksettings.
    repair_master; 0: never)."""
    def session(planned_bytes: int):
        chosen = sparksettings.repair_master(master, planned_bytes, local_max_mb, local_cores)
        started = time.monotonic()
        spark = sparksettings.session(chosen, app_name="bookfleet-repair")
        log.info("repair: %.1f MB planned, Spark session on %s in %.1fs", planned_bytes / 1e6,
                 chosen or spark.sparkContext.master, time.monotonic() - started)
        return spark

    with zkclient.session(zk, ZK_SESSION_TIMEOUT) as client:
        job = RepairJob(client, throttle_mb_s, open_grace_s, lock_wait_s=lock_wait_s)
        return job.run(session, ledgers, progress)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by `bookfleet repair` and the spark-submit entry point."""
    parser.add_argument("--zk", default=os.environ.get("BOOKFLEET_ZK"), help="ZooKeeper connect string")
    parser.add_argument("--ledger", type=int, action="append", dest="ledgers", metavar="ID", help="repair only these")
    parser.add_argument("--throttle-mb-s", type=float, help="cap on the bytes copied per second, in MB/s")
    parser.add_argument(
        "--open-grace-s",
        type=float,
        default=DEFAULT_OPEN_GRACE_S,
        help=f"seconds an OPEN ledger's writer gets before repair fences it (default {DEFAULT_OPEN_GRACE_S:.0f})",
    )
    parser.add_argument(
        "--lock-wait-s",
        type=float,
        default=sparksettings.DEFAULT_LOCK_WAIT_S,
        help="seconds the run waits, after its own work, for ledgers another repair has locked; those still locked "
        f"then stay marked (default {sparksettings.DEFAULT_LOCK_WAIT_S:.0f})",
    )
    parser.add_argument(
        "--local-max-mb",
        type=float,
        default=0.0,
        help="a plan of at most this many MB runs in the driver alone, Spark local[--local-cores], not on the master's"
        " executors (default 0: never)",
    )
    parser.add_argument("--local-cores", type=int, default=2, help="cores of that local run (default 2)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--metrics-port", type=int, help="serve the bookfleet_repair_* counters on this port "
                        "(all addresses) while the run lasts")
    parser.add_argument("--metrics-linger-s", type=float, default=0.0, help="after the run, if anything scraped "
                        "those counters, wait at most this long for its next scrape (default 0)")


def check_arguments(args: argparse.Namespace) -> str | None:
    """The first thing wrong with the flags, as one line, or None."""
    if not args.zk:
        return "no ZooKeeper given: pass --zk HOST:PORT or set BOOKFLEET_ZK"
    if args.throttle_mb_s is not None and args.throttle_mb_s <= 0:
        return f"--throttle-mb-s must be positive, got {args.throttle_mb_s}"
    if args.open_grace_s < 0:
        return f"--open-grace-s must be >= 0, got {args.open_grace_s}"
    if not 0 <= args.local_max_mb < math.inf or args.local_cores < 1:
        return f"--local-max-mb must be >= 0 and --local-cores >= 1, got {args.local_max_mb}, {args.local_cores}"
    if not 0 <= args.lock_wait_s < math.inf:
        return f"--lock-wait-s must be a number of seconds >= 0, got {args.lock_wait_s}"
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        return f"--metrics-port must be a port number, got {args.metrics_port}"
    if not 0 <= args.metrics_linger_s < math.inf:
        return f"--metrics-linger-s must be a number of seconds >= 0, got {args.metrics_linger_s}"
    if any(ledger_id < 0 for ledger_id in args.ledgers or ()):
        return f"--ledger ids must be >= 0, got {min(args.ledgers)}"
    return None


def main(argv: list[str] | None = None) -> int:
    return sparksettings.job_main(
        argv, "spark_repair.py", "bookfleet repair job", add_arguments, check_arguments,
        lambda args: served(args.metrics_port, args.metrics_linger_s, lambda: run_repair(
            args.zk, args.ledgers, args.master, args.throttle_mb_s, open_grace_s=args.open_grace_s,
            lock_wait_s=args.lock_wait_s, local_max_mb=args.local_max_mb, local_cores=args.local_cores,
        )),
    )


if __name__ == "__main__":
    sys.exit(main())
