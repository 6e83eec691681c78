"""`bookfleet autorecovery disable|enable|status|delay SECONDS`: the switches BookKeeper users know from
`bookkeeper shell autorecovery` and `lostbookierecoverydelay`, kept in ZooKeeper where the auditor, the repair job
and the operator read them."""

from __future__ import annotations

from bookfleet.commanderror import CommandError
from bookfleet.commands._zksession import add_zk_argument, zk_session
from bookfleet.meta.fleetstatus import auditor_status
from bookfleet.meta.underreplication import UnderReplication


def register(subparsers) -> None:
    parser = subparsers.add_parser("autorecovery", help="pause or resume re-replication, set the lost-bookie delay")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    disable = actions.add_parser(
        "disable", help="pause re-replication (e.g. for a rolling restart): nothing is marked or repaired"
    )
    disable.set_defaults(handler=run_disable)
    enable = actions.add_parser("enable", help="resume re-replication")
    enable.set_defaults(handler=run_enable)
    status = actions.add_parser("status", help="whether re-replication is enabled, the delay and the auditor")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(handler=run_status)
    delay = actions.add_parser(
        "delay", help="set lostBookieRecoveryDelay: how long a vanished bookie may stay away before it is lost"
    )
    delay.add_argument("seconds", type=int, metavar="SECONDS", help="whole seconds (BookKeeper keeps no fraction)")
    delay.set_defaults(handler=run_delay)
    for action in (disable, enable, status, delay):
        add_zk_argument(action)


def run_disable(args) -> int:
    with zk_session(args.zk) as client:
        UnderReplication(client).disable()
    print("auto-recovery disabled: lost bookies' ledgers are not marked or repaired until `autorecovery enable`")
    return 0


def run_enable(args) -> int:
    with zk_session(args.zk) as client:
        UnderReplication(client).enable()
    print("auto-recovery enabled")
    return 0


def run_status(args) -> int:
    with zk_session(args.zk) as client:
        auditor = auditor_status(client)
    if args.json:
        print(auditor.model_dump_json())
        return 0
    print(f"auto-recovery {'disabled' if auditor.replication_disabled else 'enabled'}")
    print(f"lostBookieRecoveryDelay {auditor.recovery_delay_s:g}s")
    standbys = f" (+{auditor.standbys} standby)" if auditor.standbys else ""
    print(f"auditor {auditor.active or 'none running'}{standbys}")
    return 0


def run_delay(args) -> int:
    if args.seconds < 0:
        raise CommandError(f"the delay must be whole seconds >= 0, got {args.seconds}")
    with zk_session(args.zk) as client:
        UnderReplication(client).set_recovery_delay(args.seconds)
    print(f"lostBookieRecoveryDelay set to {args.seconds:g}s")
    return 0
