"""A fleet's parent stopped by a signal leaves nothing behind: SIGTERM (a service manager's stop) and SIGHUP (a closed
terminal) stop `bookfleet standalone` and `bookfleet demo` as Ctrl-C does, and after a kill -9 of the parent its
ZooKeeper, bookies and Spark (JVM, Python daemon and workers) end by their parent-death signal. Either way no process
of the fleet keeps running, holding its ports or its data directory."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bookfleet.polling import wait_for
from tests.fixtures.images import descendants

STARTUP_S = 240.0
GONE_S = 30.0
"""How long the fleet's processes may take to end after their parent did: a bound on lingering, not a speed claim."""
SPARK_DAEMON = b"-m\0bookfleet.replication.sparkdaemon"
"""In the command line of Spark's Python daemon (`spark.python.daemon.module`), which forks the Python workers."""


def command_line(pid: int) -> bytes:
    """A process's command line; empty once it ended (a zombie's is empty too: nothing runs, nothing is held)."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return b""


def running(pid: int) -> bool:
    """Alive, not a zombie, and no signal on its way (a parent-death signal sent and not yet acted on is pending)."""
    with contextlib.suppress(OSError):
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        return not status["State"].strip().startswith(("Z", "X")) and int(status["SigPnd"], 16) == 0 == int(
            status["ShdPnd"], 16
        )
    return False


def started(parent: subprocess.Popen, output: Path, ready: str) -> dict[int, bytes]:
    """Wait for `ready` in the parent's output and for Spark's Python daemon (the deepest child the fleet has: Spark's
    JVM forks it); then every process under the parent, with its command line."""

    def up() -> dict[int, bytes] | None:
        assert parent.poll() is None, f"exited with {parent.returncode}:\n{output.read_text()[-3000:]}"
        if ready not in output.read_text():
            return None
        processes = {pid: line for pid in descendants(parent.pid) if (line := command_line(pid))}
        return processes if any(SPARK_DAEMON in line for line in processes.values()) else None

    return wait_for(up, STARTUP_S, f"{ready!r} and the fleet's processes", interval=0.5)


def ports_named(output: str) -> set[int]:
    """ZooKeeper's and the bookies' ports, as the command printed them."""
    return {int(address or http) for address, http in re.findall(r"127\.0\.0\.1:(\d+)|\(http (\d+)\)", output)}


def bindable(port: int) -> bool:
    """Whether a server could listen on the port again (SO_REUSEADDR, as ZooKeeper and the bookies listen)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def holders(directory: Path) -> list[str]:
    """Processes with their working directory or an open file under `directory`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            paths = [proc / "cwd", *(proc / "fd").iterdir()]
            if any(Path(os.readlink(path)).is_relative_to(directory) for path in paths):
                found.append(f"{proc.name}: {command_line(int(proc.name))[:200]!r}")
    return found


def assert_nothing_left(fleet: dict[int, bytes], ports: set[int], directory: Path) -> None:
    def lingering() -> dict[int, bytes]:
        return {pid: line for pid, line in fleet.items() if command_line(pid) == line}

    with contextlib.suppress(TimeoutError):
        wait_for(lambda: not lingering() and not holders(directory), GONE_S, "the fleet's processes to end")
    if left := lingering():
        for pid in left:  # not to leave them to the next test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not left, f"still running {GONE_S:.0f} s after their parent: {left}"
    assert not holders(directory), f"still holding {directory}: {holders(directory)}"
    assert all(bindable(port) for port in ports), {port: bindable(port) for port in ports}


def run_then_signal(tmp_path: Path, stop: int, ready: str, *argv: str) -> tuple[dict[int, bytes], int, str]:
    """`bookfleet ARGV` (its working directory in `tmp_path`, so every child it starts holds it) sent `stop` once it
    printed `ready` and its fleet is up: the fleet's processes then, its exit code and its output."""
    output = tmp_path / "output"
    with output.open("wb") as sink:
        parent = subprocess.Popen(
            [sys.executable, "-m", "bookfleet", *argv], cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "200"},
        )
    try:
        fleet = started(parent, output, ready)
        parent.send_signal(stop)
        code = parent.wait(STARTUP_S)
    finally:
        parent.kill()
    return fleet, code, output.read_text()


@pytest.mark.spark
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_standalone_leaves_no_process_behind(tmp_path, stop):
    fleet, code, output = run_then_signal(
        tmp_path, stop, "running; Ctrl-C stops", "standalone", "--bookies", "2", "--data-dir", str(tmp_path / "fleet")
    )
    assert_nothing_left(fleet, ports_named(output), tmp_path)
    assert sum(b"\0bookie\0--id\0" in line for line in fleet.values()) == 2, fleet
    if stop != signal.SIGKILL:
        assert code == 0 and "stopping" in output, output[-3000:]


@pytest.mark.spark
def test_demo_stops_on_a_closed_terminal_as_on_ctrl_c(tmp_path):
    """SIGHUP here, SIGTERM for standalone above: both commands stop on both signals through one handler."""
    fleet, code, output = run_then_signal(
        tmp_path, signal.SIGHUP, "Ctrl-C stops",
        "demo", "--ledgers", "2", "--entries", "5", "--timeout", "90", "--data-dir", str(tmp_path / "fleet"),
    )
    assert_nothing_left(fleet, ports_named(output), tmp_path)
    assert code == 0 and "stopping" in output, output[-3000:]


CHILD_OF_A_WORKER_THREAD = """
import os, sys, threading
from bookfleet import childprocess

children, threads = [], []

def start():
    threads.append(threading.get_native_id())
    children.append(childprocess.popen(["sleep", "600"]))

worker = threading.Thread(target=start)
worker.start()
worker.join()
while os.path.exists(f"/proc/self/task/{threads[0]}"):  # the kernel ends the thread a moment after join returns
    os.sched_yield()
print(children[0].pid, flush=True)
sys.stdin.read()
"""


def test_a_child_started_on_a_worker_thread_ends_with_the_process_not_the_thread(tmp_path):
    """The kernel sends the parent-death signal when the thread that forked the child ends: a bookie restarted on
    asyncio.to_thread, or Spark's repair started on the runner's thread, must not end with that thread."""
    parent = subprocess.Popen(
        [sys.executable, "-c", CHILD_OF_A_WORKER_THREAD], cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        child = int(parent.stdout.readline())
        fleet = {child: command_line(child)}
        assert fleet[child] == b"sleep\x00600\x00" and running(child), "the child ended with the thread that started it"
        parent.kill()
        parent.wait()
    finally:
        parent.kill()
    assert_nothing_left(fleet, set(), tmp_path)
