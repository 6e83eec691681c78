"""`bookfleet repair`: run the Spark repair job once over the marked ledgers (or the given ones)."""

from __future__ import annotations

import contextlib
import json
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bookfleet import spark as sparksettings
from bookfleet.commanderror import CommandError
from bookfleet.commands import _securityflags as security_options
from bookfleet.meta.zk import ZooKeeperUnreachable
from bookfleet.replication import spark_repair
from bookfleet.replication.metricsserver import served


def register(subparsers) -> None:
    parser = subparsers.add_parser("repair", help="copy lost replicas to new bookies (Spark job)")
    spark_repair.add_arguments(parser)
    security_options.add_arguments(parser)
    parser.add_argument("--master", default=sparksettings.DEFAULT_MASTER, help="Spark master (default local[2])")
    parser.set_defaults(handler=run)


@contextlib.contextmanager
def repair_progress(enabled: bool):
    """A rich progress bar on a terminal (ledgers done, bytes copied); a no-op callback otherwise."""
    if not enabled:
        yield None
        return
    columns = [TextColumn("repair"), BarColumn(), MofNCompleteColumn(), TextColumn("ledgers")]
    with Progress(*columns, TextColumn("{task.fields[mb]:.1f} MB"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=False) as progress:
        task = progress.add_task("repair", total=None, mb=0.0)

        def update(done: int, total: int, copied: int) -> None:
            progress.update(task, completed=done, total=total, mb=copied / 1e6)

        yield update


def run(args) -> int:
    if problem := spark_repair.check_arguments(args):
        raise CommandError(problem)
    try:
        with repair_progress(sys.stderr.isatty() and not args.json) as progress:
            summary = served(args.metrics_port, args.metrics_linger_s, lambda: spark_repair.run_repair(
                args.zk, args.ledgers, args.master, args.throttle_mb_s, open_grace_s=args.open_grace_s,
                progress=progress, lock_wait_s=args.lock_wait_s, local_max_mb=args.local_max_mb,
                local_cores=args.local_cores,
            ))
    except ZooKeeperUnreachable as exc:
        raise CommandError(str(exc)) from None
    print(json.dumps(summary.to_dict()) if args.json else "\n".join(summary.lines()))
    return 1 if summary.failures or summary.data_loss else 0
