"""The bookie's HTTP side on the same event loop: `/healthz`, `/readyz` for Kubernetes probes, `/metrics`.

Plain HTTP unless asked (`--http-tls`): then HTTPS with the bookie's own certificate, reloaded when its files change
like the bookie protocol's; no client certificate is asked for, since probes and scrapers carry none.

Three GETs need no web framework: HTTP/1.1 on asyncio's streams, one request per connection (`Connection: close`).
aiohttp's import (its client and the CA store its connector loads, with its server) was a fifth of a second of CPU
in every bookie's start, which a test run pays hundreds of times and a pod on every restart.
"""

from __future__ import annotations

import asyncio
import bisect
import http
import itertools
import logging
import ssl
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from bookfleet.bkprotocol import OperationType as Op
from bookfleet.security.tls import ReloadingContext
from bookfleet.wire import Status

LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _op_name(op: int) -> str:
    return Op(op).name if op in Op._value2member_map_ else f"op_{op}"


class _Latency:
    """A latency histogram as a plain bucket array and sum, turned into a metric family only when scraped."""

    def __init__(self) -> None:
        self.sum = 0.0
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)

    def observe(self, seconds: float) -> None:
        self.sum += seconds
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1

    def observe_since(self, now: float, received: list[tuple[float, int]]) -> None:
        """`count` latencies of `now` minus `start` for each (start, count) in `received`."""
        counts, buckets, bisect_left = self.counts, LATENCY_BUCKETS, bisect.bisect_left
        for start, count in received:
            counts[bisect_left(buckets, now - start)] += count
            self.sum += (now - start) * count

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        cumulative = list(itertools.accumulate(self.counts))
        bounds = [str(bound) for bound in LATENCY_BUCKETS] + ["+Inf"]
        return HistogramMetricFamily(
            name, documentation, buckets=list(zip(bounds, cumulative, strict=True)), sum_value=self.sum
        )


class _HotPathCollector:
    """Adds, journal syncs and the event loop's lag are counted in plain numbers and turned into metrics only when
    scraped: an add pays one bisect and a few additions instead of four locked prometheus-client updates."""

    def __init__(self) -> None:
        self.adds = 0
        self.bytes_written = 0
        self.add_latency = _Latency()
        self.journal_bytes = 0
        self.journal_sync = _Latency()
        self.loop_lag = _Latency()
        self.flush = _Latency()
        self.memtable_wait = _Latency()

    def collect(self):
        yield CounterMetricFamily("bookie_add_entries", "Entries added and acknowledged", value=self.adds)
        yield CounterMetricFamily("bookie_written_bytes", "Entry bytes added", value=self.bytes_written)
        yield self.add_latency.family("bookie_add_latency_seconds", "ADD_ENTRY from receipt to durable")
        yield CounterMetricFamily(
            "bookie_journal_synced_bytes", "Journal bytes written and fdatasynced", value=self.journal_bytes
        )
        yield self.journal_sync.family(
            "bookie_journal_sync_latency_seconds", "One journal group commit: write and fdatasync"
        )
        yield self.loop_lag.family(
            "bookie_event_loop_lag_seconds", "How late the event loop ran a timer due every 10 ms"
        )
        yield self.flush.family("bookie_flush_seconds", "One memtable flush: entry log, its sync, index, checkpoint")
        yield self.memtable_wait.family(
            "bookie_memtable_wait_seconds", "Adds held by a full memtable: their wait for the flush under way"
        )


class BookieMetrics:
    """The bookie's Prometheus metrics, in a registry of its own (several bookies may share a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._hot_path = _HotPathCollector()
        self.registry.register(self._hot_path)
        self.reads = Counter("bookie_read_entries", "Entries read", registry=self.registry)
        self.errors = Counter(
            "bookie_request_errors", "Requests answered with an error", ["op", "status"], registry=self.registry
        )
        self.bytes_read = Counter("bookie_read_bytes", "Entry bytes read", registry=self.registry)
        self.read_only = Gauge("bookie_read_only", "1 while the bookie is read-only", registry=self.registry)
        self.connections = Gauge("bookie_connections", "Open client connections", registry=self.registry)
        self.refused_connections = Counter(
            "bookie_refused_connections", "Connections refused at the connection limit", registry=self.registry
        )
        self.long_polls = Gauge("bookie_long_polls", "READ_LAC long polls waiting", registry=self.registry)
        self.used_bytes = Gauge("bookie_used_bytes", "Bytes used by ledger storage", registry=self.registry)

    def observe_adds(self, size: int, now: float, received: list[tuple[float, int]]) -> None:
        """Adds acknowledged together at `now` (perf_counter): `size` entry bytes in all, received as (when, how
        many): the adds of one read share its time."""
        hot_path = self._hot_path
        hot_path.adds += sum(count for _, count in received)
        hot_path.bytes_written += size
        hot_path.add_latency.observe_since(now, received)

    def observe_journal_sync(self, size: int, seconds: float) -> None:
        """The journal's `on_sync`: one group commit of `size` bytes took `seconds` to write and fdatasync."""
        hot_path = self._hot_path
        hot_path.journal_bytes += size
        hot_path.journal_sync.observe(seconds)

    def observe_loop_lag(self, seconds: float) -> None:
        self._hot_path.loop_lag.observe(seconds)

    def observe_flush(self, seconds: float) -> None:
        self._hot_path.flush.observe(seconds)

    def observe_memtable_wait(self, seconds: float) -> None:
        self._hot_path.memtable_wait.observe(seconds)

    def observe_read(self, size: int, count: int = 1) -> None:
        self.reads.inc(count)
        self.bytes_read.inc(size)

    def count_error(self, op: int, status: Status) -> None:
        self.errors.labels(_op_name(op), status.name).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


EXCHANGE_TIMEOUT = 5.0
"""How long one connection may take to send its request and take the answer before it is closed."""
TEXT = "text/plain; charset=utf-8"

log = logging.getLogger(__name__)


class HealthServer:
    """healthz says the process answers; readyz asks `ready()` (storage started and registered); metrics scrapes.
    GET or HEAD; any other path is 404, any other method 405."""

    def __init__(self, metrics: BookieMetrics, ready: Callable[[], str | None]):
        self.metrics = metrics
        self.ready = ready
        self._routes = {b"/healthz": self._healthz, b"/readyz": self._readyz, b"/metrics": self._metrics}
        self._server: asyncio.Server | None = None
        self._tls: ReloadingContext | None = None
        self.port = 0

    async def start(self, host: str, port: int, tls: ReloadingContext | None = None) -> None:
        """Serve on `host:port`; HTTPS with `tls`, whose files are looked at again on every request so the next
        connections present a rotated certificate."""
        self._tls = tls
        self._server = await asyncio.start_server(
            self._serve, host, port, reuse_address=True, ssl=tls.context if tls is not None else None
        )
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Close the listening socket. An exchange still under way is not waited for (Python 3.12's wait_closed
        would wait for it): it ends with its timeout or the event loop."""
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(self._exchange(reader, writer), EXCHANGE_TIMEOUT)
        except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the peer went away, was too slow, or sent headers past the stream's limit
        finally:
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, _, rest = head.partition(b" ")
        status, content_type, body = self._answer(method, rest.partition(b" ")[0].partition(b"?")[0])
        writer.write(
            f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + (body if method != b"HEAD" else b"")
        )
        await writer.drain()

    def _answer(self, method: bytes, path: bytes) -> tuple[http.HTTPStatus, str, bytes]:
        route = self._routes.get(path)
        if route is None:
            return http.HTTPStatus.NOT_FOUND, TEXT, b"not found\n"
        if method not in (b"GET", b"HEAD"):
            return http.HTTPStatus.METHOD_NOT_ALLOWED, TEXT, b"GET or HEAD\n"
        if self._tls is not None:
            self._tls.refresh()
        try:
            return route()
        except Exception:
            log.exception("HTTP %s failed", path.decode(errors="replace"))
            return http.HTTPStatus.INTERNAL_SERVER_ERROR, TEXT, b"internal error\n"

    def _healthz(self) -> tuple[http.HTTPStatus, str, bytes]:
        return http.HTTPStatus.OK, TEXT, b"ok\n"

    def _readyz(self) -> tuple[http.HTTPStatus, str, bytes]:
        not_ready = self.ready()
        if not_ready:
            return http.HTTPStatus.SERVICE_UNAVAILABLE, TEXT, f"not ready: {not_ready}\n".encode()
        return http.HTTPStatus.OK, TEXT, b"ready\n"

    def _metrics(self) -> tuple[http.HTTPStatus, str, bytes]:
        return http.HTTPStatus.OK, CONTENT_TYPE_LATEST, self.metrics.exposition()
