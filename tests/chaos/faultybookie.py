"""A bookie process whose disk can be made to fail from outside: `python -m tests.chaos.faultybookie <bookie
flags>` runs `bookfleet bookie`, and SIGUSR1 makes every later fdatasync/fsync of the process fail with EIO (what a
dying disk does), as tests/bookie/test_bookie_failures.py injects it in-process. The bookie turns read-only for good; a
restart on the same disk heals it."""

from __future__ import annotations

import errno
import os
import signal
import sys

from bookfleet.cli import main


def _failing_sync(fd: int) -> None:
    raise OSError(errno.EIO, os.strerror(errno.EIO))


def _fail_the_disk(signum: int, frame: object) -> None:
    os.fdatasync = _failing_sync
    os.fsync = _failing_sync


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, _fail_the_disk)
    sys.exit(main(sys.argv[1:]))
