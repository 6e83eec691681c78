"""The `bookfleet` command. Each module in bookfleet.commands adds its subcommands through `register`."""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from kazoo.exceptions import NoAuthError

from bookfleet import commands
from bookfleet.meta.zk import ZK_AUTH_ENV
from bookfleet.security import options as security_options


class CommandError(Exception):
    """An error to report as one clear line and a non-zero exit."""


EXTRAS = {"pyspark": "spark", "kopf": "operator", "kubernetes": "operator", "yaml": "operator"}
"""Modules the base install lacks -> the extra of pyproject.toml that brings them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bookfleet", description="Bookies, ledgers, topics, auto-recovery and the Kubernetes operator."
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"{commands.__name__}.{module.name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        security_options.apply(args)
        return args.handler(args) or 0
    except KeyboardInterrupt:
        return 130
    except NoAuthError:
        message = f"ZooKeeper refused access: pass the fleet's credential (--zk-auth USER:PASSWORD or ${ZK_AUTH_ENV})"
        print(f"bookfleet {args.command}: {message}", file=sys.stderr)
        return 2
    except (CommandError, TimeoutError, security_options.SecurityFlagError) as exc:
        print(f"bookfleet {args.command}: {exc or 'timed out'}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(f"bookfleet {args.command}: needs the [{extra}] extra ({exc.name} is not installed): "
              f"pip install 'bookfleet[{extra}]'", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
