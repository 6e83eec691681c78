"""Connecting to ZooKeeper with kazoo, with one clear error when it cannot be reached.

With a credential (`user:password`, from the caller or `$BOOKFLEET_ZK_AUTH`) the session authenticates with
ZooKeeper's digest scheme and every node it creates carries an ACL that gives that identity, and nobody else, any
access: the fleet's metadata, registrations, cookies, markers and switches are readable and writable only with the
fleet's credential.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import make_digest_acl

ZK_AUTH_ENV = "BOOKFLEET_ZK_AUTH"


class ZooKeeperUnreachable(RuntimeError):
    pass


def security_options(auth: str | None) -> dict:
    """KazooClient options for a `user:password` digest credential (none: an open, unauthenticated session)."""
    if not auth:
        return {}
    user, sep, password = auth.partition(":")
    if not sep or not user or not password:
        raise ValueError(f"ZooKeeper credential must be USER:PASSWORD (from --zk-auth or ${ZK_AUTH_ENV})")
    return {"auth_data": [("digest", auth)], "default_acl": [make_digest_acl(user, password, all=True)]}


def connect(hosts: str, timeout: float = 10.0, auth: str | None = None, **kwargs) -> KazooClient:
    """A started KazooClient for `hosts` (HOST:PORT[,...][/chroot]), authenticated with `auth` or, when not given,
    with `$BOOKFLEET_ZK_AUTH` if set."""
    options = security_options(auth or os.environ.get(ZK_AUTH_ENV))
    client = KazooClient(hosts=hosts, timeout=timeout, **options, **kwargs)
    try:
        client.start(timeout=timeout)
    except KazooTimeoutError:
        client.close()
        raise ZooKeeperUnreachable(f"ZooKeeper at {hosts} is unreachable (no session within {timeout:.0f}s)") from None
    return client


@contextlib.contextmanager
def session(hosts: str, timeout: float = 10.0, auth: str | None = None) -> Iterator[KazooClient]:
    client = connect(hosts, timeout, auth)
    try:
        yield client
    finally:
        client.stop()
        client.close()
