"""The bookie process: identity check, storage, wire server, HTTP probes, registration, read-only switching (disk
monitor and ZooKeeper), GC loop.

Start order makes /readyz honest: storage replays its journal before the port opens, and the bookie registers in
ZooKeeper only once it can serve. Shutdown (SIGTERM/SIGINT) runs the other way: unregister, stop taking requests,
finish in-flight ones, flush and checkpoint storage.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal

from bookfleet import eventloop
from bookfleet.bookie import cookie
from bookfleet.bookie.admission import LedgerAdmission
from bookfleet.bookie.config import BookieConfig
from bookfleet.bookie.diskmonitor import DiskMonitor
from bookfleet.bookie.http import BookieMetrics, HealthServer
from bookfleet.bookie.looplag import LoopLagProbe
from bookfleet.bookie.readonly import ReadOnlyState
from bookfleet.bookie.registration import Registration
from bookfleet.bookie.server import BookieServer
from bookfleet.bookie.storage import LedgerStorage
from bookfleet.bookie.zkgc import LedgerCollector
from bookfleet.meta import zk as zkclient
from bookfleet.meta.registry import BookieRegistry
from bookfleet.security.tls import ReloadingContext, TlsConfigError, https_context, server_context

log = logging.getLogger(__name__)


class StartupError(RuntimeError):
    """The bookie cannot start here (a port is taken, ...); the message says what to fix."""


async def _listen(what: str, start, host: str, port: int) -> None:
    try:
        await start(host, port)
    except OSError as exc:
        raise StartupError(f"cannot listen for {what} on {host}:{port}: {exc.strerror or exc}") from None


def _tls_context(config: BookieConfig, https: bool = False) -> ReloadingContext | None:
    """The bookie protocol's context (mutual TLS), or with `https` the HTTP endpoints' (None unless --http-tls)."""
    if config.tls_dir is None or (https and not config.http_tls):
        return None
    try:
        return https_context(config.tls_dir) if https else server_context(config.tls_dir)
    except TlsConfigError as exc:
        raise StartupError(f"--tls-dir {config.tls_dir}: {exc}") from None


class BookieNode:
    """One bookie's parts, wired together; `run()` serves until a signal or `stop()`."""

    def __init__(self, config: BookieConfig):
        self.config = config
        self.metrics = BookieMetrics()
        self.storage = LedgerStorage(
            config.journal_dir,
            config.ledger_dir,
            config.storage,
            self.metrics.observe_journal_sync,
            self._on_storage_failure,
            self.metrics.observe_flush,
            self.metrics.observe_memtable_wait,
        )
        self.health = HealthServer(self.metrics, self._not_ready)
        self.server: BookieServer | None = None
        self.registration: Registration | None = None
        self.read_only: ReadOnlyState | None = None
        self._storage_started = False
        self._stop = asyncio.Event()

    def _not_ready(self) -> str | None:
        if not self._storage_started:
            return "storage is replaying its journal"
        if self.registration is None or not self.registration.registered:
            return "not registered in ZooKeeper"
        return None

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        config = self.config
        serve_http = functools.partial(self.health.start, tls=_tls_context(config, https=True))
        await _listen("HTTP", serve_http, config.listen_host, config.http_port)
        # kazoo's timeout is the session timeout: how long after a crash the registration disappears.
        zk = await asyncio.to_thread(zkclient.connect, config.zk, config.zk_session_timeout)
        try:
            await asyncio.to_thread(
                cookie.verify_or_create, zk, config.bookie_id, config.journal_dir, config.ledger_dir
            )
            await asyncio.to_thread(BookieRegistry(zk).record_address, config.bookie_id, config.advertised_address)
            await self.storage.start()
            self._storage_started = True
            try:
                await self._serve(zk)
            finally:
                await self.storage.close()
        finally:
            self.health.stop()
            await asyncio.to_thread(zk.stop)
            await asyncio.to_thread(zk.close)

    async def _serve(self, zk) -> None:
        config = self.config
        self.registration = Registration(
            zk, config.bookie_id, config.advertised_address, config.zone, self.health.port, config.tls_dir is not None
        )
        monitor = DiskMonitor(
            config.ledger_dir,
            self.storage.used_bytes,
            self._on_disk_change,
            config.disk_usage_threshold,
            config.disk_usage_lwm,
            config.disk_usage_recovery_limit,
            config.disk_quota,
            config.disk_check_interval,
        )
        self.server = BookieServer(
            self.storage,
            self.metrics,
            monitor.space,
            config.limits,
            tls=_tls_context(config),
            admission=(
                LedgerAdmission(zk, self.storage.has_ledger, config.admission_cache_ledgers, config.bookie_id)
                if config.verify_ledgers
                else None
            ),
            reserve=monitor.take_reserve,
        )
        self.read_only = ReadOnlyState(zk, config.bookie_id, self._on_read_only_change)
        self.read_only.set_storage_failure(self.storage.failure)
        self.read_only.set_journal_damage(self.storage.journal_damage)
        collector = LedgerCollector(self.storage, zk, config.bookie_id, config.gc_interval, config.gc_grace)
        loop_lag = LoopLagProbe(self.metrics.observe_loop_lag)
        await self.read_only.start()  # a forced read-only state holds from the first add and registration on
        await _listen("the bookie protocol", self.server.start, config.listen_host, config.port)
        monitor.start()
        self.registration.start()
        collector.start()
        loop_lag.start()
        eventloop.freeze_start_up_heap()
        log.info(
            "bookie %s serving on %s:%d (advertised %s), http on %d, event loop %s",
            config.bookie_id, config.listen_host, config.port, config.advertised_address, self.health.port,
            eventloop.name(config.loop_choice),
        )
        await self._stop.wait()
        log.info("bookie %s shutting down", config.bookie_id)
        await loop_lag.stop()
        await collector.stop()
        await monitor.stop()
        self.read_only.stop()
        await self.registration.close()
        await self.server.stop()

    def _on_disk_change(self, disk_full: bool, free: int, total: int) -> None:
        self.metrics.used_bytes.set(self.storage.used_bytes())
        if self.registration is not None:
            self.registration.update(free_bytes=free, total_bytes=total)
        if self.read_only is not None:
            self.read_only.set_disk_full(disk_full)

    def _on_storage_failure(self, reason: str) -> None:
        """The journal or the disk failed: read-only at once (adds, GET_BOOKIE_INFO, registration), saying why."""
        if self.read_only is not None:
            self.read_only.set_storage_failure(reason)

    def _on_read_only_change(self, reason: str | None) -> None:
        """The disk monitor, ZooKeeper or a storage failure switched the bookie: adds (recovery adds by the kind of
        read-only), GET_BOOKIE_INFO and registration follow."""
        self.metrics.read_only.set(int(reason is not None))
        if self.server is not None:
            self.server.read_only = reason
            self.server.takes_recovery_adds = self.read_only.takes_recovery_adds()
        if self.registration is not None:
            self.registration.update(read_only=reason is not None)


def run(config: BookieConfig) -> int:
    """Run a bookie in this process until SIGTERM or SIGINT."""

    async def main() -> None:
        bookie = BookieNode(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, bookie.stop)
        await bookie.run()

    with contextlib.suppress(KeyboardInterrupt):
        eventloop.run(main(), config.loop_choice)
    return 0
