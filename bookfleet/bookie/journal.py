"""The journal: every state change is appended here and fdatasynced before it is acknowledged.

Files are `journal-<seq>.log`. A file starts with a header (`magic | version u32 | salt | crc32c u32`: a random salt
per file). It is an older journal file the checkpoint no longer needs, renamed and reused (`SpareFile`), its header
synced with a new salt before its new name appears, so a group commit's fdatasync within its old size writes data
only, never the inode's new size or block allocation. With no such file (the first lap: nothing released yet), a new
file is its header only and grows by append. No zeros are ever written: filling a file with them while the bookie
serves doubled the disk's writes (one bookie at 64 KiB: 2,540 adds/s against 3,290 by append).
Each record is `length u32 | crc32c u32 | type u8 | tag | body`, where `length` counts the body, the tag is the
file's (the CRC32C of its salt) and the CRC covers the salt, the type byte and the body: a record left from a reused
file's earlier life, or zeros, fails its check.
A file's last record is END (written with its last group commit, or at a clean close); without it, the file ends at
the first record that fails its check. Files of the first format (no header, no salt, no tag, no END, grown by
append) are still replayed, as before.

Records are group-committed: appends accumulate in memory, one writer thread takes all of them, writes them with
writev and fdatasyncs, hands the one future every append of that batch shares to the event loop to resolve, and at
once takes what accumulated meanwhile. The writer never waits for the event loop between commits: a loop busy reading
the next requests (a receive of 256 KiB is about a millisecond of Python) held each commit back by the two or three
turns a thread's result needs to reach a task, and the disk sat idle meanwhile. A new file is started on every start
and whenever the current one passes its roll point (`roll_point`: at random in the upper half of the roll size), so
a torn tail can only be at the end of the file that was current at a crash.
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
"""A record's header in a file of the first format: length | crc32c | type."""
SALTED_RECORD_HEADER = struct.Struct(">IIB4s")
"""A record's header in a salted file: length | crc32c | type | the file's tag (the CRC32C of its salt), so the
search for the next intact record past a bad one finds candidates with one C `find` and checks only those."""
LEDGER = struct.Struct(">Q")
LEDGER_AND_LAC = struct.Struct(">Qq")
LEDGER_AND_EPOCH = struct.Struct(">QQ")
PREFIX = "journal-"
SUFFIX = ".log"
SPARE_NAME = "journal-spare.log"
"""The next journal file, a released one ready (its new header synced) before the writer needs it; never replayed."""
FILLING_NAME = "journal-spare.tmp"
"""A spare an earlier bookfleet was filling with zeros; removed at start (a crash there cut its filling short)."""
SALT_SIZE = 8
FILE_HEADER = struct.Struct(f">8sI{SALT_SIZE}sI")
"""magic | format version | salt | crc32c of the fields before it."""
MAGIC = b"bfjournl"
FORMAT_VERSION = 2
"""Version 1 is the first format: no header, no salt, no END record (still replayed)."""


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
    END = 6
    """body: empty. A file's last record: its writer moved on to the next file or stopped cleanly."""


class RecordFormat(NamedTuple):
    """How the records of one file are made and checked."""

    header: struct.Struct
    crcs: dict[int, int]
    """Each record type's CRC32C seed: the CRC of the file's salt and the type byte, which the body extends."""
    tag: bytes
    """In every record header of a salted file; empty in the first format."""


def record_format(salt: bytes | None) -> RecordFormat:
    """The records of a file salted with `salt`, or of the first format (None: no salt, no tag)."""
    salted = crc32c.crc32c(salt or b"")
    crcs = {t: crc32c.crc32c(bytes([t]), salted) for t in RecordType}
    if salt is None:
        return RecordFormat(RECORD_HEADER, crcs, b"")
    return RecordFormat(SALTED_RECORD_HEADER, crcs, salted.to_bytes(4, "big"))


def file_header(salt: bytes) -> bytes:
    fields = FILE_HEADER.pack(MAGIC, FORMAT_VERSION, salt, 0)[: -4]
    return fields + crc32c.crc32c(fields).to_bytes(4, "big")


def file_salt(data: bytes | mmap.mmap) -> bytes | str | None:
    """The salt in a journal file's header; None for a file of the first format; a str saying why the header is
    bad. A version this bookie does not know fails the start: its records cannot be read."""
    if data[: len(MAGIC)] != MAGIC:
        return None
    if len(data) < FILE_HEADER.size:
        return "short file header"
    _, version, salt, crc = FILE_HEADER.unpack_from(data)
    if crc32c.crc32c(data[: FILE_HEADER.size - 4]) != crc:
        return "file header checksum mismatch"
    if version != FORMAT_VERSION:
        raise StorageFailure(f"journal file format version {version} is not this bookie's ({FORMAT_VERSION})")
    return salt


def end_record(fmt: RecordFormat) -> bytes:
    return SALTED_RECORD_HEADER.pack(0, fmt.crcs[RecordType.END], RecordType.END, fmt.tag)


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

    A bad record is judged by what follows it. A search for the next intact record (type, length and salted CRC32C
    check; a reused file's earlier life and zeros never pass) decides: when one follows, synced records were lost
    (the writer only appends, and a commit is acknowledged only once it and everything before it are synced):
    replay resumes there and the span is reported in `damage` (ERROR). When none follows, the bad record is where
    the file ends. That is expected only in the newest file: the end of the group commit a crash cut short (or of
    the file, when the crash fell between commits), never acknowledged; dropped with a WARNING and sealed (an END
    record written there, a first-format file cut), so a later replay never meets it in a file that is no longer
    the newest. In an older file the end is its END record (it rolled only after the commit holding it synced): a
    bad record with nothing intact after it there is lost data, as in a first-format file, whose end is its size.
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
        seal = None
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size <= offset:
                return
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                salt = file_salt(data)
                if isinstance(salt, str):
                    self._lost(Damage(path, 0, size, salt))
                    return
                fmt = record_format(salt)
                if salt is not None:
                    offset = max(offset, FILE_HEADER.size)
                while offset < size:
                    record = _record_at(data, offset, size, fmt)
                    if isinstance(record, str):
                        resume = _next_record(data, offset + 1, size, fmt)
                        if resume is None and newest:
                            log.warning(
                                "journal %s: %s at offset %d; dropped what follows it (a torn tail%s)", path, record,
                                offset, "" if salt is None else ", zeros or the file's earlier life",
                            )
                            seal = (b"" if salt is None else end_record(fmt)), offset
                            break
                        problem = record if resume is not None or salt is None else f"{record}, before any END"
                        self._lost(Damage(path, offset, (size if resume is None else resume) - offset, problem))
                        if resume is None:
                            break
                        offset = resume
                        continue
                    rtype, body, offset = record
                    if rtype == RecordType.END:
                        return
                    yield rtype, body
        if seal is not None:
            _seal(path, *seal)

    def _lost(self, damage: Damage) -> None:
        log.error("journal %s: synced records lost: %s", damage.path, damage)
        self.damage.append(damage)


def _record_at(data: mmap.mmap, offset: int, size: int, fmt: RecordFormat) -> tuple[RecordType, bytes, int] | str:
    """The intact record at `offset` with where the next one starts, or what is wrong with it."""
    if size - offset < fmt.header.size:
        return "short record header"
    if fmt.tag and data[offset + RECORD_HEADER.size : offset + fmt.header.size] != fmt.tag:
        return "no record of this file"
    length, crc, rtype = RECORD_HEADER.unpack_from(data, offset)
    start = offset + fmt.header.size
    if rtype not in fmt.crcs:
        return f"unknown record type {rtype}"
    if size - start < length:
        return f"record of {length} bytes runs past the end of the file"
    body = data[start : start + length]
    if crc32c.crc32c(body, fmt.crcs[rtype]) != crc:
        return "checksum mismatch"
    return RecordType(rtype), body, start + length


_TYPE_BYTE = re.compile(b"[" + re.escape(bytes(sorted(RecordType))) + b"]")
"""A byte that may be a record's type: where the search in a file of the first format looks (9th byte of a header)."""


def _next_record(data: mmap.mmap, offset: int, size: int, fmt: RecordFormat) -> int | None:
    """Where the first intact record at or after `offset` starts (None if there is none): the file's tag (in the
    first format, a header's type byte) narrows the search, length and CRC32C decide."""
    if fmt.tag:
        candidates = (found - RECORD_HEADER.size for found in _finds(data, fmt.tag, offset + RECORD_HEADER.size))
    else:
        type_offset = RECORD_HEADER.size - 1
        candidates = (match.start() - type_offset for match in _TYPE_BYTE.finditer(data, offset + type_offset))
    return next((start for start in candidates if not isinstance(_record_at(data, start, size, fmt), str)), None)


def _finds(data: mmap.mmap, needle: bytes, position: int) -> Iterator[int]:
    """Every place of `needle` in `data` from `position` on."""
    while (found := data.find(needle, position)) >= 0:
        yield found
        position = found + 1


def _seal(path: Path, end: bytes, offset: int) -> None:
    """Make `offset` the durable end of a file replay found torn there: an END record written at it (a file of the
    first format is cut there instead, `end` empty)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        if end:
            os.pwrite(fd, end, offset)
        else:
            os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def create_file(path: Path, salt: bytes) -> None:
    """A new journal file, its header only, synced (its name is the caller's to sync): it grows by append. Never
    filled with zeros first, nor fallocated (its unwritten extents would still be converted, in the journal of the
    file system, on each sync): zeros written while the bookie serves doubled its disk writes, and at start they
    delayed it and took the roll size of disk on every restart."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.pwrite(fd, file_header(salt), 0)
        os.fsync(fd)
    finally:
        os.close(fd)


class SpareFile:
    """The next journal file, made before the writer rolls into it: an older journal file the checkpoint no longer
    needs (`recycle`: a new salt in its header, its size and blocks kept). One at a time; only the writer takes it
    (`take`), by a rename. None is made otherwise: on the first lap the writer rolls into a file of its header only.

    A spare's header, with a salt it never had, is synced before the file gets its spare name, and the spare name
    before its journal name: a journal name never shows a file whose salt is the one of its earlier life."""

    def __init__(self, directory: Path):
        self.path = directory / SPARE_NAME
        self._filling_path = directory / FILLING_NAME
        self._lock = threading.Lock()
        self.salt: bytes | None = None
        """The ready spare's salt; None while there is none."""
        self._busy = False
        """A spare is being made."""

    def load(self) -> None:
        """Take up a spare the last run left ready; remove one an earlier bookfleet's crash left half filled."""
        self._filling_path.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError), open(self.path, "rb") as file:
            salt = file_salt(file.read(FILE_HEADER.size))
            if isinstance(salt, bytes):
                self.salt = salt
                return
        self.path.unlink(missing_ok=True)

    def recycle(self, old: Path) -> bool:
        """Make `old`, a journal file no replay reads any more, the spare, unless one is ready or being made
        (then the caller removes it). Its earlier records stay: the new salt fails every one of them. It is not
        extended: a file that rolled short of the roll size grows by append past its end, and keeps that size."""
        with self._lock:
            if self.salt is not None or self._busy:
                return False
            self._busy = True
        try:
            fd = os.open(old, os.O_WRONLY)
            try:
                with open(old, "rb") as file:
                    earlier = file_salt(file.read(FILE_HEADER.size))
                salt = _new_salt(earlier)
                os.pwrite(fd, file_header(salt), 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            with self._lock:
                os.rename(old, self.path)
                self.salt = salt
            return True
        except OSError:
            log.warning("journal file %s could not be reused; removing it", old, exc_info=True)
            return False
        finally:
            with self._lock:
                self._busy = False

    def take(self, path: Path, salt: bytes) -> bool:
        """Rename the spare to `path` if it is ready with `salt` (the caller then syncs the directory)."""
        with self._lock:
            if self.salt != salt:
                return False
            os.rename(self.path, path)
            self.salt = None
            return True


def _new_salt(earlier: bytes | str | None) -> bytes:
    """A random salt whose tag is never the one of the salt a reused file had."""
    salt = os.urandom(SALT_SIZE)
    if isinstance(earlier, bytes) and record_format(salt).tag == record_format(earlier).tag:
        return _new_salt(earlier)
    return salt


def _record_pieces(fmt: RecordFormat, rtype: RecordType, bodies: list[bytes]) -> tuple[list[bytes], int]:
    """The header and body of each record of `bodies` in a salted file, headers made in C, and their size in all."""
    count = len(bodies)
    sizes = list(map(len, bodies))
    pieces: list[bytes] = [b""] * (2 * count)
    pieces[::2] = map(
        SALTED_RECORD_HEADER.pack, sizes, map(crc32c.crc32c, bodies, itertools.repeat(fmt.crcs[rtype], count)),
        itertools.repeat(rtype, count), itertools.repeat(fmt.tag, count),
    )
    pieces[1::2] = bodies
    return pieces, SALTED_RECORD_HEADER.size * count + sum(sizes)


class Journal:
    """Append-only, group-committed journal in one directory, written by its own thread into reused files (else
    files that grow by append)."""

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
        self._format = record_format(bytes(SALT_SIZE))
        """The salted records appends make: the next file's from the moment the writer takes the current file's
        last batch (swapped under the lock: `_queue` re-salts records made for the file before meanwhile)."""
        self._spare = SpareFile(directory)
        self._fd = -1
        self._seq = 0
        self._file_format = self._format
        """The records of the file being written (its END record's)."""
        self._offset = 0
        self._roll_at = roll_bytes
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer: threading.Thread | None = None
        self.synced = JournalPosition(0, 0)
        """Everything before this position is fdatasynced (moved on the event loop, as each commit resolves)."""

    async def start(self) -> None:
        """Start a new journal file (never append to one a crash may have torn) and the writer thread. The file is
        the spare the last run left, else a new one that grows by append (see `create_file`)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        seqs = journal_seqs(self.directory)
        await asyncio.to_thread(self._spare.load)
        salt = self._spare.salt or _new_salt(None)
        self._format = record_format(salt)
        await asyncio.to_thread(self._open, (seqs[-1] + 1) if seqs else 1, salt)
        self.synced = JournalPosition(self._seq, self._offset)
        self._loop = asyncio.get_running_loop()
        self._batch = Batch(loop=self._loop)
        self._writer = threading.Thread(target=self._write_batches, name="journal-writer", daemon=True)
        self._writer.start()

    def append(self, rtype: RecordType, body: bytes) -> Batch:
        """Queue a record; the returned future (shared by the whole batch) resolves once it is fdatasynced.
        Await it directly: it ignores cancellation, so no asyncio.shield (an allocation per add) is needed."""
        fmt = self._format
        header = SALTED_RECORD_HEADER.pack(len(body), crc32c.crc32c(body, fmt.crcs[rtype]), rtype, fmt.tag)
        return self._queue((header, body), SALTED_RECORD_HEADER.size + len(body), fmt, rtype)

    def append_run(self, rtype: RecordType, bodies: list[bytes]) -> Batch:
        """`append` of each body in order, their headers made in C, queued at once: the adds of one read."""
        fmt = self._format
        pieces, size = _record_pieces(fmt, rtype, bodies)
        return self._queue(pieces, size, fmt, rtype)

    def _queue(
        self, pieces: tuple[bytes, ...] | list[bytes], size: int, fmt: RecordFormat, rtype: RecordType
    ) -> Batch:
        if self._failure is not None:
            raise StorageFailure(f"journal in {self.directory} failed: {self._failure}")
        with self._lock:
            if fmt is not self._format:  # the writer took the last batch of a file meanwhile: these go to the next
                pieces = _record_pieces(self._format, rtype, pieces[1::2])[0]
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
        """Reuse or delete the files that lie wholly before `mark` (never the current one): the first becomes the
        spare if none is ready (`SpareFile.recycle`), the others are deleted. Returns how many went.

        Neither needs a directory fsync: `mark` is durable before this runs, so a file a power cut brings back
        under its old name lies before it, is skipped by replay and goes at the next checkpoint."""
        removed = 0
        for seq in journal_seqs(self.directory):
            if seq < mark.seq and seq != self._seq:
                path = journal_path(self.directory, seq)
                if not self._spare.recycle(path):
                    path.unlink(missing_ok=True)
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
        if self._failure is None:
            await asyncio.to_thread(self._seal)
        os.close(self._fd)

    def _seal(self) -> None:
        """End the file with its END record, so the next start finds a clean end, not a crash's."""
        try:
            os.pwrite(self._fd, end_record(self._file_format), self._offset)
            os.fdatasync(self._fd)
        except OSError:
            log.warning("journal %s: no END record written at close (the next start seals it)", self.directory)

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

    def _open(self, seq: int, salt: bytes) -> None:
        """Start writing file `seq` salted with `salt`: the spare if it has that salt, else a new file of its header
        only, which grows by append."""
        path = journal_path(self.directory, seq)
        if not self._spare.take(path, salt):
            create_file(path, salt)
        fsync_dir(self.directory)
        fd = os.open(path, os.O_WRONLY)
        os.lseek(fd, FILE_HEADER.size, os.SEEK_SET)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._seq, self._offset = fd, seq, FILE_HEADER.size
        self._file_format = record_format(salt)
        self._roll_at = roll_point(self._roll_bytes)

    def _write_and_sync(self, pieces: list[bytes]) -> float:
        """Write and fdatasync; returns the seconds it took."""
        started = time.perf_counter()
        write_all(self._fd, pieces)
        os.fdatasync(self._fd)
        return time.perf_counter() - started

    def _take_batch(self) -> tuple[list[bytes], int, Batch, bytes | None] | None:
        """Wait for records (and, with max_wait, up to that long for flush_bytes of them); take them all with their
        batch, and when they fill the file the salt of the next one (appends use it from now on). None once
        stopping."""
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
            next_salt = None
            if self._offset + self._pending_bytes >= self._roll_at:
                next_salt = self._spare.salt or _new_salt(None)
                self._format = record_format(next_salt)
            taken = self._pending, self._pending_bytes, self._batch, next_salt
            self._pending, self._pending_bytes, self._batch = [], 0, Batch(loop=self._loop)
            return taken

    def _write_batches(self) -> None:
        """The writer thread: commit after commit, each resolved on the event loop."""
        call_soon = self._loop.call_soon_threadsafe
        while (taken := self._take_batch()) is not None:
            pieces, size, batch, next_salt = taken
            try:
                if next_salt is not None:
                    pieces.append(end_record(self._file_format))
                seconds = self._write_and_sync(pieces)
                self._offset += size
                if next_salt is not None:
                    self._open(self._seq + 1, next_salt)
                synced = JournalPosition(self._seq, self._offset)
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
