"""Security material of a fleet on this machine (`standalone --secure`, `demo --secure`), kept under `<data-dir>/tls`
so a restart on the same directory keeps its CA and ZooKeeper credential:

    tls/ca/          the CA (ca.pem, ca-key.pem)
    tls/client/      what a user's CLI needs: ca.pem, cert.pem, key.pem with role client
    tls/fleet/       the fleet's own processes (auditor, repair runner, demo): roles replicator and admin
    tls/zookeeper/   the embedded ZooKeeper's server certificate (127.0.0.1, localhost), for its TLS port
    tls/zk-auth      the ZooKeeper digest credential, USER:PASSWORD (mode 0600)

An embedded ZooKeeper serves only TLS: the fleet's processes and the user's CLI reach it with the same certificate
they present to bookies (`$BOOKFLEET_ZK_TLS_DIR` names the same directory as `$BOOKFLEET_TLS_DIR`).
"""

from __future__ import annotations

import os
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path

from bookfleet.meta.zk import ZK_AUTH_ENV, ZK_TLS_DIR_ENV
from bookfleet.security.certs import CertificateAuthority, load_or_create_ca, write_tls_dir
from bookfleet.security.roles import Role
from bookfleet.security.tls import TLS_DIR_ENV, use_client_tls

ZK_USER = "bookfleet"
ZOOKEEPER_NAMES = ("127.0.0.1", "localhost")
"""What the embedded ZooKeeper is dialled as; kazoo checks the name against its certificate."""


@dataclass(frozen=True)
class LocalSecurity:
    ca: CertificateAuthority
    client_dir: Path
    fleet_dir: Path
    zk_auth: str
    zookeeper_dir: Path | None
    """The embedded ZooKeeper's TLS directory; None when the fleet uses a ZooKeeper of its own (plain)."""

    def exports(self) -> list[str]:
        """The lines a user pastes into a shell to talk to this fleet."""
        lines = [
            f"export {TLS_DIR_ENV}={shlex.quote(str(self.client_dir))}",
            f"export {ZK_AUTH_ENV}={shlex.quote(self.zk_auth)}",
        ]
        if self.zookeeper_dir is not None:
            lines.append(f"export {ZK_TLS_DIR_ENV}={shlex.quote(str(self.client_dir))}")
        return lines

    def use_in_this_process(self) -> None:
        """Run this process (and the bookies, repair jobs it starts) with the fleet's identity and credential."""
        os.environ[ZK_AUTH_ENV] = self.zk_auth
        use_client_tls(self.fleet_dir)
        if self.zookeeper_dir is not None:
            os.environ[ZK_TLS_DIR_ENV] = str(self.fleet_dir)


def _zk_auth(path: Path) -> str:
    if path.exists():
        return path.read_text().strip()
    auth = f"{ZK_USER}:{secrets.token_urlsafe(24)}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(auth + "\n")
    return auth


def prepare(data_dir: Path, zookeeper_tls: bool = True) -> LocalSecurity:
    """The CA and credential under `data_dir/tls` (created on first use) and fresh client and fleet certificates;
    with `zookeeper_tls` also the embedded ZooKeeper's server certificate."""
    root = Path(data_dir).resolve() / "tls"
    ca = load_or_create_ca(root / "ca")
    client_dir = write_tls_dir(root / "client", ca.issue("cli", [Role.CLIENT]))
    fleet_dir = write_tls_dir(root / "fleet", ca.issue("fleet", [Role.REPLICATOR, Role.ADMIN]))
    zookeeper_dir = (
        write_tls_dir(root / "zookeeper", ca.issue("zookeeper", [], ZOOKEEPER_NAMES)) if zookeeper_tls else None
    )
    return LocalSecurity(ca, client_dir, fleet_dir, _zk_auth(root / "zk-auth"), zookeeper_dir)
