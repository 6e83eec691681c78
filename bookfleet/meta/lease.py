"""Writer leases: at most one live writer per open ledger.

A writer holds the ephemeral node /ledgers/writers/<ledgerId> in its ZooKeeper session; another writer is refused
while it exists. The node goes away when the writer closes or detaches, or with its session when the writer dies.
A writer whose node disappears under it (its session expired) must stop at once: another writer may own the ledger
by then. Taking a ledger away from a live writer is recovery's job (`bookfleet ledger close` / `recover` fence it).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from bookfleet.meta import zkpaths

log = logging.getLogger(__name__)


class WriterLease:
    """The lease on one ledger, for one writer in this process's ZooKeeper session."""

    def __init__(self, zk: KazooClient, ledger_id: int):
        self.zk = zk
        self.ledger_id = ledger_id
        self.path = zkpaths.ledger_writer(ledger_id)
        self._released = False

    def acquire(self) -> str | None:
        """Take the lease; None when taken, else who holds it ("host h, pid p")."""
        holder = {"host": socket.gethostname(), "pid": os.getpid()}
        try:
            self.zk.create(self.path, json.dumps(holder).encode(), ephemeral=True, makepath=True)
            return None
        except NodeExistsError:
            try:
                data, _ = self.zk.get(self.path)
            except NoNodeError:
                return self.acquire()  # released between our create and get
            try:
                other = json.loads(data)
                return f"host {other['host']}, pid {other['pid']}"
            except (ValueError, KeyError, TypeError):
                return "unknown holder"

    def watch(self, on_lost: Callable[[], None]) -> None:
        """Call `on_lost` (from a kazoo thread) if the node vanishes before `release()`."""

        def changed(data: bytes | None, stat: object) -> bool:
            if self._released:
                return False
            if stat is None:
                on_lost()
                return False
            return True

        self.zk.DataWatch(self.path, changed)

    def release(self) -> None:
        """Drop the lease if this session still holds it (if ZooKeeper cannot be reached, it goes with the
        session)."""
        if self._released:
            return
        self._released = True
        try:
            _, stat = self.zk.get(self.path)
            if stat.ephemeralOwner == self.zk.client_id[0]:
                self.zk.delete(self.path, version=stat.version)
        except NoNodeError:
            pass
        except KazooException as exc:
            log.warning("ledger %d: writer lease not released, it ends with the session: %r", self.ledger_id, exc)
