"""TLS contexts for the bookie protocol, from a TLS directory (`ca.pem`, `cert.pem`, `key.pem`, or a mounted
kubernetes.io/tls Secret's `ca.crt`, `tls.crt`, `tls.key`), reloaded on change.

Both ends authenticate (mutual TLS): a bookie requires a client certificate signed by the cluster CA, and a client
verifies the bookie's certificate against the CA and the host name it dialled. `refresh()` is called before every
new connection; when the files changed, the new certificate is checked in a scratch context and then loaded into
the live one, so new connections present it while open ones keep theirs: rotation without a restart. A CA bundle
is only ever added to (OpenSSL cannot forget a trusted CA), so rotating the CA means shipping both CAs in `ca.pem`
until every certificate is reissued, then restarting.

Clients find their directory in `$BOOKFLEET_TLS_DIR` (the CLI's `--tls-dir` sets it), so every client in a
process and its children (repair drivers, Spark executors) uses the same identity.
"""

from __future__ import annotations

import functools
import logging
import os
import ssl
from pathlib import Path

CA_FILE = "ca.pem"
CERT_FILE = "cert.pem"
KEY_FILE = "key.pem"
"""A TLS directory's files in our names. They live here, not beside the certificates' issuing (`certs`): a bookie or
client that only reads its directory does not import `cryptography` (a twentieth of a second of every start)."""
KUBERNETES_FILES = ("ca.crt", "tls.crt", "tls.key")
"""The same three files as a kubernetes.io/tls Secret (and cert-manager) names them."""

log = logging.getLogger(__name__)

TLS_DIR_ENV = "BOOKFLEET_TLS_DIR"


class TlsConfigError(RuntimeError):
    """A TLS directory that cannot be used; the message names the file and what is wrong with it."""


def tls_files(directory: Path) -> tuple[Path, Path, Path]:
    """The CA, certificate and key files of a TLS directory, in our names or a kubernetes.io/tls Secret's."""
    names = (CA_FILE, CERT_FILE, KEY_FILE)
    if not (directory / CA_FILE).exists() and (directory / KUBERNETES_FILES[0]).exists():
        names = KUBERNETES_FILES
    ca, cert, key = (directory / name for name in names)
    return ca, cert, key


class ReloadingContext:
    """An SSLContext kept in step with the files of a TLS directory; a server context requires client certificates
    unless `client_certificates` is False (HTTPS for probes and scrapers)."""

    def __init__(self, directory: Path, server: bool, client_certificates: bool = True):
        self.directory = Path(directory)
        self.server = server
        self.client_certificates = client_certificates
        self.context = self._new_context()
        self._stamp: tuple | None = None
        self.refresh()

    @property
    def files(self) -> tuple[Path, Path, Path]:
        return tls_files(self.directory)

    def _new_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if self.server else ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED if self.client_certificates or not self.server else ssl.CERT_NONE
        context.check_hostname = not self.server
        return context

    def _read_stamp(self) -> tuple:
        try:
            return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in (p.stat() for p in self.files))
        except FileNotFoundError as exc:
            raise TlsConfigError(f"TLS file {exc.filename} is missing") from None

    def _load(self, context: ssl.SSLContext) -> None:
        ca, cert, key = self.files
        try:
            context.load_verify_locations(cafile=ca)
            context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            raise TlsConfigError(f"TLS files in {self.directory} are unusable: {exc}") from None

    def refresh(self) -> bool:
        """Load the files again if they changed since the last load; True if they did. A change that does not
        load (e.g. a certificate whose key has not been written yet) keeps the current identity and is retried."""
        stamp = self._read_stamp()
        if stamp == self._stamp:
            return False
        reloading = self._stamp is not None
        if reloading:
            try:
                self._load(self._new_context())
            except TlsConfigError as exc:
                log.warning("keeping the current TLS certificate: %s", exc)
                return False
        self._load(self.context)
        self._stamp = stamp
        if reloading:
            log.info("TLS certificate reloaded from %s", self.directory)
        return True


def bookie_host(bookie_id: str) -> str:
    """The name a bookie's certificate must carry: its stable id without the port (`bk-0.bk-bookies.ns.svc:3181`
    -> `bk-0.bk-bookies.ns.svc`, `bookie-0` -> `bookie-0`)."""
    host, sep, port = bookie_id.rpartition(":")
    return host.strip("[]") if sep and port.isdigit() else bookie_id


def server_context(directory: Path) -> ReloadingContext:
    """A bookie's context: presents its certificate, requires a client certificate signed by the CA."""
    return ReloadingContext(directory, server=True)


def https_context(directory: Path) -> ReloadingContext:
    """A bookie's HTTPS context: presents its certificate and asks nothing of the client (probes, scrapers)."""
    return ReloadingContext(directory, server=True, client_certificates=False)


@functools.cache
def _client_context(directory: str) -> ReloadingContext:
    return ReloadingContext(Path(directory), server=False)


def client_context(directory: Path | str | None = None) -> ReloadingContext | None:
    """The client context for `directory`, or for `$BOOKFLEET_TLS_DIR`; None when neither is set (plain TCP).
    One context per directory and process, shared by every connection."""
    directory = directory or os.environ.get(TLS_DIR_ENV)
    if not directory:
        return None
    return _client_context(str(Path(directory).resolve()))


def use_client_tls(directory: Path | str | None) -> None:
    """Make `directory` the TLS identity of every client in this process and its children."""
    if directory:
        client_context(directory)  # fails now, with the file name, rather than at the first connection
        os.environ[TLS_DIR_ENV] = str(Path(directory).resolve())
