"""The bookie's own accept loop: each accepted socket is told TLS or plain before any asyncio transport exists.

A TLS bookie serves two kinds of client on its one port: bookfleet's, which speak TLS from the first byte, and Apache
BookKeeper's, which open in plain and ask V3 START_TLS (bookie/bkprocessors.py answers it, then the connection
upgrades). The first byte tells them apart: a TLS record starts with 0x16, a handshake, and no frame's length prefix
can (frames are far smaller than 0x16000000 bytes). The byte is peeked on the accepted socket itself, before asyncio
makes a transport of it: a transport may read before it is paused (Debian 12's Python 3.11.2 reads even when paused
in connection_made), and then a TLS client's ClientHello went to the plain protocol and its handshake never started.
Only then is the socket handed to the loop, with the TLS context or without.

Each socket waits for its first byte on its own, so a client that connects and sends nothing holds up no other; it is
dropped after TLS_HANDSHAKE_TIMEOUT, and until then it counts, as every socket does from its accept on, toward the
server's `max_connections`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable

from bookfleet.bookie.serving import TLS_HANDSHAKE_TIMEOUT, Server
from bookfleet.wire import Status

log = logging.getLogger(__name__)

TLS_HANDSHAKE_RECORD = 0x16
"""The first byte of a TLS ClientHello."""
LISTEN_BACKLOG = 100
"""Connections the kernel holds for the accept loop (asyncio's create_server default)."""
ACCEPT_RETRY_DELAY = 1.0
"""Seconds the accept loop waits after accept() failed (out of file descriptors), as asyncio's own server does."""


async def _first_byte(sock: socket.socket) -> int:
    """The first byte the peer sent, left in the socket for whoever reads it next."""
    loop = asyncio.get_running_loop()
    readable = loop.create_future()
    loop.add_reader(sock.fileno(), lambda: readable.done() or readable.set_result(None))
    try:
        await readable
    finally:
        loop.remove_reader(sock.fileno())
    first = sock.recv(1, socket.MSG_PEEK)
    if not first:
        raise ConnectionResetError("closed before its first byte")
    return first[0]


class Acceptor:
    """Listens on `host:port` for `server` and gives each admitted socket to `make_connection`'s protocol: over TLS
    when the server serves TLS and the socket's first byte opens a handshake, else in plain."""

    def __init__(self, server: Server, make_connection: Callable[[], asyncio.Protocol]):
        self._server = server
        self._make_connection = make_connection
        self._listeners: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []
        self._opening: set[asyncio.Task[None]] = set()
        """Sockets accepted but not yet a connection: waiting for their first byte, or in their TLS handshake."""

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        addresses = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        try:
            for family, _, _, _, address in addresses:
                listener = socket.create_server(address[:2], family=family, backlog=LISTEN_BACKLOG)
                listener.setblocking(False)
                self._listeners.append(listener)
        except OSError:
            self.close()
            raise
        self._accepting = [loop.create_task(self._accept(listener)) for listener in self._listeners]

    def close(self) -> None:
        """Stop accepting; sockets not yet connections are dropped."""
        for task in (*self._accepting, *self._opening):
            task.cancel()
        for listener in self._listeners:
            listener.close()

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(listener)
            except OSError as exc:
                log.error("accepting a connection failed: %s", exc)
                await asyncio.sleep(ACCEPT_RETRY_DELAY)
                continue
            peer = f"{address[0]}:{address[1]}"
            if not self._admits(peer):
                sock.close()
                continue
            opening = loop.create_task(self._open(sock, peer))
            self._opening.add(opening)
            opening.add_done_callback(self._opening.discard)

    def _admits(self, peer: str) -> bool:
        """Whether one more socket fits `max_connections` (connections and sockets still opening alike)."""
        server = self._server
        if len(server.connections) + len(self._opening) < server.limits.max_connections:
            return True
        server.refused_connections += 1
        server.metrics.refused_connections.inc()
        if server.refused_connections & (server.refused_connections - 1) == 0:  # 1st, 2nd, 4th, 8th...
            log.warning(
                "refused a connection from %s: %d connections is the limit (%d refused so far)",
                peer, server.limits.max_connections, server.refused_connections,
            )
        return False

    async def _open(self, sock: socket.socket, peer: str) -> None:
        server = self._server
        tls: ssl.SSLContext | None = None
        try:
            if server.tls is not None:
                async with asyncio.timeout(TLS_HANDSHAKE_TIMEOUT):
                    first = await _first_byte(sock)
                if first == TLS_HANDSHAKE_RECORD:
                    tls = server.tls_context()
        except (OSError, TimeoutError) as exc:
            why = str(exc) or f"nothing sent in {TLS_HANDSHAKE_TIMEOUT:.0f} s"
            log.info("dropped connection from %s: %s", peer, why)
            sock.close()
            return
        except asyncio.CancelledError:  # the server stops
            sock.close()
            raise
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                self._make_connection, sock, ssl=tls, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT if tls else None
            )
        except (OSError, TimeoutError) as exc:
            sock.close()
            if tls is None:
                log.info("dropped connection from %s: %s", peer, exc)
                return
            log.warning("refused connection from %s: TLS handshake failed: %s", peer, exc)
            server.metrics.count_error(0, Status.UNAUTHORIZED)
