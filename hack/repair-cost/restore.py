"""CPU cost of the repair's copy per restored entry, on a real fleet: ZooKeeper and 4 bookies (processes), LEDGERS
ledgers of E3/Qw2/Qa2 x --entries x --entry-size (as `bench repair`), a bookie killed and marked lost, its ledgers
planned by the repair driver (RepairJob.prepare); then the Spark task's body, `repair_partition`, run here in
process --rounds times over every plan (a copy made again is a recovery add the bookie takes again).

Each round prints the CPU of this process (the task), of the surviving bookies and of ZooKeeper per restored entry
(user + system, so the figure moves far less with the machine's load than wall time; run it two or three times).
Round 1 is what `bench repair` measures: the replacements hold none of the ledgers yet, so each ledger's first copies
wait for the bookie's admission lookup; later rounds copy to bookies that hold them. `--profile FILE`: cProfile of
the last round. `--callgrind`: instructions per restored entry of the task alone, its load-independent figure: two
child processes under callgrind copy a third and then all of the plans (`--plans FILE --take N`), and their
difference divides out the start-up. Spark's JVM and the driver's ZooKeeper work are not here: they do not depend
on how entries are read and written.

Usage (from the repository root): PYTHONPATH=. nice -n 19 .venv/bin/python hack/repair-cost/restore.py 200 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bookfleet.bench.repair import LedgerShape, fill_ledgers
from bookfleet.fleet import BookieFleet
from bookfleet.meta import zk as zkclient
from bookfleet.replication.auditor import mark_lost_bookie
from bookfleet.replication.repair import RepairSettings, repair_partition
from bookfleet.replication.spark_repair import RepairJob
from bookfleet.zkserver import ZooKeeperServer

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of one process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def copy_plans(plans, settings: RepairSettings) -> int:
    """repair_partition over `plans`; the entries restored (an error or a lost entry stops the measure)."""
    results = repair_partition(plans, settings)
    problems = [r for r in results if r.error or r.lost]
    if problems:
        raise SystemExit(f"copy failed: {problems[0]}")
    return sum(r.entries for r in results)


def one_round(plans, settings: RepairSettings, bookies: list[int], zookeeper: int, profile: str | None) -> str:
    """Copy every plan once: the CPU per restored entry of this process (the task), the bookies and ZooKeeper."""
    processes = {"bookies": bookies, "ZooKeeper": [zookeeper]}
    before = {name: sum(map(process_cpu, pids)) for name, pids in processes.items()}
    task, started = time.process_time(), time.monotonic()
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    entries = copy_plans(plans, settings)
    if profiler:
        profiler.disable()
        profiler.dump_stats(profile)
    spent = {"task": time.process_time() - task}
    spent |= {name: sum(map(process_cpu, pids)) - before[name] for name, pids in processes.items()}
    spent["together"] = sum(spent.values())
    figures = ", ".join(f"{name} {seconds / entries * 1e6:.1f} us" for name, seconds in spent.items())
    return f"{entries} entries in {time.monotonic() - started:.2f} s; CPU per entry: {figures}" + (
        " (task profiled)" if profiler else ""
    )


def callgrind_instructions(plans_file: Path, take: int) -> int:
    """Instructions of a child that copies the first `take` plans, under callgrind."""
    command = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        sys.executable, __file__, "--plans", str(plans_file), "--take", str(take),
    ]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    return int(next(line for line in output.splitlines() if "Collected" in line).split()[-1])


def profiled(bookie, output: Path) -> None:
    """Restart a bookie under cProfile (its data kept), writing `output` when it stops cleanly."""
    command = bookie.command()
    bookie.command = lambda: [command[0], "-m", "cProfile", "-o", str(output), *command[1:]]
    bookie.restart()


def entries_of(plans) -> int:
    return sum(len(plan.needed_entries()) * len(plan.lost) for plan in plans)


def measure(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="repair-cost-") as scratch:
        root = Path(scratch)
        with ZooKeeperServer(root / "zookeeper") as server, BookieFleet(server.connect, root / "bookies") as fleet:
            bookies = fleet.start(4)
            asyncio.run(fill_ledgers(server.connect, args.ledgers, args.entries, args.entry_size, LedgerShape()))
            if args.profile_bookies:
                for number, bookie in enumerate(bookies[1:], 1):
                    profiled(bookie, Path(args.profile_bookies) / f"bookie-{number}.prof")
            bookies[0].kill9()
            with zkclient.session(server.connect) as client:
                mark_lost_bookie(client, bookies[0].bookie_id)
                job = RepairJob(client)
                works = job.prepare(None)
                plans = [plan for work in works for plan in work.plans]
                settings = RepairSettings(addresses=job.registry.last_known_addresses(
                    bookie for plan in plans for bookie in plan.bookies
                ))
            print(f"{len(works)} ledgers, {len(plans)} fragments, {entries_of(plans)} entries to restore", flush=True)
            survivors = [bookie.process.pid for bookie in bookies[1:]]
            for round_number in range(1, args.rounds + 1):
                profile = args.profile if round_number == args.rounds else None
                print(f"round {round_number}: {one_round(plans, settings, survivors, server.process.pid, profile)}",
                      flush=True)
            if args.profile_bookies:
                fleet.stop()  # a clean stop ends cProfile's run, which writes its file
            if args.callgrind:
                plans_file = root / "plans.pickle"
                plans_file.write_bytes(pickle.dumps((plans, settings)))
                small, large = len(plans) // 3, len(plans)
                difference = callgrind_instructions(plans_file, large) - callgrind_instructions(plans_file, small)
                per_entry = difference / (entries_of(plans) - entries_of(plans[:small]))
                print(f"instructions per restored entry, task: {per_entry / 1000:.1f}k", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ledgers", type=int, nargs="?", default=200)
    parser.add_argument("--entries", type=int, default=100, help="entries per ledger")
    parser.add_argument("--entry-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", help="cProfile of the last round into this file")
    parser.add_argument("--profile-bookies", metavar="DIR", help="the surviving bookies under cProfile (restarted "
                        "after the fill), one file each in DIR; use with --rounds 1")
    parser.add_argument("--callgrind", action="store_true", help="also instructions per entry of the task")
    parser.add_argument("--plans", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--take", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plans:  # a callgrind child
        plans, settings = pickle.loads(args.plans.read_bytes())
        copy_plans(plans[: args.take], settings)
        return
    measure(args)


if __name__ == "__main__":
    main()
