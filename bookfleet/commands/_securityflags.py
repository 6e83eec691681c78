"""The CLI's security flags, shared by every command that talks to ZooKeeper or bookies.

`--zk-auth USER:PASSWORD` (default `$BOOKFLEET_ZK_AUTH`), `--tls-dir DIR` (default `$BOOKFLEET_TLS_DIR`) and
`--zk-tls-dir DIR` (default `$BOOKFLEET_ZK_TLS_DIR`: TLS to a ZooKeeper that serves it) are put into the
environment, where `bookfleet.meta.zk.connect` and `BookieClient.connect` find them; child processes
(spark-submit, Spark executors) inherit them, so a whole command runs as one identity.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from kazoo.client import KazooClient

from bookfleet.meta.registry import BookieRegistry
from bookfleet.meta.zk import ZK_AUTH_ENV, ZK_TLS_DIR_ENV, tls_options
from bookfleet.security.tls import TLS_DIR_ENV, TlsConfigError, client_context, use_client_tls


class SecurityFlagError(ValueError):
    """A --zk-auth or --tls-dir that cannot be used; the message names the flag."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--zk-auth", metavar="USER:PASSWORD", default=None,
        help=f"ZooKeeper digest credential of a secure fleet (default ${ZK_AUTH_ENV})",
    )
    parser.add_argument(
        "--tls-dir", default=None,
        help=f"directory with ca.pem, cert.pem, key.pem for mutual TLS to bookies (default ${TLS_DIR_ENV})",
    )
    parser.add_argument(
        "--zk-tls-dir", default=None,
        help=f"directory with ca.pem, cert.pem, key.pem for TLS to ZooKeeper's secure port (default ${ZK_TLS_DIR_ENV})",
    )


def apply(args: argparse.Namespace) -> None:
    """Make the flags the identity of this process and its children."""
    if getattr(args, "zk_auth", None):
        os.environ[ZK_AUTH_ENV] = args.zk_auth
    try:
        use_client_tls(getattr(args, "tls_dir", None))
    except TlsConfigError as exc:
        raise SecurityFlagError(f"--tls-dir: {exc}") from None
    if hasattr(args, "zk_tls_dir") and (zk_tls_dir := args.zk_tls_dir or os.environ.get(ZK_TLS_DIR_ENV)):
        try:
            tls_options(zk_tls_dir)  # fails now, naming the file, rather than as an unreachable ZooKeeper
        except TlsConfigError as exc:
            raise SecurityFlagError(str(exc)) from None
        os.environ[ZK_TLS_DIR_ENV] = str(Path(zk_tls_dir).resolve())


def missing_tls(zk: KazooClient) -> str | None:
    """What is missing to talk to this fleet's bookies: a TLS identity when they serve TLS; None when nothing is."""
    if client_context() is not None:
        return None
    secure = [info.bookie_id for info in BookieRegistry(zk).all() if info.tls]
    if not secure:
        return None
    return (
        f"bookie {secure[0]} requires mutual TLS: pass --tls-dir DIR or set {TLS_DIR_ENV} "
        "(a directory with ca.pem, cert.pem and key.pem)"
    )
