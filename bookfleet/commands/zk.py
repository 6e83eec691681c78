"""`bookfleet zk secure`: give every node under the ledgers root the fleet's ACL, for a fleet whose nodes were
created before it had a ZooKeeper credential (they keep ZooKeeper's open default until then)."""

from __future__ import annotations

import json
import os

from bookfleet.commanderror import CommandError
from bookfleet.commands._zksession import add_zk_argument, zk_session
from bookfleet.meta import zkpaths
from bookfleet.meta.acls import secure_tree
from bookfleet.meta.zk import ZK_AUTH_ENV, fleet_acl


def register(subparsers) -> None:
    parser = subparsers.add_parser("zk", help="ZooKeeper administration: re-apply the fleet's ACL")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    secure = actions.add_parser(
        "secure", help=f"set the fleet credential's ACL on every node under {zkpaths.ROOT} (idempotent)"
    )
    secure.add_argument("--json", action="store_true", help="print the report as JSON")
    add_zk_argument(secure)
    secure.set_defaults(handler=run_secure)


def run_secure(args) -> int:
    auth = os.environ.get(ZK_AUTH_ENV)  # --zk-auth lands here too
    if not auth:
        raise CommandError(f"needs the fleet's credential the ACL names: --zk-auth USER:PASSWORD or ${ZK_AUTH_ENV}")
    try:
        acl = fleet_acl(auth)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    with zk_session(args.zk) as client:
        report = secure_tree(client, acl)
    if args.json:
        print(json.dumps({"nodes": report.nodes, "changed": report.changed, "refused": report.refused}))
    else:
        print(f"{zkpaths.ROOT}: {report.nodes} node(s), {len(report.changed)} given the fleet's ACL")
    if report.refused:
        shown = ", ".join(report.refused[:5]) + (" ..." if len(report.refused) > 5 else "")
        raise CommandError(f"{len(report.refused)} node(s) whose ACL this credential may not change: {shown}")
    return 0
