"""Entry logs: append-only files `entrylog-<id>.log` shared by all ledgers.

A record is `length u32 | ledger u64 | entry i64 | entry bytes`; an entry's location is (log id, offset of its
bytes, size), which the index keeps. Writes come from flushes and GC's compaction (two threads may append at once:
appends and syncs take turns under a lock), always to the current log, which rolls at a size; the log is fsynced
before the index that points into it commits. A new log is started on every open, so bytes a crash left unindexed
at the end of a log are never appended to, only reclaimed by GC.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterable
from pathlib import Path

from bookfleet.bookie.journal import fsync_dir, write_all

RECORD_HEADER = struct.Struct(">IQq")
PREFIX = "entrylog-"
SUFFIX = ".log"

Location = tuple[int, int, int]
"""(log id, offset of the entry bytes, size)."""


def log_ids(directory: Path) -> list[int]:
    ids = []
    for name in os.listdir(directory):
        if name.startswith(PREFIX) and name.endswith(SUFFIX) and name[len(PREFIX) : -len(SUFFIX)].isdigit():
            ids.append(int(name[len(PREFIX) : -len(SUFFIX)]))
    return sorted(ids)


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

    def append(self, entries: Iterable[tuple[int, int, bytes]]) -> list[tuple[int, int, int, int, int]]:
        """Write entries (not yet durable: call sync); returns (ledger, entry, log, offset, size) rows."""
        with self._writing:
            return self._append(entries)

    def _append(self, entries: Iterable[tuple[int, int, bytes]]) -> list[tuple[int, int, int, int, int]]:
        rows = []
        pieces: list[bytes] = []
        add_row, add_piece = rows.append, pieces.append  # a flush runs this loop per entry: locals only
        pack, header_size, roll_bytes = RECORD_HEADER.pack, RECORD_HEADER.size, self._roll_bytes
        log_id, offset = self._log_id, self._offset
        for ledger_id, entry_id, entry in entries:
            if offset >= roll_bytes:
                self._offset = offset
                write_all(self._fd, pieces)
                pieces = []
                add_piece = pieces.append
                self._unsynced.append(self._fd)
                self._open(log_id + 1)
                log_id, offset = self._log_id, self._offset
            size = len(entry)
            add_piece(pack(size, ledger_id, entry_id))
            add_piece(entry)
            offset += header_size
            add_row((ledger_id, entry_id, log_id, offset, size))
            offset += size
        self._offset = offset
        write_all(self._fd, pieces)
        return rows

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
        self._log_id, self._offset = log_id, 0
