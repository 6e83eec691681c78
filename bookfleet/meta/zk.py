"""Connecting to ZooKeeper with kazoo, with one clear error when it cannot be reached.

With a credential (`user:password`, from the caller or `$BOOKFLEET_ZK_AUTH`) the session authenticates with
ZooKeeper's digest scheme and every node it creates carries an ACL that gives that identity, and nobody else, any
access: the fleet's metadata, registrations, cookies, markers and switches are readable and writable only with the
fleet's credential.

With a TLS directory (`ca.pem`, `cert.pem`, `key.pem`, or a mounted Secret's `ca.crt`, `tls.crt`, `tls.key`; from
the caller or `$BOOKFLEET_ZK_TLS_DIR`) the session speaks TLS to a ZooKeeper `secureClientPort`: it verifies the
server's certificate against that CA and the host it dialled, and presents its own certificate, since a secure
ZooKeeper requires one (`ssl.clientAuth=need`). It is a setting of its own, not `$BOOKFLEET_TLS_DIR`: a fleet may
serve TLS on its bookies behind a plain ZooKeeper, and TLS to ZooKeeper needs the port that serves it. Any
certificate of the CA ZooKeeper trusts will do, so both variables may name the same directory.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import EXCEPTIONS, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import (
    GetChildren,
    GetData,
    MultiHeader,
    Transaction,
    int_struct,
    read_buffer,
    read_string,
    stat_struct,
)
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry
from kazoo.security import ACL, make_digest_acl

from bookfleet.security.tls import TlsConfigError, tls_files

ZK_AUTH_ENV = "BOOKFLEET_ZK_AUTH"
ZK_TLS_DIR_ENV = "BOOKFLEET_ZK_TLS_DIR"
NO_AUTH = ""
"""`auth=NO_AUTH`: an open session whatever `$BOOKFLEET_ZK_AUTH` says (a process serving several fleets, each with
its own credential or none, never falls back on one of its own)."""
NO_TLS = ""
"""`tls_dir=NO_TLS`: plain TCP whatever `$BOOKFLEET_ZK_TLS_DIR` says (the same, for TLS to ZooKeeper)."""


PIPELINE_WINDOW = 500
"""Asynchronous ZooKeeper calls one pipeline keeps in flight. A few hundred hide the round trips; tens of thousands
queue the client's heartbeat behind them, and past the server's outstanding-request limit it stops reading the
connection: a repair driver (4 s session) that locked and read 46,000 markers in one pipeline lost its session."""

T = TypeVar("T")


def pipelined(items: Iterable[T], call: Callable[[T], Any], window: int | None = None) -> Iterator[tuple[T, Any]]:
    """(item, call(item)) for every item in order, where `call` starts an asynchronous ZooKeeper call (`get_async`,
    `create_async`, ...): each call is made at most `window` (default PIPELINE_WINDOW) pairs ahead of the one the
    caller is taking, so a caller that waits for each answer before the next pair has at most that many in flight."""
    window = window or PIPELINE_WINDOW
    ahead: collections.deque[tuple[T, Any]] = collections.deque()
    for item in items:
        ahead.append((item, call(item)))
        if len(ahead) >= window:
            yield ahead.popleft()
    while ahead:
        yield ahead.popleft()


MULTI_READ_BATCH = 250
"""Reads one multiRead request carries: a quarter of a megabyte of ledger metadata, well below the 1 MiB a
ZooKeeper client accepts in one reply."""
MULTI_READ_WINDOW = 4
"""multiRead requests in flight at once: enough to keep the server busy while one reply is parsed."""


class MultiRead(Transaction):
    """ZooKeeper's multiRead request (3.6 and later; kazoo has no call for it): getData and getChildren operations,
    each answered or failed on its own, serialized as a transaction's are. Its reply holds (data, stat) for a
    getData, the names for a getChildren, and the exception for an operation that failed."""

    type = 22

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list:
        results: list = []
        header, offset = MultiHeader.deserialize(data, offset)
        while not header.done:
            if header.type == GetData.type:
                value, offset = read_buffer(data, offset)
                results.append((value, ZnodeStat._make(stat_struct.unpack_from(data, offset))))
                offset += stat_struct.size
            elif header.type == GetChildren.type:
                count, offset = int_struct.unpack_from(data, offset)[0], offset + int_struct.size
                names = []
                for _ in range(max(count, 0)):
                    name, offset = read_string(data, offset)
                    names.append(name)
                results.append(names)
            else:
                results.append(EXCEPTIONS[int_struct.unpack_from(data, offset)[0]]())
                offset += int_struct.size
            header, offset = MultiHeader.deserialize(data, offset)
        return results


def put(zk: KazooClient, path: str, data: bytes) -> None:
    """Set a node's data whatever its version, creating it if it is not there: the last writer wins (BookKeeper's
    setters of the delay and the check times do the same)."""
    try:
        zk.set(path, data)
    except NoNodeError:
        try:
            zk.create(path, data, makepath=True)
        except NodeExistsError:
            zk.set(path, data)


def read_many(
    zk: KazooClient, items: Iterable[T], path_of: Callable[[T], str], children: bool = False
) -> Iterator[tuple[T, Any]]:
    """(item, answer) for every item in order: the (data, stat) of the node at path_of(item), or with `children` the
    names of its children; None where there is no such node. MULTI_READ_BATCH reads travel in one multiRead request,
    a few requests in flight: a pipeline of single gets pays kazoo's wake-up of its I/O thread per get (~150 µs, most
    of `bookfleet status` at 1,000 bookies and of the auditor's read of 100,000 ledgers' metadata)."""
    operation = GetChildren if children else GetData

    def send(batch: list[T]) -> Any:
        answer = zk.handler.async_result()
        zk._call(MultiRead([operation(zk.chroot + path_of(item), None) for item in batch]), answer)
        return answer
    remaining = iter(items)
    batches = iter(lambda: list(itertools.islice(remaining, MULTI_READ_BATCH)), [])
    for batch, answer in pipelined(batches, send, MULTI_READ_WINDOW):
        for item, result in zip(batch, answer.get(), strict=True):
            if isinstance(result, NoNodeError):
                yield item, None
            elif isinstance(result, Exception):
                raise result
            else:
                yield item, result


RECONNECT_MAX_DELAY = 1.0
"""Seconds at most between two attempts to reach ZooKeeper again (never more than a quarter of the session). kazoo's
default backoff doubles without a useful bound, so after a ZooKeeper restart of a few seconds its next attempt can
fall past the session timeout: every client's session (a bookie's registration, a writer's lease) expired after an
outage it should have ridden through."""


class ZooKeeperUnreachable(RuntimeError):
    pass


def retry_options(timeout: float) -> dict:
    """KazooClient retries for a session of `timeout` seconds: reconnect attempts at most RECONNECT_MAX_DELAY apart,
    and `client.retry(command, ...)` repeating a command through connection losses for up to one session timeout,
    but not past a session expiry (a lease or an ephemeral node ends with its session; the caller must know)."""
    max_delay = min(RECONNECT_MAX_DELAY, timeout / 4)
    return {
        "connection_retry": KazooRetry(max_tries=-1, max_delay=max_delay),
        "command_retry": KazooRetry(max_tries=-1, max_delay=max_delay, deadline=timeout, ignore_expire=False),
    }


def fleet_acl(auth: str) -> list[ACL]:
    """The ACL every node of a fleet with the `user:password` credential carries: that identity, any access."""
    user, sep, password = auth.partition(":")
    if not sep or not user or not password:
        raise ValueError(f"ZooKeeper credential must be USER:PASSWORD (from --zk-auth or ${ZK_AUTH_ENV})")
    return [make_digest_acl(user, password, all=True)]


def security_options(auth: str | None) -> dict:
    """KazooClient options for a `user:password` digest credential (none: an open, unauthenticated session)."""
    if not auth:
        return {}
    return {"auth_data": [("digest", auth)], "default_acl": fleet_acl(auth)}


def tls_options(tls_dir: str | Path | None) -> dict:
    """KazooClient options for TLS to ZooKeeper with the identity in `tls_dir` (none: plain TCP)."""
    if not tls_dir:
        return {}
    ca, cert, key = tls_files(Path(tls_dir))
    for path in (ca, cert, key):
        if not path.is_file():
            raise TlsConfigError(f"ZooKeeper TLS file {path} is missing (from --zk-tls-dir or ${ZK_TLS_DIR_ENV})")
    return {"use_ssl": True, "ca": str(ca), "certfile": str(cert), "keyfile": str(key), "check_hostname": True}


def new_client(
    hosts: str, timeout: float = 10.0, auth: str | None = None, tls_dir: str | Path | None = None, **kwargs
) -> KazooClient:
    """A KazooClient for `hosts` (HOST:PORT[,...][/chroot]), not started yet, authenticated with `auth` or, when not
    given (None), with `$BOOKFLEET_ZK_AUTH` if set (NO_AUTH: never); over TLS with `tls_dir` or, when not given,
    `$BOOKFLEET_ZK_TLS_DIR` if set (NO_TLS: never). `connect` starts it and waits; a caller that must not wait (the
    operator) starts it with `start_async`."""
    tls_dir = os.environ.get(ZK_TLS_DIR_ENV) if tls_dir is None else tls_dir
    auth = os.environ.get(ZK_AUTH_ENV) if auth is None else auth
    options = {**retry_options(timeout), **security_options(auth), **tls_options(tls_dir)}
    return KazooClient(hosts=hosts, timeout=timeout, **{**options, **kwargs})


def connect(
    hosts: str, timeout: float = 10.0, auth: str | None = None, tls_dir: str | Path | None = None, **kwargs
) -> KazooClient:
    """`new_client(...)` started: a live session, or ZooKeeperUnreachable after `timeout` seconds."""
    tls_dir = os.environ.get(ZK_TLS_DIR_ENV) if tls_dir is None else tls_dir
    client = new_client(hosts, timeout, auth, tls_dir, **kwargs)
    try:
        client.start(timeout=timeout)
    except KazooTimeoutError:
        client.close()
        over = f" over TLS with {tls_dir}" if tls_dir else ""
        raise ZooKeeperUnreachable(
            f"ZooKeeper at {hosts} is unreachable{over} (no session within {timeout:.0f}s)"
        ) from None
    return client


@contextlib.contextmanager
def session(
    hosts: str, timeout: float = 10.0, auth: str | None = None, tls_dir: str | Path | None = None
) -> Iterator[KazooClient]:
    client = connect(hosts, timeout, auth, tls_dir)
    try:
        yield client
    finally:
        client.stop()
        client.close()
