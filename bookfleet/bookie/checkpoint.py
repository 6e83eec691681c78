"""LastLogMark: the journal position up to which everything is in the entry log and the index.

Written only after a flush made the entry log and the index durable, so replay may start there; written atomically
(temp file, fsync, rename, fsync of the directory), so a crash leaves either the old mark or the new one.
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
        temporary = self.path.with_suffix(".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data + CRC.pack(crc32c.crc32c(data)))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, self.path)
        fsync_dir(self.path.parent)
