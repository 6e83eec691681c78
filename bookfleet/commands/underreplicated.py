"""`bookfleet underreplicated list [--json]`: the marked ledgers, as BookKeeper's `listunderreplicated` shows them:
the ledger, the bookies its replicas are missing on, since when, and the repair holding it."""

from __future__ import annotations

import json

from bookfleet.commands._zksession import add_zk_argument, zk_session
from bookfleet.meta.fleetstatus import under_replicated_ledgers


def register(subparsers) -> None:
    parser = subparsers.add_parser("underreplicated", help="ledgers marked under-replicated")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="marked ledgers: missing bookies, since when, which repair holds them")
    add_zk_argument(listing)
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=run_list)


def run_list(args) -> int:
    with zk_session(args.zk) as client:
        ledgers = under_replicated_ledgers(client)
    if args.json:
        print(json.dumps([ledger.model_dump(mode="json") for ledger in ledgers]))
        return 0
    for ledger in ledgers:
        repair = f"\trepairing: {ledger.repair_holder}" if ledger.repair_holder else ""
        print(
            f"{ledger.ledger_id}\tmissing: {', '.join(ledger.missing_bookies)}\t"
            f"since {ledger.since:%Y-%m-%d %H:%M:%S} UTC{repair}"
        )
    return 0
