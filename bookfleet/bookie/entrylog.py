"""Entry logs: append-only files `entrylog-<id>.log` shared by all ledgers.

A record is `length u32 | ledger u64 | entry i64 | entry bytes`; an entry's location is (log id, offset of its
bytes, size), which the index keeps. Writes come from flushes and GC's compaction (two threads may append at once:
appends and syncs take turns under a lock), always to the current log, which rolls at a size; the log is fsynced
before the index that points into it commits. A new log is started on every open, so bytes a crash left unindexed
at the end of a log are never appended to, only reclaimed by GC. One ledger's records are packed in C (_entrylog.c,
a call per piece of ascending ids, the bytes copied without the GIL): in Python that per-entry loop was most of a
flush's CPU. A piece is packed PACK_BYTES at a time and written once that much is packed.

Appended bytes are written back while a flush appends, a piece at a time (`write_behind`), not all at once by the
sync before the index commits: a flush of 30 MB left to its fsync held the journal's next fdatasync 12-16 ms
behind it (ext4 commits both together), every flush, and that was the bookie's half-load p99.
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import os
import struct
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from bookfleet._entrylog import pack_records
from bookfleet.bookie.journal import fsync_dir, write_all

RECORD_HEADER = struct.Struct(">IQq")
PACK_BYTES = 1024 * 1024
"""Entry bytes packed into one buffer at most (one entry larger than this alone), and written once that much is
packed. 512 entries of 64 KiB (a flush step) packed at once made a 32 MiB buffer, past glibc's largest mmap
threshold, so every step mapped fresh memory, faulted in each page and unmapped it: one bookie at 64 KiB spent 245 µs
of system CPU per entry in the flush thread, 20 µs packing 1 MiB at a time (a buffer this size is reused from the
heap). Cut here, not in the flush's steps: a step is a round trip through the event loop, and on a loaded machine
60 MB flushed in 1 MiB steps took 2.5 s of waits for a core."""
PREFIX = "entrylog-"
SUFFIX = ".log"

WRITE_BEHIND_PIECE = 512 * 1024
"""Writeback is started for each whole piece appended, and waited for two pieces later: at most two pieces (4 ms of
this disk at 260 MB/s) are in the disk's queue ahead of a journal sync, and the disk never waits for the next."""
_SYNC_FILE_RANGE_WAIT_BEFORE, _SYNC_FILE_RANGE_WRITE, _SYNC_FILE_RANGE_WAIT_AFTER = 1, 2, 4
_WAIT_WRITTEN = _SYNC_FILE_RANGE_WAIT_BEFORE | _SYNC_FILE_RANGE_WRITE | _SYNC_FILE_RANGE_WAIT_AFTER
_libc = ctypes.CDLL(None, use_errno=True)
_libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


def write_behind(started: int, appended: int) -> list[tuple[int | None, int]]:
    """With writeback started up to offset `started` of a log of `appended` bytes: each whole piece to start now (its
    offset), after the piece two before it (None for a log's first two pieces) is written."""
    return [
        (start - 2 * WRITE_BEHIND_PIECE if start >= 2 * WRITE_BEHIND_PIECE else None, start)
        for start in range(started, appended - WRITE_BEHIND_PIECE + 1, WRITE_BEHIND_PIECE)
    ]


def _sync_file_range(fd: int, offset: int, flags: int) -> None:
    """Linux's sync_file_range of one piece (the GIL released while it waits: ctypes)."""
    if _libc.sync_file_range(fd, offset, WRITE_BEHIND_PIECE, flags) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"sync_file_range: {os.strerror(error)}")


Written = tuple[int, list[int], int, bytes, bytes, int]
"""Entries of one ledger appended to one log: (ledger, entry ids, log id, offsets, sizes, total size), the offsets of
their bytes (u64) and their sizes (u32) packed little-endian, as the index keeps them (index.py)."""


def log_ids(directory: Path) -> list[int]:
    ids = []
    for name in os.listdir(directory):
        if name.startswith(PREFIX) and name.endswith(SUFFIX) and name[len(PREFIX) : -len(SUFFIX)].isdigit():
            ids.append(int(name[len(PREFIX) : -len(SUFFIX)]))
    return sorted(ids)


def _packs(entry_ids: list[int], entries: list[bytes]) -> Iterator[tuple[list[int], list[bytes]]]:
    """A piece cut into runs of at most PACK_BYTES of entries (an entry larger than that alone); whole when it fits,
    as a piece of small entries does (one sum in C)."""
    if sum(map(len, entries)) <= PACK_BYTES:
        yield entry_ids, entries
        return
    ends = list(itertools.accumulate(map(len, entries)))
    start = 0
    while start < len(entries):
        before = ends[start - 1] if start else 0
        stop = max(start + 1, bisect.bisect_right(ends, before + PACK_BYTES, start))
        yield entry_ids[start:stop], entries[start:stop]
        start = stop


class EntryLogger:
    """Writes entries into the current log and reads any log by location (pread, cached descriptors)."""

    def __init__(self, directory: Path, roll_bytes: int):
        self.directory = directory
        self._roll_bytes = roll_bytes
        directory.mkdir(parents=True, exist_ok=True)
        existing = log_ids(directory)
        self._readers: dict[int, int] = {}
        self._readers_lock = threading.Lock()
        self._writing = threading.Lock()
        self._fd = -1
        self._unsynced: list[int] = []
        self._open((existing[-1] + 1) if existing else 1)

    @property
    def current_log(self) -> int:
        return self._log_id

    def path(self, log_id: int) -> Path:
        return self.directory / f"{PREFIX}{log_id}{SUFFIX}"

    def log_ids(self) -> list[int]:
        return log_ids(self.directory)

    def append(self, pieces: Iterable[tuple[int, list[int], list[bytes]]]) -> list[Written]:
        """Write each piece, (ledger, ascending entry ids, their entries), as records (not yet durable: call sync);
        returns where they went, a piece split in two where the log rolled."""
        with self._writing:
            return self._append(pieces)

    def _append(self, pieces: Iterable[tuple[int, list[int], list[bytes]]]) -> list[Written]:
        written: list[Written] = []
        buffers: list[bytes] = []
        buffered = 0
        for ledger_id, piece_ids, piece_entries in pieces:
            for entry_ids, entries in _packs(piece_ids, piece_entries):
                while True:
                    records, count, offsets, sizes, total = pack_records(
                        ledger_id, entry_ids, entries, self._offset, self._roll_bytes
                    )
                    if count:
                        buffers.append(records)
                        buffered += len(records)
                        ids = entry_ids if count == len(entry_ids) else entry_ids[:count]
                        written.append((ledger_id, ids, self._log_id, offsets, sizes, total))
                        self._offset += len(records)
                    if count == len(entry_ids):
                        break
                    entry_ids, entries = entry_ids[count:], entries[count:]
                    write_all(self._fd, buffers)
                    buffers, buffered = [], 0
                    self._unsynced.append(self._fd)
                    self._open(self._log_id + 1)
                if buffered >= PACK_BYTES:
                    write_all(self._fd, buffers)
                    buffers, buffered = [], 0
                    self._write_behind()
        write_all(self._fd, buffers)
        self._write_behind()
        return written

    def _write_behind(self) -> None:
        """Start writeback of the whole pieces appended since the last call, each after the one two before it is
        written (a log rolled away from is left to `sync`)."""
        pieces = write_behind(self._writeback_started, self._offset)
        for written_first, start in pieces:
            if written_first is not None:
                _sync_file_range(self._fd, written_first, _WAIT_WRITTEN)
            _sync_file_range(self._fd, start, _SYNC_FILE_RANGE_WRITE)
        self._writeback_started += len(pieces) * WRITE_BEHIND_PIECE

    def sync(self) -> None:
        """Make everything appended so far durable (including logs rolled away from since the last sync)."""
        with self._writing:
            for fd in self._unsynced:
                os.fsync(fd)
                os.close(fd)
            self._unsynced.clear()
            os.fsync(self._fd)

    def read(self, log_id: int, offset: int, size: int) -> bytes:
        fd = self._readers.get(log_id)
        if fd is None:
            fd = self._reader(log_id)
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise OSError(f"{self.path(log_id)}: short read of {len(data)} of {size} bytes at offset {offset}")
        return data

    def remove(self, log_id: int) -> int:
        """Delete a log that is no longer referenced (never the current one); returns the bytes freed."""
        if log_id == self._log_id:
            raise ValueError(f"entry log {log_id} is the current log and cannot be removed")
        with self._readers_lock:
            fd = self._readers.pop(log_id, None)
        if fd is not None:
            os.close(fd)
        path = self.path(log_id)
        size = path.stat().st_size
        path.unlink()
        return size

    def close(self) -> None:
        self.sync()
        os.close(self._fd)
        with self._readers_lock:
            for fd in self._readers.values():
                os.close(fd)
            self._readers.clear()

    def _reader(self, log_id: int) -> int:
        with self._readers_lock:
            fd = self._readers.get(log_id)
            if fd is None:
                fd = self._readers[log_id] = os.open(self.path(log_id), os.O_RDONLY)
            return fd

    def _open(self, log_id: int) -> None:
        self._fd = os.open(self.path(log_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        fsync_dir(self.directory)
        self._log_id, self._offset, self._writeback_started = log_id, 0, 0
