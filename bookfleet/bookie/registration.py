"""The bookie's ephemeral registration: available/<id> while writable, available/readonly/<id> while read-only.

The payload is a meta.registry.BookieInfo's encoding (BookKeeper's BookieServiceInfoFormat), so the writer and the
readers of the registration, Java clients included, share one definition. kazoo runs in its own thread; every
ZooKeeper call happens in a worker thread, and a session loss (the ephemeral nodes die with it) triggers a
re-registration once a new session is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NodeExistsError, NoNodeError

from bookfleet.meta import zkpaths
from bookfleet.meta.registry import BookieInfo, BookieMode

log = logging.getLogger(__name__)


class Registration:
    """Keeps exactly one of the two ephemeral nodes in ZooKeeper, matching the bookie's state."""

    def __init__(
        self, zk: KazooClient, bookie_id: str, address: str, zone: str, http_port: int, tls: bool = False
    ):
        self.zk = zk
        self.tls = tls
        self.bookie_id = bookie_id
        self.address = address
        self.zone = zone
        self.http_port = http_port
        self.read_only = False
        self.free_bytes = 0
        self.total_bytes = 0
        self.registered = False
        self._wanted = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task | None = None
        self._closing = False

    def start(self) -> None:
        self.zk.add_listener(self._on_state)
        self._task = asyncio.create_task(self._keep_registered())
        self.update()

    def update(self, read_only: bool | None = None, free_bytes: int | None = None, total_bytes: int | None = None):
        """Record the bookie's state; the registration follows asynchronously."""
        if read_only is not None:
            self.read_only = read_only
        if free_bytes is not None:
            self.free_bytes = free_bytes
        if total_bytes is not None:
            self.total_bytes = total_bytes
        self._wanted.set()

    async def wait_registered(self, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not self.registered:
                await asyncio.sleep(0.02)

    async def close(self) -> None:
        """Remove both nodes now, so clients and the auditor see the bookie leave without a session timeout."""
        self._closing = True
        self.zk.remove_listener(self._on_state)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._delete_both)
        self.registered = False

    def info_bytes(self) -> bytes:
        return BookieInfo(
            bookie_id=self.bookie_id,
            address=self.address,
            zone=self.zone,
            state=BookieMode.READ_ONLY if self.read_only else BookieMode.WRITABLE,
            free_bytes=self.free_bytes,
            tls=self.tls,
            http_port=self.http_port,
            total_bytes=self.total_bytes,
        ).encode()

    # --- internals ----------------------------------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        """kazoo's thread: a lost session took the ephemeral nodes along; re-register when connected again."""
        if state == KazooState.LOST:
            self.registered = False
        if state in (KazooState.LOST, KazooState.CONNECTED) and not self._closing:
            self._loop.call_soon_threadsafe(self._wanted.set)

    async def _keep_registered(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            try:
                await asyncio.to_thread(self._sync)
                self.registered = True
            except Exception as exc:
                self.registered = False
                log.warning("registering bookie %s in ZooKeeper failed (%s); retrying", self.bookie_id, exc)
                await asyncio.sleep(1.0)
                self._wanted.set()

    def _sync(self) -> None:
        if not self.zk.connected:
            raise ConnectionError("no ZooKeeper session")
        wanted = zkpaths.readonly(self.bookie_id) if self.read_only else zkpaths.available(self.bookie_id)
        other = zkpaths.available(self.bookie_id) if self.read_only else zkpaths.readonly(self.bookie_id)
        if self._move(other, wanted):
            return
        self._put_ephemeral(wanted, self.info_bytes())
        with contextlib.suppress(NoNodeError):
            self.zk.delete(other)

    def _move(self, old: str, new: str) -> bool:
        """Switch our registration between writable and read-only in one transaction, so no reader ever sees the
        bookie under both (placement could pick a read-only bookie) or under neither (it would look lost)."""
        stat = self.zk.exists(old)
        if stat is None or stat.ephemeralOwner != self.zk.client_id[0] or self.zk.exists(new) is not None:
            return False
        self.zk.ensure_path(zkpaths.READONLY)
        transaction = self.zk.transaction()
        transaction.create(new, self.info_bytes(), ephemeral=True)
        transaction.delete(old, version=stat.version)
        return not any(isinstance(result, Exception) for result in transaction.commit())

    def _put_ephemeral(self, path: str, data: bytes) -> None:
        """Create or update our ephemeral node; one held by another session is waited out, never deleted."""
        session_id = self.zk.client_id[0]
        while True:
            try:
                stat = self.zk.exists(path)
                if stat is None:
                    self.zk.create(path, data, ephemeral=True, makepath=True)
                elif stat.ephemeralOwner == 0:  # not a registration at all: nobody's session holds it
                    log.warning("removing %s: a persistent node where a registration belongs", path)
                    self.zk.delete(path, version=stat.version)
                    continue
                elif stat.ephemeralOwner != session_id:
                    self._wait_until_gone(path, stat.ephemeralOwner)
                    continue
                else:
                    self.zk.set(path, data, version=stat.version)
                return
            except (NodeExistsError, NoNodeError):
                continue

    def _wait_until_gone(self, path: str, owner: int) -> None:
        """Another live session holds our node: a crashed run of this bookie whose session has not expired yet, or
        a second process started with the same id. Deleting it could leave two processes registered as one bookie,
        so wait until ZooKeeper removes it when that session expires (as BookKeeper does)."""
        log.warning("%s is held by ZooKeeper session 0x%x; waiting for that session to end", path, owner)
        gone = threading.Event()

        def watch(_event) -> None:
            gone.set()

        while not self._closing and self.zk.exists(path, watch=watch) is not None:
            gone.wait(1.0)  # also wakes now and then to notice a close
            gone.clear()
        if self._closing:
            raise ConnectionError("the bookie is closing")

    def _delete_both(self) -> None:
        for path in (zkpaths.available(self.bookie_id), zkpaths.readonly(self.bookie_id)):
            with contextlib.suppress(NoNodeError):
                stat = self.zk.exists(path)
                if stat is not None and stat.ephemeralOwner == self.zk.client_id[0]:
                    self.zk.delete(path)
