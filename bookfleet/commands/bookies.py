"""`bookfleet bookies list`: the registered bookies, writable and read-only."""

from __future__ import annotations

import json

from bookfleet.client.registry import BookieRegistry
from bookfleet.commands.topic import add_zk_argument, zk_session


def register(subparsers) -> None:
    parser = subparsers.add_parser("bookies", help="inspect the bookie fleet")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="list registered bookies with address, zone, state and free space")
    add_zk_argument(listing)
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=run_list)


def run_list(args) -> int:
    with zk_session(args.zk) as client:
        bookies = BookieRegistry(client).all()
    if args.json:
        print(json.dumps([info.model_dump(mode="json") for info in bookies]))
    else:
        for info in bookies:
            zone = info.zone or "-"
            print(f"{info.bookie_id}\t{info.address}\tzone={zone}\t{info.state}\tfree={info.free_bytes}")
    return 0
