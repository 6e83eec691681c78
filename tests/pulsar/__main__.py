"""`make pulsar-demo`: a Pulsar broker on a 4-bookie bookfleet fleet; 100,000 messages to a 4-partition topic while
a bookie is killed -9 and auto-recovery repairs it; the run's figures as one JSON line."""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

from tests.pulsar import scenario
from tests.pulsar.fleet import fleet_with_broker


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.pulsar", description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--data-dir", type=Path, help="keep the fleet's and the broker's files here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with (tempfile.TemporaryDirectory(prefix="bookfleet-pulsar-") as scratch,
          fleet_with_broker(args.data_dir or Path(scratch)) as (cluster, broker)):
        figures = scenario.run(cluster, broker, "demo", args.messages, args.partitions)
    print(json.dumps(figures))


main()
