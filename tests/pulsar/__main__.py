"""`make pulsar-demo`: a Pulsar broker on a 4-bookie bookfleet fleet; 100,000 messages to a 4-partition topic while
a bookie is killed -9 and auto-recovery repairs it; the run's figures as one JSON line. `--migrate`: a broker on
three of Apache BookKeeper's own bookies moved to bookfleet's under a running producer (figures as one JSON line),
with `--size-gib G` holding G GiB first, and with `--back` the way back after it."""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

from tests.pulsar import migration, scenario
from tests.pulsar.fleet import bookkeeper_fleet_with_broker, fleet_with_broker
from tests.pulsar.migration import migration_setup


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.pulsar", description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--data-dir", type=Path, help="keep the fleet's and the broker's files here")
    parser.add_argument(
        "--against-bookkeeper", action="store_true",
        help="no faults: the producer's rate on bookfleet's bookies, then on Apache BookKeeper's (one line each)",
    )
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --against-bookkeeper: per side, a warm-up round not counted, then this many "
                             "measured rounds (their median is compared)")
    parser.add_argument("--migrate", action="store_true",
                        help="a BookKeeper fleet under a running producer moved to bookfleet bookies, one at a time")
    parser.add_argument("--size-gib", type=float, default=0.0,
                        help="with --migrate: the Java bookies first hold this much in closed ledgers (replicas "
                             "counted) beside the broker's topic, each entry checked on its new replicas after")
    parser.add_argument("--back", action="store_true",
                        help="with --migrate: then the way back onto Java bookies with BookKeeper's AutoRecovery")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bookfleet-pulsar-") as scratch:
        directory = args.data_dir or Path(scratch)
        if args.migrate:
            with migration_setup(directory) as setup:
                for figures in migration.sized_run(setup, args.size_gib, args.partitions, args.back):
                    print(json.dumps(figures), flush=True)
            return
        if not args.against_bookkeeper:
            with fleet_with_broker(directory) as (cluster, broker):
                print(json.dumps(scenario.run(cluster, broker, "demo", args.messages, args.partitions)))
            return
        with fleet_with_broker(directory / "bookfleet", auto_recovery=False) as (_, broker):
            ours = scenario.rounds(broker, args.messages, args.partitions, args.rounds)
        print(json.dumps({"bookies": "bookfleet", **ours}), flush=True)
        with bookkeeper_fleet_with_broker(directory / "bookkeeper") as broker:
            theirs = scenario.rounds(broker, args.messages, args.partitions, args.rounds)
        print(json.dumps({"bookies": "apache-bookkeeper", **theirs}))
        ratio = ours["produce_rate_msg_s"] / theirs["produce_rate_msg_s"]
        print(json.dumps({"bookfleet_over_bookkeeper": round(ratio, 2)}))


main()
