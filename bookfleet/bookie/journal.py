"""The journal: every state change is appended here and fdatasynced before it is acknowledged.

Files are `journal-<seq>.log`; each record is `length u32 | crc32c u32 | type u8 | body`, where `length` counts
the body and the CRC covers the type byte and the body. Records are group-committed: appends accumulate in memory,
one writer thread takes all of them, writes them with writev and fdatasyncs, hands the one future every append of
that batch shares to the event loop to resolve, and at once takes what accumulated meanwhile. The writer never
waits for the event loop between commits: a loop busy reading the next requests (a receive of 256 KiB is about a
millisecond of Python) held each commit back by the two or three turns a thread's result needs to reach a task, and
the disk sat idle meanwhile. A new file is started on every start and whenever the current one passes its
roll point (`roll_point`: at random in the upper half of the roll size), so a torn tail can only be at the end of
the file that was current at a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import mmap
import os
import random
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import crc32c

from bookfleet.bookie.errors import StorageFailure

log = logging.getLogger(__name__)

RECORD_HEADER = struct.Struct(">IIB")
LEDGER = struct.Struct(">Q")
LEDGER_AND_LAC = struct.Struct(">Qq")
LEDGER_AND_EPOCH = struct.Struct(">QQ")
PREFIX = "journal-"
SUFFIX = ".log"


class RecordType(enum.IntEnum):
    ADD = 1
    """body: the encoded entry, exactly as wire.py defines it."""
    FENCE = 2
    """body: ledger_id u64."""
    MASTER_KEY = 3
    """body: ledger_id u64 | master key."""
    LAC = 4
    """body: ledger_id u64 | explicit lac i64."""
    WRITER_EPOCH = 5
    """body: ledger_id u64 | writer epoch u64 (the highest epoch seen: adds of older ones are refused)."""


_TYPE_CRC = {t: crc32c.crc32c(bytes([t])) for t in RecordType}


class Batch(asyncio.Future):
    """The future every append of one group commit shares. It cannot be cancelled: a cancelled waiter (a client
    that went away) must not fail the other adds of its batch; the waiter itself still sees CancelledError."""

    def cancel(self, msg: object = None) -> bool:
        return False


class JournalPosition(NamedTuple):
    """A point in the journal: everything before (seq, offset) is in the files; tuples order like positions."""

    seq: int
    offset: int


def journal_path(directory: Path, seq: int) -> Path:
    return directory / f"{PREFIX}{seq}{SUFFIX}"


def journal_seqs(directory: Path) -> list[int]:
    """Sequence numbers of the journal files in `directory`, ascending."""
    seqs = []
    for name in os.listdir(directory):
        if name.startswith(PREFIX) and name.endswith(SUFFIX) and name[len(PREFIX) : -len(SUFFIX)].isdigit():
            seqs.append(int(name[len(PREFIX) : -len(SUFFIX)]))
    return sorted(seqs)


_IOV_MAX = os.sysconf("SC_IOV_MAX")


def write_all(fd: int, pieces: list[bytes]) -> None:
    """Write `pieces` in order with writev, so a batch is never joined into one more copy; a short write (rare on
    a file) is finished with plain writes."""
    for first in range(0, len(pieces), _IOV_MAX):
        chunk = pieces[first : first + _IOV_MAX]
        written = os.writev(fd, chunk)
        if written < sum(map(len, chunk)):
            rest = memoryview(b"".join(chunk))[written:]
            while rest:
                rest = rest[os.write(fd, rest) :]


def roll_point(roll_bytes: int) -> int:
    """Where a new journal file rolls: somewhere in the upper half of `roll_bytes`, at random. Every bookie of an
    ensemble journals the same bytes, so with one fixed size they all rolled in the same instant; a roll (the new
    file, then removing the old one at the next checkpoint) stalls a bookie's fdatasyncs for 0.1-0.5 s on ext4, and
    all of them at once stalled the writer's acks. Apart, the other bookies' acks carry the adds (Qa < Qw)."""
    return random.randint(roll_bytes // 2, roll_bytes)


def fsync_dir(directory: Path) -> None:
    """Make a created, renamed or removed name in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Damage(NamedTuple):
    """A span of a journal file that was synced and cannot be read any more."""

    path: Path
    offset: int
    length: int
    problem: str

    def __str__(self) -> str:
        return f"{self.problem} at offset {self.offset} of {self.path}, {self.length} bytes lost"


class Replay:
    """Every intact record of a journal from a mark on, in order (iterate once); afterwards `damage` lists the synced
    spans that were lost.

    A bad record is judged by what follows it. When no intact record follows it in the newest file, it is that file's
    torn tail: the end of a group commit a crash cut short, never acknowledged. It is dropped with a WARNING and cut
    off the file before the next file is started, so a later replay never meets it in a file that is no longer the
    newest. When an intact record follows it, or its file is an older one (rolled, hence synced whole), synced
    records were lost: replay resumes at the next intact record and the span is reported in `damage` (ERROR).
    """

    def __init__(self, directory: Path, mark: JournalPosition):
        self.directory = directory
        self.mark = mark
        self.damage: list[Damage] = []

    def __iter__(self) -> Iterator[tuple[RecordType, bytes]]:
        seqs = journal_seqs(self.directory)
        for seq in seqs:
            if seq >= self.mark.seq:
                start = self.mark.offset if seq == self.mark.seq else 0
                yield from self._file(journal_path(self.directory, seq), start, newest=seq == seqs[-1])

    def _file(self, path: Path, offset: int, newest: bool) -> Iterator[tuple[RecordType, bytes]]:
        torn_at = None
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size <= offset:
                return
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                while offset < size:
                    record = _record_at(data, offset, size)
                    if isinstance(record, str):
                        resume = _next_record(data, offset + 1, size)
                        if resume is None and newest:
                            log.warning(
                                "journal %s: %s at offset %d; dropped %d bytes from there to the end of the file "
                                "(a torn tail)", path, record, offset, size - offset,
                            )
                            torn_at = offset
                            break
                        damage = Damage(path, offset, (size if resume is None else resume) - offset, record)
                        log.error("journal %s: synced records lost: %s", path, damage)
                        self.damage.append(damage)
                        if resume is None:
                            break
                        offset = resume
                        continue
                    rtype, body, offset = record
                    yield rtype, body
        if torn_at is not None:
            _cut(path, torn_at)


def _record_at(data: mmap.mmap, offset: int, size: int) -> tuple[RecordType, bytes, int] | str:
    """The intact record at `offset` with where the next one starts, or what is wrong with it."""
    if size - offset < RECORD_HEADER.size:
        return "short record header"
    length, crc, rtype = RECORD_HEADER.unpack_from(data, offset)
    start = offset + RECORD_HEADER.size
    if rtype not in _TYPE_CRC:
        return f"unknown record type {rtype}"
    if size - start < length:
        return f"record of {length} bytes runs past the end of the file"
    body = data[start : start + length]
    if crc32c.crc32c(body, _TYPE_CRC[rtype]) != crc:
        return "checksum mismatch"
    return RecordType(rtype), body, start + length


_TYPE_BYTE = re.compile(b"[" + re.escape(bytes(sorted(RecordType))) + b"]")
"""A byte that may be a record's type: where the search for the next intact record looks (9th byte of a header)."""


def _next_record(data: mmap.mmap, offset: int, size: int) -> int | None:
    """Where the first intact record at or after `offset` starts (None if there is none): the header's type byte
    narrows the search, its length and CRC32C decide."""
    type_offset = RECORD_HEADER.size - 1
    for match in _TYPE_BYTE.finditer(data, offset + type_offset):
        start = match.start() - type_offset
        if not isinstance(_record_at(data, start, size), str):
            return start
    return None


def _cut(path: Path, offset: int) -> None:
    """Cut a torn tail off its file, durably, so only what replay yielded is left in it."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    """Append-only, group-committed journal in one directory, written by its own thread."""

    def __init__(
        self,
        directory: Path,
        max_wait: float,
        flush_bytes: int,
        roll_bytes: int,
        on_sync: Callable[[int, float], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
    ):
        """`on_sync(bytes, seconds)` is called on the event loop after each group commit's write+fdatasync;
        `on_failure(reason)` once, on the event loop, when a write or sync fails (nothing is acknowledged after)."""
        self.directory = directory
        self._max_wait = max_wait
        self._flush_bytes = flush_bytes
        self._roll_bytes = roll_bytes
        self._on_sync = on_sync
        self._on_failure = on_failure
        self._lock = threading.Lock()
        """Guards what appends and the writer thread share: the pending records, their batch, the flags below."""
        self._records_ready = threading.Condition(self._lock)
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._batch: Batch | None = None
        self._writer_idle = False
        """The writer waits for a first record (an append wakes it)."""
        self._writer_filling = False
        """The writer waits up to max_wait for flush_bytes (an append that reaches them wakes it)."""
        self._stopping = False
        self._last: Batch | None = None
        self._fd = -1
        self._seq = 0
        self._offset = 0
        self._roll_at = roll_bytes
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer: threading.Thread | None = None
        self.synced = JournalPosition(0, 0)
        """Everything before this position is fdatasynced (moved on the event loop, as each commit resolves)."""

    async def start(self) -> None:
        """Start a new journal file (never append to one a crash may have torn) and the writer thread."""
        self.directory.mkdir(parents=True, exist_ok=True)
        seqs = journal_seqs(self.directory)
        await asyncio.to_thread(self._open, (seqs[-1] + 1) if seqs else 1)
        self.synced = JournalPosition(self._seq, 0)
        self._loop = asyncio.get_running_loop()
        self._batch = Batch(loop=self._loop)
        self._writer = threading.Thread(target=self._write_batches, name="journal-writer", daemon=True)
        self._writer.start()

    def append(self, rtype: RecordType, body: bytes) -> Batch:
        """Queue a record; the returned future (shared by the whole batch) resolves once it is fdatasynced.
        Await it directly: it ignores cancellation, so no asyncio.shield (an allocation per add) is needed."""
        header = RECORD_HEADER.pack(len(body), crc32c.crc32c(body, _TYPE_CRC[rtype]), rtype)
        return self._queue((header, body), RECORD_HEADER.size + len(body))

    def append_run(self, rtype: RecordType, bodies: list[bytes]) -> Batch:
        """`append` of each body in order, their headers made in C, queued at once: the adds of one read."""
        count = len(bodies)
        sizes = list(map(len, bodies))
        pieces: list[bytes] = [b""] * (2 * count)
        pieces[::2] = map(
            RECORD_HEADER.pack, sizes, map(crc32c.crc32c, bodies, itertools.repeat(_TYPE_CRC[rtype], count)),
            itertools.repeat(rtype, count),
        )
        pieces[1::2] = bodies
        return self._queue(pieces, RECORD_HEADER.size * count + sum(sizes))

    def _queue(self, pieces: tuple[bytes, ...] | list[bytes], size: int) -> Batch:
        if self._failure is not None:
            raise StorageFailure(f"journal in {self.directory} failed: {self._failure}")
        with self._lock:
            self._pending += pieces
            self._pending_bytes += size
            if self._writer_idle or (self._writer_filling and self._pending_bytes >= self._flush_bytes):
                self._records_ready.notify()
            batch = self._batch
        self._last = batch
        return batch

    @property
    def current_seq(self) -> int:
        """The sequence number of the file being written."""
        return self._seq

    def barrier(self) -> Batch | None:
        """The future of the last appended record's batch (None if nothing was ever appended)."""
        return self._last

    def remove_before(self, mark: JournalPosition) -> int:
        """Delete the files that lie wholly before `mark` (never the current one); returns how many.

        The removals need no directory fsync: `mark` is durable before this runs, so a file a power cut brings back
        lies before it, is skipped by replay and removed by the next checkpoint."""
        removed = 0
        for seq in journal_seqs(self.directory):
            if seq < mark.seq and seq != self._seq:
                journal_path(self.directory, seq).unlink(missing_ok=True)
                removed += 1
        return removed

    async def close(self) -> None:
        """Write and sync what is pending, then stop."""
        if self._writer is None:
            return
        if self._last is not None and self._failure is None:
            with contextlib.suppress(StorageFailure):
                await self._last
        await asyncio.to_thread(self.stop_writer)
        os.close(self._fd)

    def stop_writer(self) -> None:
        """Stop the writer thread once it waits for records (what is still pending is left unwritten)."""
        if self._writer is None:
            return
        with self._lock:
            self._stopping = True
            self._records_ready.notify()
        self._writer.join()
        self._writer = None

    # --- writer side ---------------------------------------------------------------------------------------

    def _open(self, seq: int) -> None:
        fd = os.open(journal_path(self.directory, seq), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        fsync_dir(self.directory)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._seq, self._offset = fd, seq, 0
        self._roll_at = roll_point(self._roll_bytes)

    def _write_and_sync(self, pieces: list[bytes]) -> float:
        """Write and fdatasync; returns the seconds it took."""
        started = time.perf_counter()
        write_all(self._fd, pieces)
        os.fdatasync(self._fd)
        return time.perf_counter() - started

    def _take_batch(self) -> tuple[list[bytes], int, Batch] | None:
        """Wait for records (and, with max_wait, up to that long for flush_bytes of them); take them all with their
        batch. None once stopping."""
        with self._lock:
            while not self._pending and not self._stopping:
                self._writer_idle = True
                self._records_ready.wait()
                self._writer_idle = False
            if self._max_wait > 0 and self._pending_bytes < self._flush_bytes and not self._stopping:
                self._writer_filling = True
                self._records_ready.wait(self._max_wait)
                self._writer_filling = False
            if self._stopping:
                return None
            taken = self._pending, self._pending_bytes, self._batch
            self._pending, self._pending_bytes, self._batch = [], 0, Batch(loop=self._loop)
            return taken

    def _write_batches(self) -> None:
        """The writer thread: commit after commit, each resolved on the event loop."""
        call_soon = self._loop.call_soon_threadsafe
        while (taken := self._take_batch()) is not None:
            pieces, size, batch = taken
            try:
                seconds = self._write_and_sync(pieces)
                self._offset += size
                synced = JournalPosition(self._seq, self._offset)
                if self._offset >= self._roll_at:
                    self._open(self._seq + 1)
                    synced = JournalPosition(self._seq, 0)
            except OSError as exc:
                with self._lock:
                    self._failure = exc
                    unwritten = self._batch  # no append gets a batch after this one
                call_soon(self._failed, exc, (batch, unwritten))
                return
            call_soon(self._synced, batch, synced, size, seconds)

    def _synced(self, batch: Batch, synced: JournalPosition, size: int, seconds: float) -> None:
        self.synced = synced
        if self._on_sync is not None:
            self._on_sync(size, seconds)
        batch.set_result(None)

    def _failed(self, exc: OSError, batches: tuple[Batch, Batch]) -> None:
        log.error("journal %s failed; no further adds are acknowledged: %s", self.directory, exc)
        error = StorageFailure(f"journal write failed: {exc}")
        for batch in batches:
            batch.set_exception(error)
            batch.exception()  # retrieved here, so an unawaited batch does not warn
        if self._on_failure is not None:
            self._on_failure(f"journal write or sync failed in {self.directory}: {exc}")
