"""Certificates and keys for the local control plane, made with the openssl command line (always on Debian)."""

from __future__ import annotations

import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    """Where the cluster's CA, serving, admin and service-account keys live."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.root / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.root / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.root / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.root / "admin.key"

    @property
    def service_account_key(self) -> Path:
        return self.root / "sa.key"

    @property
    def service_account_public_key(self) -> Path:
        return self.root / "sa.pub"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _signed(pki: Pki, name: str, subject: str, extensions: str) -> None:
    key, csr, cert, ext = (pki.root / f"{name}.{suffix}" for suffix in ("key", "csr", "crt", "ext"))
    ext.write_text(extensions)
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-subj", subject, "-out", str(csr))
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(pki.ca_key), "-CAcreateserial",
        "-days", "30", "-extfile", str(ext), "-out", str(cert),
    )
    csr.unlink()
    ext.unlink()


def create(root: Path, serving_ips: list[str], serving_names: list[str]) -> Pki:
    """A CA; a serving certificate naming every address clients use (loopback, the bridge, the Service IP);
    an admin client certificate in system:masters; the service-account signing key pair."""
    root.mkdir(parents=True, exist_ok=True)
    pki = Pki(root)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(pki.ca_key), "-out", str(pki.ca_cert),
        "-days", "30", "-subj", "/CN=bookfleet-local-ca",
    )
    alt_names = ",".join([*(f"IP:{ip}" for ip in serving_ips), *(f"DNS:{name}" for name in serving_names)])
    _signed(
        pki, "apiserver", "/CN=kube-apiserver",
        f"subjectAltName={alt_names}\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n",
    )
    _signed(pki, "admin", "/O=system:masters/CN=bookfleet-admin", "extendedKeyUsage=clientAuth\n")
    _openssl("genrsa", "-out", str(pki.service_account_key), "2048")
    _openssl("rsa", "-in", str(pki.service_account_key), "-pubout", "-out", str(pki.service_account_public_key))
    return pki


_MAKING = threading.Lock()
"""Credentials are made once however many nodes start at a time and ask for the same ones (kube-proxy's)."""


def client_credentials(pki: Pki, name: str, subject: str) -> tuple[Path, Path]:
    """A client certificate for `subject`, made once under `name`; (certificate, key)."""
    with _MAKING:
        if not (pki.root / f"{name}.crt").exists():
            _signed(pki, name, subject, "extendedKeyUsage=clientAuth\n")
    return pki.root / f"{name}.crt", pki.root / f"{name}.key"


def node_credentials(pki: Pki, node: str) -> tuple[Path, Path]:
    """A kubelet's client certificate (CN system:node:<node>, O system:nodes): the Node authorizer and NodeRestriction
    let it see and change only its own Node and its pods' objects. Made once per node; (certificate, key)."""
    return client_credentials(pki, f"node-{node}", f"/O=system:nodes/CN=system:node:{node}")


def kubelet_client_credentials(pki: Pki) -> tuple[Path, Path]:
    """The API server's client certificate towards kubelets (`kubectl logs`, `exec`): a kubelet whose client CA is the
    cluster's accepts it, as kubeadm's apiserver-kubelet-client. Made once; (certificate, key)."""
    return client_credentials(pki, "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client")


def kubelet_serving_credentials(pki: Pki, node: str, address: str) -> tuple[Path, Path]:
    """A kubelet's serving certificate for its node address, signed by the cluster's CA, which the API server checks
    (`--kubelet-certificate-authority`) when it forwards logs. Made once per node and address; (certificate, key)."""
    name = f"kubelet-{node}-{address}"
    with _MAKING:
        if not (pki.root / f"{name}.crt").exists():
            _signed(pki, name, f"/O=system:nodes/CN=system:node:{node}",
                    f"subjectAltName=IP:{address},DNS:{node}\nextendedKeyUsage=serverAuth\n"
                    "keyUsage=digitalSignature,keyEncipherment\n")
    return pki.root / f"{name}.crt", pki.root / f"{name}.key"


def proxy_credentials(pki: Pki) -> tuple[Path, Path]:
    """kube-proxy's client certificate (CN system:kube-proxy): the API server's bootstrap binding system:node-proxier
    lets that user watch Services, EndpointSlices and Nodes, as kubeadm's kube-proxy does."""
    return client_credentials(pki, "kube-proxy", "/CN=system:kube-proxy")
