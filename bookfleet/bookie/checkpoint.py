"""LastLogMark: the journal position up to which everything is in the entry log and the index; JournalDamage: why the
bookie cannot vouch for what it lacks.

The mark is written only after a flush made the entry log and the index durable, so replay may start there. Both are
written atomically (temp file, fsync, rename, fsync of the directory), so a crash leaves the old file or the new one.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import crc32c

from bookfleet.bookie.journal import JournalPosition, fsync_dir

log = logging.getLogger(__name__)

MARK = struct.Struct(">QQ")
CRC = struct.Struct(">I")
FILE_NAME = "lastmark"
DAMAGE_FILE_NAME = "journal-damage"


class LastLogMark:
    """The persisted checkpoint position, kept in the ledger dir next to the entry logs it vouches for."""

    def __init__(self, directory: Path):
        self.path = directory / FILE_NAME

    def read(self) -> JournalPosition:
        """The persisted mark; the start of the journal if there is none yet or it is unreadable."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return JournalPosition(0, 0)
        if len(data) != MARK.size + CRC.size or CRC.unpack_from(data, MARK.size)[0] != crc32c.crc32c(data[:MARK.size]):
            log.warning("%s is corrupt (%d bytes); replaying every journal file still present", self.path, len(data))
            return JournalPosition(0, 0)
        return JournalPosition(*MARK.unpack_from(data))

    def write(self, mark: JournalPosition) -> None:
        data = MARK.pack(*mark)
        write_atomically(self.path, data + CRC.pack(crc32c.crc32c(data)))


class JournalDamage:
    """The synced journal spans this bookie lost, one line each, kept in the ledger dir beside the mark. The
    checkpoint after the replay that found them trims the damaged file away, so this record is all that remembers
    the loss; only an operator removes it (see docs/design.md, *A damaged journal*)."""

    def __init__(self, directory: Path):
        self.path = directory / DAMAGE_FILE_NAME

    def read(self) -> str | None:
        """The lost spans, or None when the journal never lost a synced record."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return None
        return "; ".join(lines) or f"{self.path} is empty"

    def add(self, spans: list[str]) -> None:
        """Record more lost spans (durably, before the storage serves or checkpoints)."""
        before = self.path.read_text() if self.path.exists() else ""
        write_atomically(self.path, (before + "".join(f"{span}\n" for span in spans)).encode())


def write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    fsync_dir(path.parent)
