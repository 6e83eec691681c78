"""`bookfleet bench operator`: the operator's reaction times and memory, on the Kubernetes API emulator; with
`--node-failure`, a bookie's node failing on the local Kubernetes cluster; with `--zone-loss`, a whole zone of it cut
off and returned (`--partition`: partitioned off, a writer inside it, and healed); with `--scale`, the operator over
a fleet of simulated nodes (kwok); with `--teardown`, the chart's uninstall hook deleting that many Ledgers.

A development command: what the benchmark runs on (the emulator, the local cluster, kwok) is test tooling, so the
benchmark is too and stays out of the wheel (tests/operatorbench/). This module declares and checks its options,
then runs it as `python -m tests.operatorbench` from the source checkout this bookfleet is installed from (an
editable install with the `[dev]` extra: `make setup`); elsewhere it says so in one line.
(The module is not called `operator`: that would shadow the standard library's module of that name.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bookfleet.commanderror import CommandError

CHECKOUT = Path(__file__).resolve().parents[2]
HARNESS = "tests.operatorbench"


def register(subparsers) -> None:
    parser = subparsers.add_parser("operator", help="operator reaction times and RSS on the API emulator "
                                                    "(development command: needs a source checkout)")
    parser.add_argument("--replicas", type=int, default=3, help="bookies of the cluster that is timed (default 3)")
    parser.add_argument("--large-bookies", type=int, default=100, help="bookies for the RSS figure (default 100)")
    parser.add_argument("--large-ledgers", type=int, default=5000, help="ledgers for the RSS figure (default 5000)")
    parser.add_argument("--delay", type=int, default=1, help="lostBookieRecoveryDelaySeconds (default 1)")
    parser.add_argument("--interval", type=float, default=1.0, help="operator reconciliation interval (default 1)")
    parser.add_argument("--node-failure", action="store_true",
                        help="instead: fail a bookie's node on the local Kubernetes cluster (minutes; builds it the"
                             " first time) and report the seconds to the repair Job and to a healthy Ledger")
    parser.add_argument("--zone-loss", action="store_true",
                        help="instead: cut a whole zone of the local Kubernetes cluster off for longer than the"
                             " lost-bookie delay, then return it; report the seconds to every ledger back at Qw and the"
                             " repairs the return started")
    parser.add_argument("--partition", action="store_true",
                        help="with --zone-loss: partition the zone off instead (its pods run on, a writer inside it),"
                             " then heal it; report the fence, the acknowledgements the inside writer got, the"
                             " repairs the heal started and the history checker's verdict")
    parser.add_argument("--scale", action="store_true",
                        help="instead: the operator over --bookies bookies and --ledgers Ledgers on the local control"
                             " plane with kwok nodes (needs Go; builds kwok the first time)")
    parser.add_argument("--teardown", action="store_true",
                        help="instead: the chart's uninstall hook (bookfleet delete-cluster) deleting --ledgers Ledgers"
                             " on the local control plane (needs Go): its seconds, CPU and peak RSS against the hook's"
                             " limits")
    parser.add_argument("--bookies", type=int, default=100, help="--scale: bookies (default 100)")
    parser.add_argument("--ledgers", type=int, default=10000,
                        help="--scale, --teardown: Ledger resources (default 10000)")
    parser.add_argument("--window", type=float, default=60.0, help="--scale: seconds of each measuring window")
    parser.add_argument("--settle", type=float, default=30.0,
                        help="--scale: seconds between every Ledger reconciled and the steady window (default 30)")
    parser.add_argument("--zookeeper-only", action="store_true",
                        help="--scale: only the ZooKeeper side (status, the auditor, repair planning) over an embedded"
                             " ZooKeeper with --bookies and --ledgers; no Kubernetes, no Go")
    parser.add_argument("--operator-python", default=sys.executable,
                        help="--scale: the python whose bookfleet runs the operator (another checkout's virtualenv:"
                             " before/after figures)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    if args.replicas < 1 or args.large_bookies < 3 or args.large_ledgers < 0 or args.delay < 0:
        raise CommandError("--replicas must be >= 1, --large-bookies >= 3, --large-ledgers and --delay >= 0")
    if args.partition and not args.zone_loss:
        raise CommandError("--partition is a variant of --zone-loss: pass both")
    if args.scale and (args.bookies < 3 or args.ledgers < 1 or args.window <= 0):
        raise CommandError("--bookies must be >= 3, --ledgers >= 1, --window > 0")
    if args.teardown and args.ledgers < 1:
        raise CommandError("--ledgers must be >= 1")
    if not (CHECKOUT / HARNESS.replace(".", "/") / "__main__.py").is_file():
        raise CommandError("bench operator is a development command: it runs tests/operatorbench of a source "
                           "checkout (pip install -e '.[dev]' there)")
    options = {name: value for name, value in vars(args).items() if isinstance(value, str | int | float | None)}
    return subprocess.run([sys.executable, "-m", HARNESS, json.dumps(options)], cwd=CHECKOUT).returncode
