"""The bookie's HTTP side (`bookfleet.bookie.http.HealthServer`), in process: what a probe, a scraper or a stray
request gets back over HTTP and HTTPS. The fleet tests ask a running bookie's endpoints the way urllib does."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST

from bookfleet.bookie.http import BookieMetrics, HealthServer
from bookfleet.security.certs import CertificateAuthority, write_tls_dir
from bookfleet.security.roles import Role
from bookfleet.security.tls import CA_FILE, https_context


async def exchange(port: int, request: bytes, tls: ssl.SSLContext | None = None) -> tuple[bytes, dict, bytes, dict]:
    """Send one raw request; read until the server closes the connection: (status line, headers, body, peer cert)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    peer = writer.get_extra_info("peercert") or {}
    writer.write(request)
    answer = await asyncio.wait_for(reader.read(), 10)  # EOF: one request per connection
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = dict(line.decode().split(": ", 1) for line in lines)
    return status, headers, body, peer


def get(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: bookie\r\nConnection: keep-alive\r\n\r\n".encode()


async def test_probes_and_scrapes_are_answered_and_each_connection_closed_after_its_answer():
    not_ready = ["storage is replaying its journal"]
    metrics = BookieMetrics()
    metrics.observe_read(5)
    server = HealthServer(metrics, lambda: not_ready[0])
    await server.start("127.0.0.1", 0)
    try:
        assert await exchange(server.port, get("/healthz")) == (
            b"HTTP/1.1 200 OK",
            {"Content-Type": "text/plain; charset=utf-8", "Content-Length": "3", "Connection": "close"},
            b"ok\n",
            {},
        )
        status, _, body, _ = await exchange(server.port, get("/readyz"))
        assert (status, body) == (b"HTTP/1.1 503 Service Unavailable", b"not ready: storage is replaying its journal\n")
        not_ready[0] = None
        status, _, body, _ = await exchange(server.port, get("/readyz"))
        assert (status, body) == (b"HTTP/1.1 200 OK", b"ready\n")

        status, headers, body, _ = await exchange(server.port, get("/metrics?name[]=bookie_read_entries_total"))
        assert status == b"HTTP/1.1 200 OK" and headers["Content-Type"] == CONTENT_TYPE_LATEST
        assert b"bookie_read_entries_total 1.0" in body and int(headers["Content-Length"]) == len(body)
        status, headers, body, _ = await exchange(server.port, get("/metrics", "HEAD"))
        assert (status, body) == (b"HTTP/1.1 200 OK", b"") and int(headers["Content-Length"]) > 0

        assert (await exchange(server.port, get("/nope")))[0] == b"HTTP/1.1 404 Not Found"
        assert (await exchange(server.port, get("/metrics", "POST")))[0] == b"HTTP/1.1 405 Method Not Allowed"
        assert (await exchange(server.port, b"GARBAGE\r\n\r\n"))[0] == b"HTTP/1.1 404 Not Found"
    finally:
        server.stop()


async def test_https_presents_a_rotated_certificate_from_the_connection_after_the_request_that_saw_it(
    tmp_path: Path,
):
    """The files are looked at on every request: the one after a rotation still came in on the old certificate,
    the next connection is handed the new one."""
    ca = CertificateAuthority.create()
    tls_dir = tmp_path / "tls"
    write_tls_dir(tls_dir, ca.issue("bookie-1", [Role.BOOKIE], ["127.0.0.1"]))
    server = HealthServer(BookieMetrics(), lambda: None)
    await server.start("127.0.0.1", 0, tls=https_context(tls_dir))
    prober = ssl.create_default_context(cafile=tls_dir / CA_FILE)  # no client certificate, as a kubelet has none
    try:
        status, _, body, first = await exchange(server.port, get("/healthz"), prober)
        assert (status, body) == (b"HTTP/1.1 200 OK", b"ok\n")
        write_tls_dir(tls_dir, ca.issue("bookie-1", [Role.BOOKIE], ["127.0.0.1"]))
        assert (await exchange(server.port, get("/healthz"), prober))[3] == first
        rotated = (await exchange(server.port, get("/readyz"), prober))[3]
        assert rotated["serialNumber"] != first["serialNumber"]
    finally:
        server.stop()
