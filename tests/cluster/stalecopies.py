"""The copies a returning bookie holds of ledgers repaired away while it was gone, seen from outside as a client sees
them: ZooKeeper's metadata on the server's pod IP with the fleet's credential, the bookie on its pod IP with a
client certificate. The bookie's garbage collection removes such a copy; until then a read of the ledger on that
bookie is answered, afterwards it is NoSuchLedger."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bookfleet.client.connection import BookieClient, NoSuchLedgerOnBookieError
from bookfleet.kube import resources
from bookfleet.meta import zk
from bookfleet.meta.metadata import MetadataStore
from bookfleet.security.tls import ReloadingContext, client_context
from tests.cluster.walkthrough import CLUSTER, NAMESPACE, LocalCluster, bookie_cluster, client_secret


@dataclass(frozen=True)
class FleetAccess:
    """Where the harness reaches the example cluster from the host."""

    zookeeper: str
    """The ZooKeeper server's pod IP and port, with the cluster's chroot."""
    auth: str
    tls: ReloadingContext | None
    bookie_port: int

    @contextlib.contextmanager
    def metadata(self) -> Iterator[MetadataStore]:
        with zk.session(self.zookeeper, auth=self.auth) as session:
            yield MetadataStore(session)

    def ledgers_on(self, bookie_ids: list[str]) -> dict[str, set[int]]:
        """Bookie id -> the ledgers whose metadata names it now (a scan of ZooKeeper's metadata)."""
        with self.metadata() as store:
            return {bookie: set(store.ledgers_on_bookie(bookie)) for bookie in bookie_ids}

    def named_no_more(self, named_before: dict[str, set[int]]) -> dict[str, set[int]]:
        """Bookie id -> the ledgers of `named_before[bookie]` now closed without it in any segment: its copies there
        are stale (over-replicated, as BookKeeper calls them)."""
        stale: dict[str, set[int]] = {}
        with self.metadata() as store:
            for bookie, ledgers in named_before.items():
                stale[bookie] = set()
                for ledger_id in sorted(ledgers):
                    metadata, _ = store.read(ledger_id)
                    if metadata.is_closed and bookie not in metadata.bookies():
                        stale[bookie].add(ledger_id)
        return stale

    def still_held(self, pod_ip: str, bookie_id: str, ledger_ids: set[int]) -> set[int]:
        """The ledgers the bookie (on `pod_ip`) still answers for: a read of entry 0 answered with the entry or with
        NoSuchEntry (it holds a later segment), not NoSuchLedger."""

        async def ask() -> set[int]:
            held = set()
            async with await BookieClient.connect(f"{pod_ip}:{self.bookie_port}", tls=self.tls,
                                                  bookie_id=bookie_id) as client:
                for ledger_id in sorted(ledger_ids):
                    try:
                        await client.read_entry(ledger_id, 0)
                    except NoSuchLedgerOnBookieError:
                        continue
                    except Exception:  # NoSuchEntry and the like: the bookie knows the ledger
                        pass
                    held.add(ledger_id)
            return held

        return asyncio.run(ask())


def fleet_access(cluster: LocalCluster, tls_dir: Path) -> FleetAccess:
    """The example cluster's ZooKeeper (the chart's single server) and bookies as the host reaches them; the client
    certificate of `issue_client_certificate` is written to `tls_dir`."""
    spec = bookie_cluster(cluster).spec
    [server] = cluster.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=zookeeper")["items"]
    _, _, chroot = spec.zookeeper.partition("/")
    port = spec.zookeeper.split("/")[0].rsplit(":", 1)[1]
    secret = spec.security.zookeeper_auth_secret
    auth = base64.b64decode(cluster.get("secret", "-n", NAMESPACE, secret)["data"][resources.ZK_AUTH_KEY]).decode() \
        if secret else zk.NO_AUTH
    tls = None
    if resources.tls_enabled(bookie_cluster(cluster)):
        tls_dir.mkdir(parents=True, exist_ok=True)
        for name, value in cluster.get("secret", "-n", NAMESPACE, client_secret(CLUSTER))["data"].items():
            (tls_dir / name).write_bytes(base64.b64decode(value))
        tls = client_context(tls_dir)
    return FleetAccess(f"{server['status']['podIP']}:{port}" + (f"/{chroot}" if chroot else ""), auth, tls,
                       spec.bookie.port)
