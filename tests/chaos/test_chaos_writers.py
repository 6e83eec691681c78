"""Generic fault tests of the writer side (marker `chaos`; short in `make test`, long in `make chaos`).

- kill -9 torture: random bookies, sometimes all at once, killed under pipelined writers and restarted on their
  disks; afterwards every acknowledged entry must read back byte-exact, and no writer may have given up while Qa
  bookies of each of its write sets were up.
- fencing race: a writer and a concurrent recovery open at random moments, sometimes with a bookie killed: the
  writer never gets an ack past the lastEntryId recovery closed the ledger at.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from dataclasses import dataclass, field

import pytest

from bookfleet.client.bookkeeper import BookKeeper
from bookfleet.client.errors import LedgerWriteError
from bookfleet.client.placement import NotEnoughBookies
from bookfleet.client.recovery import RecoveryError
from bookfleet.client.writer import LedgerWriter, WriterSettings
from bookfleet.client.writeset import write_set
from bookfleet.fleet import BookieProcess

pytestmark = pytest.mark.chaos

CONFIGS = [(4, 3, 2), (3, 3, 2)]
"""E/Qw/Qa of the torture's ledgers: the two the issue measured writers giving up on."""
SETTINGS = WriterSettings(add_timeout=5.0, replacement_retry=0.5)


def payload(seed: int, ledger_id: int, entry_id: int) -> bytes:
    """A deterministic payload, so the checker keeps only how far each ledger was acknowledged."""
    digest = hashlib.sha256(b"%d:%d:%d" % (seed, ledger_id, entry_id)).digest()
    return digest * (1 + entry_id % 4)


def _harvest(in_flight: list[asyncio.Future[int]]) -> list[int]:
    """The entry ids of the adds in `in_flight` that were acknowledged (a failed writer fails all the others)."""
    return [f.result() for f in in_flight if f.done() and not f.cancelled() and f.exception() is None]


class Killer:
    """Kills bookies with SIGKILL and restarts them on their disks in the background; knows since when each is up."""

    def __init__(self, bookies: list[BookieProcess], rng: random.Random):
        self.bookies = {b.bookie_id: b for b in bookies}
        self.rng = rng
        self.up_since: dict[str, float | None] = dict.fromkeys(self.bookies, time.monotonic())
        self.kills = 0
        self.all_at_once = 0
        self._restarts: set[asyncio.Task] = set()

    def up(self) -> list[str]:
        return [bookie for bookie, since in self.up_since.items() if since is not None]

    def kill(self, all_at_once: bool = False) -> list[str]:
        up = self.up()
        victims = up if all_at_once else self.rng.sample(up, min(1, len(up)))
        self.all_at_once += all_at_once and bool(victims)
        for bookie in victims:
            self.up_since[bookie] = None
            self.bookies[bookie].kill9()
            self.kills += 1
            task = asyncio.ensure_future(self._restart(bookie, self.rng.uniform(0, 0.5)))
            self._restarts.add(task)
            task.add_done_callback(self._restarts.discard)
        return victims

    async def _restart(self, bookie: str, delay: float) -> None:
        await asyncio.sleep(delay)
        await asyncio.to_thread(lambda: self.bookies[bookie].start().wait_ready(120))
        self.up_since[bookie] = time.monotonic()

    async def settle(self) -> None:
        """Wait until every bookie is back."""
        while self._restarts:
            await asyncio.gather(*self._restarts)

    def up_for(self, bookie: str, seconds: float) -> bool:
        since = self.up_since.get(bookie)
        return since is not None and time.monotonic() - since >= seconds


@dataclass
class Torture:
    seed: int
    acked: dict[int, int] = field(default_factory=dict)
    """Ledger id -> highest acknowledged entry id (acks complete in entry order)."""
    gave_up: int = 0
    gave_up_with_qa_up: list[str] = field(default_factory=list)
    ledgers: int = 0


async def _torture_writer(bk: BookKeeper, killer: Killer, torture: Torture, rng: random.Random, stop, entries: int):
    while not stop.is_set():
        e, qw, qa = rng.choice(CONFIGS)
        try:
            writer = await bk.create_ledger(e, qw, qa)
        except NotEnoughBookies:
            await asyncio.sleep(0.2)  # too many bookies down right now
            continue
        torture.ledgers += 1
        torture.acked[writer.ledger_id] = -1
        in_flight: list[asyncio.Future[int]] = []
        try:
            for entry_id in range(entries):
                if stop.is_set():
                    break
                in_flight.append(writer.append(payload(torture.seed, writer.ledger_id, entry_id)))
                if len(in_flight) >= 32:
                    torture.acked[writer.ledger_id] = await in_flight.pop(0)
            for pending in in_flight:
                torture.acked[writer.ledger_id] = await pending
            await writer.close()
        except LedgerWriteError as exc:
            torture.acked[writer.ledger_id] = max([torture.acked[writer.ledger_id], *_harvest(in_flight)])
            torture.gave_up += 1
            ensemble = writer.metadata.segments[-1].bookies
            grace = SETTINGS.add_timeout + 2.0  # the writer could not know of a bookie back for less than that
            if all(
                sum(killer.up_for(ensemble[p], grace) for p in positions) >= qa
                for positions in {tuple(write_set(i, e, qw)) for i in range(e)}
            ):
                torture.gave_up_with_qa_up.append(f"ledger {writer.ledger_id}: {exc}")
            await writer.detach()


async def test_kill9_torture_loses_no_acknowledged_entry(bookie_fleet, zk_connect, chaos_scale):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    started = time.monotonic()
    killer = Killer(bookie_fleet.start(5), rng)
    torture = Torture(seed)
    target_kills = chaos_scale.pick(short=12, long=1000)
    interval = chaos_scale.pick(short=1.2, long=1.4)
    async with BookKeeper(zk_connect, SETTINGS) as bk:
        stop = asyncio.Event()
        writers = [
            asyncio.ensure_future(_torture_writer(bk, killer, torture, random.Random(rng.random()), stop, 400))
            for _ in range(chaos_scale.pick(short=3, long=6))
        ]
        deadline = time.monotonic() + chaos_scale.pick(short=40, long=45 * 60)
        events = 0
        while killer.kills < target_kills and time.monotonic() < deadline:
            await asyncio.sleep(rng.uniform(0.5, 1.5) * interval)
            if len(killer.up()) >= 3:
                killer.kill(all_at_once=events % 10 == 5)  # one event in ten takes every bookie down at once
                events += 1
        stop.set()
        await asyncio.gather(*writers)
        await killer.settle()

        lost, acked_entries = [], 0
        for ledger_id, last_acked in torture.acked.items():
            acked_entries += last_acked + 1
            if bk.ledger_metadata(ledger_id).is_closed:
                reader = await bk.open_ledger(ledger_id)
            else:  # a writer that gave up: recovery decides the end
                reader = await bk.open_ledger(ledger_id, recovery=True)
            if last_acked > reader.metadata.last_entry_id:
                lost.append(f"ledger {ledger_id}: acked up to {last_acked}, closed at {reader.metadata.last_entry_id}")
                continue
            async for entry in reader.entries(0, last_acked):
                if entry.payload != payload(seed, ledger_id, entry.entry_id):
                    lost.append(f"ledger {ledger_id} entry {entry.entry_id}: payload differs")
    chaos_scale.report(
        "kill9_torture",
        seed=seed,
        kills=killer.kills,
        all_at_once=killer.all_at_once,
        ledgers=torture.ledgers,
        acked_entries=acked_entries,
        lost=len(lost),
        writers_gave_up=torture.gave_up,
        gave_up_with_qa_up=len(torture.gave_up_with_qa_up),
        seconds=round(time.monotonic() - started, 1),
    )
    assert killer.kills >= target_kills * chaos_scale.pick(short=0.5, long=1.0), (
        "too few kills: bookies came back slowly"
    )
    assert acked_entries > 0
    assert not lost, lost[:10]
    assert not torture.gave_up_with_qa_up, torture.gave_up_with_qa_up[:10]


async def _race_writer(
    writer: LedgerWriter, seed: int, rng: random.Random, acked: list[int], endings: dict[str, int]
) -> None:
    """Write pipelined (1, 8 or 64 in flight) until the ledger is taken away; every ack lands in `acked`."""
    in_flight: list[asyncio.Future[int]] = []
    try:
        for entry_id in range(100_000):
            in_flight.append(writer.append(payload(seed, writer.ledger_id, entry_id)))
            if len(in_flight) >= rng.choice([1, 8, 64]):
                acked.append(await in_flight.pop(0))
    except LedgerWriteError as exc:
        endings[type(exc).__name__] = endings.get(type(exc).__name__, 0) + 1
    acked.extend(_harvest(in_flight))


async def test_fencing_race_never_acks_past_the_closed_end(bookie_fleet, zk_connect, chaos_scale):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    started = time.monotonic()
    killer = Killer(bookie_fleet.start(5), rng)
    rounds, acked_entries, kills, violations, retried = chaos_scale.pick(short=12, long=400), 0, 0, [], 0
    endings: dict[str, int] = {}
    """How the writers ended: LedgerFencedError, or another LedgerWriteError when a kill made one give up."""
    async with BookKeeper(zk_connect, SETTINGS) as writing, BookKeeper(zk_connect, SETTINGS) as recovering:
        for _ in range(rounds):
            while len(killer.up()) < 4:
                await asyncio.sleep(0.1)
            writer = await writing.create_ledger(*rng.choice(CONFIGS))
            acked: list[int] = []

            writes = asyncio.ensure_future(_race_writer(writer, seed, rng, acked, endings))
            await asyncio.sleep(rng.uniform(0, 0.3))
            if rng.random() < 0.3:
                killer.kill()
                kills += 1
                await asyncio.sleep(rng.uniform(0, 0.1))
            while True:
                try:
                    closed = await recovering.recover_ledger(writer.ledger_id)
                    break
                except RecoveryError:  # too few bookies answered: wait for the killed one to come back
                    retried += 1
                    await asyncio.sleep(0.5)
            await asyncio.wait_for(writes, 60)
            with contextlib.suppress(LedgerWriteError):
                await writer.detach()
            acked_entries += len(acked)
            if acked and max(acked) > closed.last_entry_id:
                violations.append(f"ledger {writer.ledger_id}: ack {max(acked)} > lastEntryId {closed.last_entry_id}")
            reader = await recovering.open_ledger(writer.ledger_id)
            async for entry in reader.entries():
                if entry.payload != payload(seed, writer.ledger_id, entry.entry_id):
                    violations.append(f"ledger {writer.ledger_id} entry {entry.entry_id}: payload differs")
        await killer.settle()
    chaos_scale.report(
        "fencing_race",
        seed=seed,
        rounds=rounds,
        acked_entries=acked_entries,
        kills=kills,
        recoveries_retried=retried,
        writer_endings=endings,
        violations=len(violations),
        seconds=round(time.monotonic() - started, 1),
    )
    assert acked_entries > 0
    assert not violations, violations[:10]
