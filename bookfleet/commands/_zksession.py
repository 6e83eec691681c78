"""The ZooKeeper session every command that reads or changes the fleet opens: one `--zk` argument, one clear line
when ZooKeeper is missing or unreachable. A helper module: command discovery skips names starting with `_`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kazoo.client import KazooClient

from bookfleet.commanderror import CommandError
from bookfleet.commands import _securityflags as security_options
from bookfleet.meta import zk as zkclient
from bookfleet.zkserver import zk_from_env


def add_zk_argument(parser) -> None:
    parser.add_argument("--zk", default=zk_from_env(), help="ZooKeeper connect string (default $BOOKFLEET_ZK)")
    security_options.add_arguments(parser)


@contextmanager
def zk_session(hosts: str | None, talks_to_bookies: bool = False) -> Iterator[KazooClient]:
    """A ZooKeeper session for a command; a missing or unreachable ZooKeeper is one clear line, and so is a missing
    TLS identity when the command talks to bookies that require one."""
    if not hosts:
        raise CommandError("no ZooKeeper given: pass --zk HOST:PORT or set BOOKFLEET_ZK")
    try:
        client = zkclient.connect(hosts)
    except zkclient.ZooKeeperUnreachable as exc:
        raise CommandError(str(exc)) from None
    try:
        if talks_to_bookies and (missing := security_options.missing_tls(client)):
            raise CommandError(missing)
        yield client
    finally:
        client.stop()
        client.close()
