"""`bookfleet auditor`: run an auditor candidate until Ctrl-C (one of all running candidates is active)."""

from __future__ import annotations

from bookfleet.commanderror import CommandError
from bookfleet.commands import _securityflags as security_options
from bookfleet.meta import zk as zkclient
from bookfleet.meta.underreplication import DEFAULT_RECOVERY_DELAY
from bookfleet.polling import until_interrupted
from bookfleet.replication.auditor import WEEK, Auditor
from bookfleet.zkserver import zk_from_env


def register(subparsers) -> None:
    parser = subparsers.add_parser("auditor", help="watch bookies and mark under-replicated ledgers")
    parser.add_argument("--zk", default=zk_from_env(), help="ZooKeeper connect string (default $BOOKFLEET_ZK)")
    security_options.add_arguments(parser)
    parser.add_argument("--id", dest="auditor_id", help="this candidate's name (default host:pid)")
    parser.add_argument(
        "--check-interval", type=float, default=WEEK, help="seconds between replica checks (default one week)"
    )
    parser.add_argument(
        "--default-delay",
        type=float,
        default=DEFAULT_RECOVERY_DELAY,
        help="lostBookieRecoveryDelay in seconds while none is stored in ZooKeeper",
    )
    parser.set_defaults(handler=run, log_level_default="INFO")


def run(args) -> int:
    if not args.zk:
        raise CommandError("no ZooKeeper given: pass --zk HOST:PORT or set BOOKFLEET_ZK")
    if args.check_interval <= 0:
        raise CommandError(f"--check-interval must be positive, got {args.check_interval}")
    if args.default_delay < 0:
        raise CommandError(f"--default-delay must be >= 0, got {args.default_delay}")
    try:
        client = zkclient.connect(args.zk)
    except zkclient.ZooKeeperUnreachable as exc:
        raise CommandError(str(exc)) from None
    try:
        with Auditor(client, args.auditor_id, args.check_interval, args.default_delay):
            until_interrupted()
    finally:
        client.stop()
        client.close()
    return 0
