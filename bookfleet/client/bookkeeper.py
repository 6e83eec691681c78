"""`BookKeeper`: the one entry point to ledgers for the CLI, topics, repair and the operator.

Metadata calls are plain (kazoo is synchronous); calls that talk to bookies are coroutines. Use it as
`async with BookKeeper("127.0.0.1:2181") as bk:` (or await `close()`); sync code wraps one `asyncio.run` around it.
"""

from __future__ import annotations

import asyncio

from kazoo.client import KazooClient

from bookfleet import wire
from bookfleet.client.errors import LedgerHeldError
from bookfleet.client.placement import PlacementPolicy, choose_ensemble
from bookfleet.client.pool import BookiePool
from bookfleet.client.reader import LedgerReader
from bookfleet.client.recovery import recover_ledger
from bookfleet.client.reopen import LedgerReopen
from bookfleet.client.writer import LedgerWriter, WriterSettings
from bookfleet.meta import layout
from bookfleet.meta import zk as zkclient
from bookfleet.meta.lease import WriterLease
from bookfleet.meta.metadata import LedgerMetadata, MetadataStore, new_metadata
from bookfleet.meta.registry import BookieRegistry


class WrongPasswordError(Exception):
    def __init__(self, ledger_id: int):
        super().__init__(f"wrong password for ledger {ledger_id}")
        self.ledger_id = ledger_id


class BookKeeper:
    """Create, open, recover, delete and list ledgers over one ZooKeeper session and a pool of bookie connections."""

    def __init__(self, zk: str | KazooClient, writer_settings: WriterSettings | None = None):
        self._owns_zk = isinstance(zk, str)
        self.zk = zkclient.connect(zk) if isinstance(zk, str) else zk
        layout.initialize(self.zk)
        self.metadata = MetadataStore(self.zk)
        self.registry = BookieRegistry(self.zk)
        self.pool = BookiePool(self.registry)
        self.writer_settings = writer_settings or WriterSettings()

    async def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum: int = 3,
        ack_quorum: int = 2,
        digest_type: wire.DigestType | str = wire.DigestType.CRC32C,
        password: bytes = b"",
        custom: dict[str, str] | None = None,
        placement: PlacementPolicy | str | None = None,
    ) -> LedgerWriter:
        """A new open ledger on a freshly placed ensemble, with its writer connected."""
        if not ensemble_size >= write_quorum >= ack_quorum >= 1:
            raise ValueError(
                f"need ensemble >= write quorum >= ack quorum >= 1, got "
                f"E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}"
            )
        policy = PlacementPolicy(placement or self.writer_settings.placement)
        candidates = await asyncio.to_thread(self.registry.writable)
        ensemble = choose_ensemble(candidates, ensemble_size, write_quorum, policy)
        metadata = new_metadata(ensemble, write_quorum, ack_quorum, digest_type, password, custom)
        ledger_id = await asyncio.to_thread(self.metadata.create, metadata)
        lease = await self._lease(ledger_id)
        writer = LedgerWriter(
            ledger_id, metadata, 0, password, self.metadata, self.pool, self.writer_settings, lease=lease
        )
        return await writer.start()

    async def reopen_ledger(self, ledger_id: int, password: bytes = b"") -> LedgerWriter:
        """A writer that continues an open ledger whose previous writer stopped cleanly (flushed, nothing
        unconfirmed left behind), e.g. one `bookfleet ledger write` after another. One writer per ledger: refused
        with LedgerHeldError while another writer holds the ledger's lease (close or recover it to fence that
        writer). A ledger with entries past its LAC needs `recover_ledger` instead: only recovery may decide about
        those. The lease only keeps live writers apart; what fences an earlier writer, paused or cut off past its
        lease, and what keeps its unacknowledged entries away from this writer's is `LedgerReopen`'s."""
        metadata, _ = self.metadata.read(ledger_id)
        check_password(ledger_id, metadata, password)
        lease = await self._lease(ledger_id)
        try:
            return await LedgerReopen(ledger_id, password, self.metadata, self.pool, self.writer_settings).run(lease)
        except BaseException:
            await asyncio.to_thread(lease.release)
            raise

    async def _lease(self, ledger_id: int) -> WriterLease:
        lease = WriterLease(self.zk, ledger_id)
        if holder := await asyncio.to_thread(lease.acquire):
            raise LedgerHeldError(
                f"ledger {ledger_id} already has a live writer ({holder}); one writer per ledger: stop it, or fence "
                f"it with `bookfleet ledger close`"
            )
        return lease

    async def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = False) -> LedgerReader:
        """A reader of the ledger; with `recovery`, the ledger is fenced, its tail recovered and it is closed first."""
        metadata = self.ledger_metadata(ledger_id)
        check_password(ledger_id, metadata, password)
        if recovery:
            metadata = await recover_ledger(
                ledger_id, password, self.metadata, self.pool, settings=self.writer_settings
            )
        return LedgerReader(ledger_id, metadata, password, self.metadata, self.pool)

    async def recover_ledger(self, ledger_id: int, password: bytes = b"") -> LedgerMetadata:
        """Fence and close the ledger at its last recoverable entry; returns the closed metadata."""
        return (await self.open_ledger(ledger_id, password, recovery=True)).metadata

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        """NoSuchLedgerError("ledger 42 does not exist") for an unknown id."""
        return self.metadata.read(ledger_id)[0]

    def delete_ledger(self, ledger_id: int) -> None:
        """Remove the metadata; bookies drop the entries at their next garbage collection."""
        self.metadata.delete(ledger_id)

    def list_ledgers(self) -> list[int]:
        return self.metadata.ledger_ids()

    async def close(self) -> None:
        await self.pool.close()
        if self._owns_zk:
            self.zk.stop()
            self.zk.close()

    async def __aenter__(self) -> BookKeeper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def check_password(ledger_id: int, metadata: LedgerMetadata, password: bytes) -> None:
    if not metadata.password_matches(password):
        raise WrongPasswordError(ledger_id)
