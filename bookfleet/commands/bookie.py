"""`bookfleet bookie`: run one bookie process."""

from __future__ import annotations

from bookfleet.commanderror import CommandError


def register(subparsers) -> None:
    from bookfleet.bookie import config

    parser = subparsers.add_parser("bookie", help="run a bookie (storage server)")
    config.add_arguments(parser)
    parser.set_defaults(handler=handle, log_level_default="INFO")


def handle(args) -> int:
    from bookfleet.bookie import config, cookie, main
    from bookfleet.eventloop import EventLoopUnavailable
    from bookfleet.meta.layout import LayoutError
    from bookfleet.meta.zk import ZooKeeperUnreachable

    try:
        settings = config.from_args(args)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    try:
        return main.run(settings)
    except (cookie.CookieMismatch, LayoutError, ZooKeeperUnreachable, main.StartupError, EventLoopUnavailable) as exc:
        raise CommandError(str(exc)) from None
