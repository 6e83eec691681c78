"""The repair counters (`bookfleet_repair_*`, the process's default Prometheus registry) served over HTTP.

A repair driver lives only as long as its run, so what it counted in its last seconds would never be scraped: a
driver that was scraped during its run (something scrapes it: a PodMonitor) waits for one more scrape after it, at
most `linger` seconds. One never scraped does not wait, so a cluster without Prometheus pays nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIRequestHandler, make_server

import prometheus_client


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Scrapes every few seconds are not news."""


class MetricsServer:
    """/metrics on `address:port` from a daemon thread; counts the scrapes whose answer was sent in full."""

    def __init__(self, port: int, address: str = "0.0.0.0"):
        app = prometheus_client.make_wsgi_app()
        self._answered = threading.Condition()
        self.scrapes = 0

        def counted(environ: dict, start_response: Callable) -> Iterator[bytes]:
            yield from app(environ, start_response)
            with self._answered:
                self.scrapes += 1
                self._answered.notify_all()

        self._server = make_server(address, port, counted, handler_class=_Quiet)
        self.port = self._server.server_port
        threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True).start()

    def linger(self, seconds: float) -> bool:
        """After the run: if anything scraped it, wait for its next scrape (at most `seconds`). True if one came."""
        with self._answered:
            seen = self.scrapes
            return seen > 0 and self._answered.wait_for(lambda: self.scrapes > seen, seconds)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def served(port: int | None, linger_s: float, run: Callable[[], object]) -> object:
    """`run()` with the counters served on `port` (None: not served), lingering after it as `MetricsServer.linger`."""
    if port is None:
        return run()
    server = MetricsServer(port)
    try:
        result = run()
        server.linger(linger_s)
        return result
    finally:
        server.close()
