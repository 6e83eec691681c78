"""`bookfleet audit`: check every entry (or a sample) has its replicas, and mark the ledgers that fall short."""

from __future__ import annotations

import json

from bookfleet import spark as sparksettings
from bookfleet.commanderror import CommandError
from bookfleet.commands import _securityflags as security_options
from bookfleet.meta.zk import ZooKeeperUnreachable
from bookfleet.replication import spark_audit


def register(subparsers) -> None:
    parser = subparsers.add_parser("audit", help="verify every replica of every ledger (Spark job)")
    spark_audit.add_arguments(parser)
    security_options.add_arguments(parser)
    parser.add_argument("--master", default=sparksettings.DEFAULT_MASTER, help="Spark master (default local[2])")
    parser.set_defaults(handler=run)


def run(args) -> int:
    if problem := spark_audit.check_arguments(args):
        raise CommandError(problem)
    try:
        summary = spark_audit.run_audit(args.zk, args.sample, args.master)
    except ZooKeeperUnreachable as exc:
        raise CommandError(str(exc)) from None
    print(json.dumps(summary.to_dict()) if args.json else "\n".join(summary.lines()))
    return 1 if summary.failures else 0
