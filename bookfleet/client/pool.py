"""`BookiePool`: bookie ids turned into pipelined connections for the writer, the readers, recovery, the auditor's
replica checks and the repair and audit tasks (which get fixed addresses, having no ZooKeeper session)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from bookfleet.client.connection import BookieClient
from bookfleet.meta.registry import BookieRegistry, UnknownBookie


class BookiePool:
    """One shared pipelined connection per bookie id, resolved through the registry (or a fixed id -> HOST:PORT
    map) and reopened after a failure."""

    def __init__(self, registry: BookieRegistry | Mapping[str, str], connect_timeout: float = 5.0):
        self.registry = registry
        self.connect_timeout = connect_timeout
        self._clients: dict[str, BookieClient] = {}
        self._connecting: dict[str, asyncio.Future[BookieClient]] = {}

    def connected(self, bookie_id: str) -> BookieClient | None:
        """The open connection to `bookie_id`, if there is one (the writer's hot path: no await)."""
        client = self._clients.get(bookie_id)
        return client if client is not None and not client.closed else None

    async def get(self, bookie_id: str) -> BookieClient:
        """A connection to `bookie_id`; ConnectionError if it is unregistered or unreachable."""
        if client := self.connected(bookie_id):
            return client
        if (pending := self._connecting.get(bookie_id)) is None:
            pending = asyncio.ensure_future(self._connect(bookie_id))
            self._connecting[bookie_id] = pending
            pending.add_done_callback(lambda _: self._connecting.pop(bookie_id, None))
        return await asyncio.shield(pending)

    async def _connect(self, bookie_id: str) -> BookieClient:
        try:
            if isinstance(self.registry, Mapping):
                address = self.registry.get(bookie_id)
                if address is None:
                    raise UnknownBookie(bookie_id)
            else:
                address = await asyncio.to_thread(self.registry.address, bookie_id)
        except UnknownBookie as exc:
            raise ConnectionError(str(exc)) from None
        client = await BookieClient.connect(address, self.connect_timeout, bookie_id=bookie_id)
        self._clients[bookie_id] = client
        return client

    def drop(self, bookie_id: str, reason: str) -> None:
        """Abort the connection to a bookie that stopped answering (the next `get` connects afresh), releasing
        everything sent to it and still waiting for an answer."""
        client = self._clients.pop(bookie_id, None)
        if client is not None:
            client.abort(reason)

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()
