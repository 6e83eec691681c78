"""The faults of the history chaos run, each injected into real processes and healed again, and the timeline of
who was reachable when (to judge a writer that gave up).

Bookies run as `tests.chaos.faultybookie` behind a `LinkProxy` each (clients dial the proxy: a partition between
the clients and some bookies is the proxy blackholing or resetting); ZooKeeper is the run's own server, so it can
be restarted; writers are `tests.chaos.writer` processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from kazoo.exceptions import KazooException

from bookfleet import wire
from bookfleet.client.connection import BookieClient, BookieError, NoSuchLedgerOnBookieError
from bookfleet.client.writeset import write_set
from bookfleet.fleet import BookieProcess
from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import MetadataStore
from bookfleet.meta.registry import BookieRegistry
from bookfleet.zkserver import ZooKeeperServer, free_port
from tests.chaos.history import History, digest
from tests.fixtures.netfault import LinkProxy

BOOKIE_SESSION = 4.0
"""The bookies' ZooKeeper session timeout: a bookie paused longer loses its registration."""
CLIENT_SESSION = 10.0
"""The writers' ZooKeeper session timeout (bookfleet.meta.zk's default): a writer paused longer loses its lease."""
QUOTA = 10**12
"""Every bookie's disk quota: a sparse ballast file this large in its ledger dir fills the "disk" at once."""
BALLAST = "disk-full.ballast"
GRACE = 7.0
"""Seconds a bookie must have been reachable before a writer gives up for it to count against the writer: the add
timeout plus slack (the writer cannot know of a bookie back for less than that)."""
REJOIN_TIMEOUT = 120.0
"""How long a healed bookie may take to register as writable again before the run fails."""
PASSWORD = b""
"""The chaos writers' ledger password (create_ledger's default)."""
STRAND_TRIES = 10
"""How often `take_over_past_a_down_bookie` pauses its writer until it is caught between two adds of an open ledger."""
STOP_TIMEOUT = 30.0
"""How long the writers get to stop at the run's end: one stops within a second (its adds in flight, each bounded by
the add timeout, then its close); one still running after this is stuck (a close that never returned held a run for
the 120 s this was, 2026-11-28) and is killed and reported (`writers_killed_at_stop`), not waited for."""
SLOW_ADD_INTERVAL = 0.3
"""Seconds between the adds of that fault's writer: longer than the writer's idle LAC delay, so between two adds its
bookies know its last entry as confirmed."""


class FaultyBookie(BookieProcess):
    """A bookie whose disk fails on SIGUSR1 (tests.chaos.faultybookie)."""

    @property
    def direct_address(self) -> str:
        """Its own port, past its proxy: the harness's own calls are never partitioned."""
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        args = super().command()
        assert args[1:3] == ["-m", "bookfleet"]
        return [sys.executable, "-m", "tests.chaos.faultybookie", *args[3:]]


class Fleet:
    """ZooKeeper, bookies behind proxies, writer processes, and when a fault held each of them (`outages`)."""

    def __init__(self, data_dir: Path, seed: int):
        self.dir = data_dir
        self.seed = seed
        self.zk = ZooKeeperServer(data_dir / "zookeeper", port=free_port())
        self.bookies: dict[str, FaultyBookie] = {}
        self.proxies: dict[str, LinkProxy] = {}
        self.writers: dict[str, subprocess.Popen] = {}
        self.outages: dict[str, list[list[float]]] = {}
        """Bookie id or "zookeeper" -> [down at, up again at (inf while still down)] of each fault that held it."""
        self.paused_writers: dict[str, tuple[float, float]] = {}
        """Writer -> (paused at, resumed at) of its last pause."""
        self.history_dir = data_dir / "history"
        self.history_dir.mkdir(parents=True)
        self.injected: Counter[str] = Counter()
        self.takeovers = 0
        self.stranded = History(self.history_dir / "stranded.history.jsonl", "stranded")
        """The adds `_strand_next_entry` made: invoked, never answered (they may or may not take effect)."""
        self.stranded_entries = 0
        self.registry: BookieRegistry | None = None
        """The harness's own view of the registrations (its own ZooKeeper session)."""
        self.rejoin_seconds: list[float] = []
        """Per healed bookie fault: seconds from the heal until the bookie was registered as writable again."""

    async def start(self, bookies: int, writers: int, entries: tuple[int, int]) -> None:
        await asyncio.to_thread(self.zk.start)
        self.registry = BookieRegistry(await asyncio.to_thread(zkclient.connect, self.zk.connect))
        for n in range(bookies):
            port = free_port()
            proxy = await LinkProxy(port).start()
            bookie = FaultyBookie(
                f"bookie-{n}", self.zk.connect, self.dir / f"bookie-{n}", port=port,
                advertised_address=proxy.address, zk_session_timeout=BOOKIE_SESSION, disk_quota=QUOTA,
                disk_check_interval=0.5,
            )
            self.bookies[bookie.bookie_id], self.proxies[bookie.bookie_id] = bookie, proxy
            bookie.start()
        for bookie in self.bookies.values():
            await asyncio.to_thread(bookie.wait_ready, 120)
        self.entries = entries
        for _ in range(writers):
            self.start_writer()

    def start_writer(self, take_over: int | None = None, add_interval: float = 0.0) -> str:
        name = f"w{len(self.writers)}"
        command = [
            sys.executable, "-m", "tests.chaos.writer", "--zk", self.zk.connect, "--dir", str(self.history_dir),
            "--name", name, "--seed", str(self.seed + len(self.writers)),
            "--min-entries", str(self.entries[0]), "--max-entries", str(self.entries[1]),
        ]
        if take_over is not None:
            command += ["--take-over", str(take_over)]
        if add_interval:
            command += ["--add-interval", str(add_interval)]
        with open(self.history_dir / f"{name}.log", "ab") as log:
            self.writers[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        return name

    # --- the faults: each injects, waits, heals -------------------------------------------------------------

    async def kill9(self, rng) -> None:
        bookie = self.bookies[rng.choice(self.up())]
        self._down(bookie.bookie_id)
        bookie.kill9()
        await asyncio.sleep(rng.uniform(0, 1.0))
        await self._restart(bookie)

    async def pause_bookie(self, rng) -> None:
        bookie = self.bookies[rng.choice(self.up())]
        self._down(bookie.bookie_id)
        os.kill(bookie.process.pid, signal.SIGSTOP)
        await asyncio.sleep(BOOKIE_SESSION + rng.uniform(1, 3))
        os.kill(bookie.process.pid, signal.SIGCONT)
        await self._rejoined(bookie.bookie_id)

    async def partition(self, rng) -> None:
        victims = rng.sample(self.up(), rng.choice([1, 2]))
        blackhole = rng.random() < 0.5
        for bookie in victims:
            self._down(bookie)
            proxy = self.proxies[bookie]
            if blackhole:  # nothing gets through, on open connections (stall) as on new ones (hold)
                proxy.hold()
                proxy.stall()
            else:
                proxy.cut()
        await asyncio.sleep(rng.uniform(2, 6))
        for bookie in victims:
            proxy = self.proxies[bookie]
            if blackhole:
                proxy.release()
                proxy.flow()
            else:
                await proxy.start()
            self._up(bookie)

    async def restart_zookeeper(self, rng) -> None:
        self._down("zookeeper")
        await asyncio.to_thread(self.zk.stop)
        await asyncio.sleep(rng.uniform(0.5, 3))
        await asyncio.to_thread(self.zk.start)
        self._up("zookeeper")

    async def disk_full(self, rng) -> None:
        bookie = self.bookies[rng.choice(self.up())]
        self._down(bookie.bookie_id)
        ballast = bookie.ledger_dir / BALLAST
        with open(ballast, "wb") as file:
            file.truncate(QUOTA)  # sparse: the bookie's usage (file sizes over its quota) jumps past the threshold
        await asyncio.sleep(rng.uniform(2, 5))
        ballast.unlink()
        await self._rejoined(bookie.bookie_id)  # its next disk check turns it writable

    async def disk_fail(self, rng) -> None:
        bookie = self.bookies[rng.choice(self.up())]
        self._down(bookie.bookie_id)
        os.kill(bookie.process.pid, signal.SIGUSR1)
        await asyncio.sleep(rng.uniform(2, 4))
        bookie.kill9()  # read-only for good: replacing the disk is a restart
        await self._restart(bookie)

    async def pause_writer(self, rng) -> None:
        """SIGSTOP a writer past its ZooKeeper session, let a new writer take its ledger over, SIGCONT the old one:
        it must not be able to write into the ledger again. The old process is stopped a little later."""
        running = [name for name, process in self.writers.items() if process.poll() is None]
        if not running:
            return
        name = rng.choice(running)
        ledger_file = self.history_dir / f"{name}.ledger"
        if not ledger_file.exists():
            return
        process = self.writers[name]
        paused_at = time.monotonic()
        os.kill(process.pid, signal.SIGSTOP)
        self.start_writer(take_over=int(ledger_file.read_text()))
        self.takeovers += 1
        await asyncio.sleep(CLIENT_SESSION + rng.uniform(2, 4))
        os.kill(process.pid, signal.SIGCONT)
        self.paused_writers[name] = (paused_at, time.monotonic())
        await asyncio.sleep(rng.uniform(3, 6))  # it writes on, or tries to
        process.terminate()

    async def take_over_past_a_down_bookie(self, rng) -> None:
        """A writer change while a bookie of the write set is down holding an unacknowledged entry. A slow writer of
        its own (one add every SLOW_ADD_INTERVAL, so its bookies know its last entry as confirmed between adds, and
        a reopen rather than a recovery takes its ledger over) is paused past its session; one bookie of its last
        segment alone takes an add of the next entry (as if the writer's add had reached only it; recorded as
        invoked and never answered); that bookie is killed; a new writer takes the ledger over while it is down; it
        comes back with its copy. The new writer's entry of that id is acknowledged: the checker sees whether a
        reader, the final recovery or a repair ever served the other one."""
        name = self.start_writer(add_interval=SLOW_ADD_INTERVAL)
        process, ledger_file = self.writers[name], self.history_dir / f"{name}.ledger"
        for _ in range(STRAND_TRIES):
            await asyncio.sleep(rng.uniform(1, 2))
            if not ledger_file.exists():
                continue
            paused_at = time.monotonic()
            os.kill(process.pid, signal.SIGSTOP)
            await asyncio.sleep(0.3)  # what it sent is taken or not by now
            ledger_id = int(ledger_file.read_text())
            holder = await self._strand_next_entry(ledger_id)
            if holder is not None:
                break
            os.kill(process.pid, signal.SIGCONT)
        else:
            process.terminate()
            return
        self.stranded_entries += 1
        self._down(holder.bookie_id)
        holder.kill9()
        self.start_writer(take_over=ledger_id)
        self.takeovers += 1
        await asyncio.sleep(CLIENT_SESSION + rng.uniform(2, 4))  # the old lease expires; the new writer reopens
        await self._restart(holder)
        os.kill(process.pid, signal.SIGCONT)
        self.paused_writers[name] = (paused_at, time.monotonic())
        await asyncio.sleep(rng.uniform(3, 6))
        process.terminate()

    async def _strand_next_entry(self, ledger_id: int) -> FaultyBookie | None:
        """Add the ledger's next entry to the first bookie of its write set alone (the ledger's own password, digest
        and writer epoch) and return that bookie; None when the ledger is closed, a bookie of its last segment is
        down (one of them might hold a later entry, and the stranded one must lie past every entry there is) or the
        bookies hold entries past their LAC (a reopen would refuse and recover instead: not this fault's case)."""
        metadata, _ = await asyncio.to_thread(MetadataStore(self.registry.zk).read, ledger_id)
        segment = metadata.segments[-1]
        if metadata.is_closed or any(self._is_down(bookie) for bookie in segment.bookies):
            return None
        views = []
        for bookie in segment.bookies:
            async with await BookieClient.connect(self.bookies[bookie].direct_address) as client:
                with contextlib.suppress(NoSuchLedgerOnBookieError):
                    views.append(await client.read_lac_and_last(ledger_id))
        lac = max((lac for lac, _ in views), default=-1)
        last = max((last for _, last in views), default=-1)
        if last != lac:
            return None
        entry_id = last + 1
        holder = self.bookies[segment.bookies[write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)[0]]]
        digester = wire.Digester(metadata.digest_type, PASSWORD)
        async with await BookieClient.connect(holder.direct_address) as client:
            length = wire.decode_entry(digester, await client.read_entry(ledger_id, last)).length if last >= 0 else 0
            payload = b"stranded:%d:%d" % (ledger_id, entry_id)
            op = self.stranded.invoke("add", ledger_id, entry=entry_id, digest=digest(payload))
            entry = wire.encode_entry(digester, ledger_id, entry_id, lac, length + len(payload), payload)
            try:
                await client.add_entry(wire.master_key(PASSWORD), entry, writer_epoch=metadata.writer_epoch)
            except BookieError as exc:  # fenced or reopened meanwhile: nothing stranded
                self.stranded.fail(op, exc)
                return None
        return holder

    def up(self) -> list[str]:
        return [bookie for bookie in self.bookies if not self._is_down(bookie)]

    def _is_down(self, name: str) -> bool:
        return bool(self.outages.get(name)) and self.outages[name][-1][1] == float("inf")

    def _down(self, name: str) -> None:
        self.outages.setdefault(name, []).append([time.monotonic(), float("inf")])

    def _up(self, name: str) -> None:
        if self._is_down(name):
            self.outages[name][-1][1] = time.monotonic()

    async def _restart(self, bookie: FaultyBookie) -> None:
        await asyncio.to_thread(lambda: bookie.start().wait_ready(120))
        await self._rejoined(bookie.bookie_id)

    async def _rejoined(self, name: str) -> None:
        """The end of a bookie's outage: clients find bookies through their registrations, so a bookie counts as
        reachable again once it is registered as writable (a bookie paused past its session, restarted, or out of
        a full disk registers anew), not when the harness healed the fault."""
        healed, deadline = time.monotonic(), time.monotonic() + REJOIN_TIMEOUT
        while name not in await self._writable():
            assert time.monotonic() < deadline, f"{name} not registered as writable {REJOIN_TIMEOUT:.0f}s after a heal"
            await asyncio.sleep(0.05)
        self.rejoin_seconds.append(time.monotonic() - healed)
        self._up(name)

    async def _writable(self) -> set[str]:
        """The bookies registered as writable; none while the harness's own session is being replaced (a ZooKeeper
        restart can outlast it: kazoo then opens a new one, and the harness must not fail the run for that)."""
        try:
            return {info.bookie_id for info in await asyncio.to_thread(self.registry.writable)}
        except KazooException:
            return set()

    # --- judging and ending ---------------------------------------------------------------------------------

    def gave_up_with_qa_reachable(self, giveup: dict) -> bool:
        """Whether Qa bookies of each write set, and ZooKeeper, had been reachable for GRACE when the writer gave
        up, and the writer itself was not paused then."""
        at = giveup["t"]
        paused = self.paused_writers.get(giveup["writer"])
        if paused is not None and paused[0] - GRACE <= at:
            return False

        def reachable(name: str) -> bool:
            return all(end < at - GRACE or start > at for start, end in self.outages.get(name, []))

        ensemble, qw, qa = giveup["ensemble"], giveup["qw"], giveup["qa"]
        sets = {tuple(write_set(i, len(ensemble), qw)) for i in range(len(ensemble))}
        return reachable("zookeeper") and all(sum(reachable(ensemble[p]) for p in s) >= qa for s in sets)

    def writers_exited_early(self) -> list[str]:
        """Writers whose process ended before the run's end without the harness stopping it (after its pause):
        a writer crash, which leaves less load for the rest of the run."""
        return [
            name for name, process in self.writers.items()
            if process.poll() is not None and name not in self.paused_writers
        ]

    async def stop_writers(self, timeout: float = STOP_TIMEOUT) -> list[str]:
        """Ask every writer to stop; the ones still running after `timeout` are killed (their open operation stays
        unanswered in their history, which the checker takes as either outcome): their names."""
        (self.history_dir / "stop").touch()
        deadline = time.monotonic() + timeout
        killed = []
        for name, process in self.writers.items():
            while process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            if process.poll() is None:
                process.kill()
                process.wait()
                killed.append(name)
        return killed

    async def close(self) -> None:
        for process in self.writers.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        for bookie in self.bookies.values():
            if bookie.running:
                os.kill(bookie.process.pid, signal.SIGCONT)
            bookie.kill9()
        for proxy in self.proxies.values():
            await proxy.close()
        if self.registry is not None:
            await asyncio.to_thread(self.registry.zk.stop)
            await asyncio.to_thread(self.registry.zk.close)
        await asyncio.to_thread(self.zk.stop)
