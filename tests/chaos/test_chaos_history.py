"""The history chaos run (marker `chaos`; short in `make test`, long in `make chaos`): writer processes write and
read ledgers while faults mixed at random from a logged seed hit the fleet — kill -9 and restart of bookies,
SIGSTOP/SIGCONT of bookies past their ZooKeeper session, partitions between the clients and some bookies (blackhole
or reset), ZooKeeper restarts, a full disk (read-only) and a failing disk (read-only on error), and, behind
BOOKFLEET_CHAOS_WRITER_TAKEOVER, writers paused past their session whose ledger a new writer takes over (also while
a bookie that alone holds an unacknowledged add of the old writer is down). Every
operation is recorded with its invocation and completion; at the end every ledger is closed (recovered if open) and
read back whole, and the porcupine checker (hack/history-checker) decides whether the history is legal for a
single-writer append-only log. A run prints one JSON line; its histories (and, on a violation, porcupine's
drawing of each illegal entry) stay in the test's directory, or under $BOOKFLEET_CHAOS_DIR/history-<seed>.

Seed: BOOKFLEET_CHAOS_SEED reruns a given seed (the faults and their order; timing still varies).
BOOKFLEET_CHAOS_ROUNDS sets the number of fault rounds (8 short, 1,000 long)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path

import pytest

from bookfleet.bench.baseline import percentile
from tests.chaos import checker
from tests.chaos.faults import Fleet
from tests.chaos.history import History
from tests.chaos.readback import close_and_read_everything

pytestmark = pytest.mark.chaos

WRITER_TAKEOVER = os.environ.get("BOOKFLEET_CHAOS_WRITER_TAKEOVER", "1") == "1"
"""Writer SIGSTOP past its session + takeover by a new writer, in the short run too: the bookies enforce one writer
(writer epochs). BOOKFLEET_CHAOS_WRITER_TAKEOVER=0 leaves it out."""
FAULTS = ["kill9", "pause_bookie", "partition", "restart_zookeeper", "disk_full", "disk_fail"]


def quantiles(seconds: list[float]) -> dict:
    """p50 and max of a list of durations (empty: none measured)."""
    ordered = sorted(seconds)
    if not ordered:
        return {}
    return {"count": len(ordered), "p50": round(percentile(ordered, 0.5), 2), "max": round(ordered[-1], 2)}


async def test_history_under_mixed_faults_is_legal(tmp_path, chaos_scale, monkeypatch):
    seed = int(os.environ.get("BOOKFLEET_CHAOS_SEED", random.randrange(2**32)))
    if kept := os.environ.get("BOOKFLEET_CHAOS_DIR"):  # `make chaos`: kept out of pytest's rotating temp dirs
        tmp_path = Path(kept).resolve() / f"history-{seed}"
    print(f"\nhistory chaos: seed {seed}, histories in {tmp_path / 'history'}", flush=True)
    rng = random.Random(seed)
    started = time.monotonic()
    monkeypatch.setenv("PYTHONPATH", str(checker.ROOT))  # the bookie and writer processes import tests.chaos
    rounds = int(os.environ.get("BOOKFLEET_CHAOS_ROUNDS", 0)) or chaos_scale.pick(short=8, long=1000)
    kinds = FAULTS + (["pause_writer", "take_over_past_a_down_bookie"] if WRITER_TAKEOVER else [])
    fleet = Fleet(tmp_path, seed)
    try:
        await fleet.start(
            bookies=5, writers=chaos_scale.pick(short=2, long=4), entries=chaos_scale.pick((50, 400), (200, 3000))
        )
        await asyncio.sleep(2)
        for round_ in range(rounds):
            kind = kinds[round_] if round_ < len(kinds) else rng.choice(kinds)  # every kind at least once
            await getattr(fleet, kind)(rng)
            fleet.injected[kind] += 1
            if (round_ + 1) % 50 == 0:  # progress of a long run
                print(f"history chaos: {round_ + 1} rounds, {time.monotonic() - started:.0f} s", flush=True)
            await asyncio.sleep(rng.uniform(0.5, 1.5))
        exited_early = fleet.writers_exited_early()
        killed_at_stop = await fleet.stop_writers()
        faults_done = time.monotonic()
        final = History(fleet.history_dir / "final.history.jsonl", "final")
        await close_and_read_everything(fleet.zk.connect, final)
        final.close()
        final_done = time.monotonic()
    finally:
        await fleet.close()

    giveups = [
        json.loads(line)
        for path in sorted(fleet.history_dir.glob("*.giveups.jsonl"))
        for line in path.read_text().splitlines()
    ]
    with_qa = [g for g in giveups if fleet.gave_up_with_qa_reachable(g)]
    (fleet.history_dir / "outages.json").write_text(json.dumps(fleet.outages))  # to judge the give-ups again later
    verdict = checker.check(sorted(fleet.history_dir.glob("*.history.jsonl")), tmp_path / "html")
    figures = verdict.figures
    chaos_scale.report(
        "history",
        seed=seed,
        rounds=rounds,
        faults=dict(fleet.injected),
        writer_takeover=WRITER_TAKEOVER,
        takeovers=fleet.takeovers,
        stranded_entries=fleet.stranded_entries,
        writers=len(fleet.writers),
        ledgers=figures["ledgers"],
        acked_entries=figures["acknowledged"],
        operations=figures["operations"],
        verdict=verdict.verdict,
        violations=len(figures["violations"] or []),
        violating=(figures["violations"] or [])[:10],
        visualization=figures["visualization"],
        writers_exited_early=exited_early,
        writers_killed_at_stop=killed_at_stop,
        writers_gave_up=len(giveups),
        gave_up_with_qa_reachable=len(with_qa),
        gave_up_with_qa_reachable_errors=[g["error"][:160] for g in with_qa[:10]],
        bookie_rejoin_seconds=quantiles(fleet.rejoin_seconds),
        fault_seconds=round(faults_done - started, 1),
        final_read_seconds=round(final_done - faults_done, 1),
        check_seconds=figures["seconds"],
        seconds=round(time.monotonic() - started, 1),
    )
    assert figures["acknowledged"] > 0
    assert verdict.legal, f"seed {seed}: {figures['violations'][:10]}, drawn in {figures['visualization']}"
    assert not with_qa, with_qa[:5]
