"""Recording a client history as JSON lines, in the format hack/history-checker reads (see its main.go).

Every process appends to its own file (no locking between processes); timestamps are CLOCK_MONOTONIC, one clock for
every process on the machine, so the checker can merge the files by time. Each line is flushed as it is written:
a process killed with SIGKILL leaves its history up to its last completed line.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from pathlib import Path
from typing import IO


def digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()[:32]


class History:
    """One process's history file: `invoke` returns the operation's id for its `ok` or `fail`."""

    def __init__(self, path: Path, process: str):
        self.process = process
        self._file: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
        self._ids = itertools.count()

    def _write(self, **event: object) -> None:
        self._file.write(json.dumps({"process": self.process, "t": time.monotonic_ns(), **event}) + "\n")

    def invoke(self, f: str, ledger: int, **fields: object) -> str:
        op_id = f"{self.process}-{next(self._ids)}"
        self._write(type="invoke", id=op_id, f=f, ledger=ledger, **fields)
        return op_id

    def ok(self, op_id: str, **told: object) -> None:
        self._write(type="ok", id=op_id, **told)

    def fail(self, op_id: str, error: BaseException) -> None:
        self._write(type="fail", id=op_id, error=f"{type(error).__name__}: {error}"[:200])

    def close(self) -> None:
        self._file.close()
