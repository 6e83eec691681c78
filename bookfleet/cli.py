"""The `bookfleet` command. Each module in bookfleet.commands adds its subcommands through `register`.

Exit codes: 0 done; 1 an unexpected failure (one line; `--log-level DEBUG` adds the traceback); 2 a user error
(one line naming what was wrong) or a bad flag; 130 interrupted with Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from kazoo.exceptions import NoAuthError

from bookfleet import commands
from bookfleet.commanderror import CommandError
from bookfleet.commands import _securityflags as security_options
from bookfleet.meta.zk import ZK_AUTH_ENV

log = logging.getLogger(__name__)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DEFAULT_LOG_LEVEL = "WARNING"
"""What a command logs unless it says otherwise (`parser.set_defaults(log_level_default="INFO")` for services):
a command's output is its printed lines, not the libraries' chatter."""
LIBRARY_LOGGERS = ("kazoo",)
"""Loggers that talk on every connect, retry and close: unless a level is asked for explicitly they log one level
above the command's own (a command reports an unreachable ZooKeeper in its one error line; a service still logs
kazoo's warnings)."""

EXIT_UNEXPECTED = 1
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


EXTRAS = {"pyspark": "spark", "kopf": "operator", "kubernetes": "operator", "yaml": "operator"}
"""Modules the base install lacks -> the extra of pyproject.toml that brings them."""


COMPLETION_SHELLS = ("bash", "zsh", "tcsh", "fish", "powershell")
"""The shells shtab writes completion scripts for."""


class _Version(argparse._VersionAction):
    """argparse's --version, the installed version looked up only when asked: importlib.metadata and the lookup
    are a few hundredths of a second of every command's start, every bookie's among them."""

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import version

        self.version = f"%(prog)s {version('bookfleet')}"
        super().__call__(parser, namespace, values, option_string)


class _PrintCompletion(argparse.Action):
    """shtab's --print-completion, shtab imported only when asked for (for the same reason as `_Version`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        import shtab

        print(shtab.complete(parser, values))
        parser.exit(0)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `command` (the first word of one) only the module of that name registers when
    there is one (`status` or `delete-cluster`, not `operator`), so a command starts without importing all the
    others: aiohttp, the bookie, Spark's jobs, half a second of `bookfleet status`. Any other word, or none, gets
    every command, for help, completion and argparse's own errors."""
    parser = argparse.ArgumentParser(
        prog="bookfleet", description="Bookies, ledgers, topics, auto-recovery and the Kubernetes operator."
    )
    parser.add_argument("--version", action=_Version)
    parser.add_argument(
        "--print-completion", action=_PrintCompletion, choices=COMPLETION_SHELLS,
        help="print a bash, zsh or tcsh completion script",
    )
    parser.add_argument(
        "--log-level", type=str.upper, choices=LOG_LEVELS,
        help=f"logging level (default {DEFAULT_LOG_LEVEL}; INFO for the long-running bookie, auditor, operator, "
        "standalone)",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more: -v INFO, -vv DEBUG")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    names = sorted(module.name for module in pkgutil.iter_modules(commands.__path__)
                   if not module.name.startswith("_"))  # helper modules, not commands
    named = (command or "").replace("-", "_")
    for name in [named] if named in names else names:
        importlib.import_module(f"{commands.__name__}.{name}").register(subparsers)
    return parser


def first_word(argv: list[str]) -> str | None:
    """The first argument that is neither an option nor `--log-level`'s value: the command (`--log-level INFO
    bookie`, as a fleet starts its bookies, registers the bookie alone). Another option's value first
    (`--print-completion bash`) only makes build_parser register every command."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def configure_logging(args: argparse.Namespace) -> None:
    """--log-level or -v when given; else the command's own default (WARNING unless it is a service)."""
    explicit = args.log_level or {0: None, 1: "INFO"}.get(args.verbose, "DEBUG")
    level = explicit or getattr(args, "log_level_default", DEFAULT_LOG_LEVEL)
    logging.basicConfig(level=level, format=LOG_FORMAT)
    if explicit is None:
        for name in LIBRARY_LOGGERS:
            logging.getLogger(name).setLevel(logging.getLevelName(level) + 10)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(first_word(argv)).parse_args(argv)
    configure_logging(args)
    try:
        security_options.apply(args)
        return args.handler(args) or 0
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except NoAuthError:
        message = f"ZooKeeper refused access: pass the fleet's credential (--zk-auth USER:PASSWORD or ${ZK_AUTH_ENV})"
        print(f"bookfleet {args.command}: {message}", file=sys.stderr)
        return EXIT_USER_ERROR
    except (CommandError, TimeoutError, security_options.SecurityFlagError) as exc:
        print(f"bookfleet {args.command}: {exc or 'timed out'}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as exc:
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if extra := EXTRAS.get((missing or "").split(".")[0]):
            print(f"bookfleet {args.command}: needs the [{extra}] extra ({missing} is not installed): "
                  f"pip install 'bookfleet[{extra}]'", file=sys.stderr)
            return EXIT_USER_ERROR
        log.debug("bookfleet %s failed", args.command, exc_info=True)
        print(
            f"bookfleet {args.command}: unexpected {type(exc).__name__}: {exc} (--log-level DEBUG shows where)",
            file=sys.stderr,
        )
        return EXIT_UNEXPECTED


if __name__ == "__main__":
    sys.exit(main())
