"""Child processes that end with this one, however it ends: a clean exit, a signal, or kill -9.

The kernel's parent-death signal (prctl PR_SET_PDEATHSIG, armed in the child between fork and exec and kept across
exec) signals the child when its parent dies, so ZooKeeper, bookies, spark-submit and a local cluster's processes
never outlive a fleet's parent and hold its ports and data directory. The kernel sends it when the *thread* that
forked the child ends, not the process: a child forked on a worker thread (asyncio.to_thread, an executor's worker,
a pod's thread) would be killed when that thread ends. So every child is forked on one thread of this module's,
which lives as long as the process.
"""

from __future__ import annotations

import ctypes
import functools
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)

_requests: queue.SimpleQueue[tuple[Callable[[], subprocess.Popen], Future]] = queue.SimpleQueue()
_forker: threading.Thread | None = None
_forker_lock = threading.Lock()


def popen(command: list[str], on_parent_death: int = signal.SIGTERM, **popen_args) -> subprocess.Popen:
    """`subprocess.Popen(command, **popen_args)` whose child gets `on_parent_death` when this process ends (SIGTERM:
    the child's own clean stop; SIGKILL for one that blocks SIGTERM)."""
    arm = functools.partial(end_with_parent, on_parent_death, os.getpid())  # the child's first step after fork
    started: Future = Future()
    _requests.put((lambda: subprocess.Popen(command, preexec_fn=arm, **popen_args), started))
    _ensure_forker()
    return started.result()


def end_with_parent(on_parent_death: int = signal.SIGTERM, parent: int | None = None) -> None:
    """Arm the parent-death signal on this process: in a child between fork and exec, or in a process whose parent is
    not ours (spark-submit's JVM starts a job's driver). With `parent`, take the signal at once if that parent is
    already gone."""
    if _libc.prctl(PR_SET_PDEATHSIG, int(on_parent_death), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), on_parent_death)


def _ensure_forker() -> None:
    global _forker
    with _forker_lock:
        if _forker is None or not _forker.is_alive():
            _forker = threading.Thread(target=_fork_requested, name="child-forker", daemon=True)
            _forker.start()


def _fork_requested() -> None:
    while True:
        start, started = _requests.get()
        try:
            started.set_result(start())
        except BaseException as exc:
            started.set_exception(exc)
