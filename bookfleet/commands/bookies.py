"""`bookfleet bookies list`: the registered bookies, writable and read-only; `bookfleet bookies readonly ID`: force
a bookie read-only (or, with --clear, lift it) through its state node in ZooKeeper."""

from __future__ import annotations

import json

from bookfleet.commanderror import CommandError
from bookfleet.commands._zksession import add_zk_argument, zk_session
from bookfleet.meta import bookiestate, cookies
from bookfleet.meta.registry import BookieRegistry


def register(subparsers) -> None:
    parser = subparsers.add_parser("bookies", help="inspect the bookie fleet")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="list registered bookies with address, zone, state and free space")
    add_zk_argument(listing)
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=run_list)
    readonly = actions.add_parser(
        "readonly",
        help="force a bookie read-only (new adds refused; recovery adds of its own ledgers and reads served) or lift "
        "it with --clear",
    )
    add_zk_argument(readonly)
    readonly.add_argument("bookie_id", metavar="ID", help="the bookie's id")
    readonly.add_argument("--clear", action="store_true", help="lift the forced read-only state")
    readonly.add_argument("--reason", default="set with bookfleet bookies readonly", help="why (shown to writers)")
    readonly.set_defaults(handler=run_readonly)


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


def run_readonly(args) -> int:
    with zk_session(args.zk) as client:
        if args.clear:
            bookiestate.clear(client, args.bookie_id)
            print(f"{args.bookie_id}: no longer forced read-only")
        elif not cookies.exists(client, args.bookie_id):
            raise CommandError(f"no bookie {args.bookie_id}: ZooKeeper has no cookie for it (check the id)")
        else:
            bookiestate.set_read_only(client, args.bookie_id, args.reason)
            print(f"{args.bookie_id}: forced read-only ({args.reason})")
    return 0
