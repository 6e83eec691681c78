"""Connecting to ZooKeeper with kazoo, with one clear error when it cannot be reached."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError


class ZooKeeperUnreachable(RuntimeError):
    pass


def connect(hosts: str, timeout: float = 10.0, **kwargs) -> KazooClient:
    """A started KazooClient for `hosts` (HOST:PORT[,...][/chroot])."""
    client = KazooClient(hosts=hosts, timeout=timeout, **kwargs)
    try:
        client.start(timeout=timeout)
    except KazooTimeoutError:
        client.close()
        raise ZooKeeperUnreachable(f"ZooKeeper at {hosts} is unreachable (no session within {timeout:.0f}s)") from None
    return client


@contextlib.contextmanager
def session(hosts: str, timeout: float = 10.0) -> Iterator[KazooClient]:
    client = connect(hosts, timeout)
    try:
        yield client
    finally:
        client.stop()
        client.close()
