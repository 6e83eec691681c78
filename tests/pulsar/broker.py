"""Apache Pulsar 4.0's broker, from the jars `make pulsar-broker` fetches, with its metadata under `/pulsar` of a
bookfleet fleet's ZooKeeper and its BookKeeper client on the fleet's `/ledgers` (E3/Qw2/Qa2 managed ledgers)."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bookfleet.bench.bookkeeper import JAVA17_OPENS
from bookfleet.commanderror import CommandError
from bookfleet.zkserver import free_port
from tests.interop.javaside import JavaProcess

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-pulsar.sh"
CLUSTER = "bookfleet"
METADATA_ROOT = "/pulsar"
"""Pulsar's own metadata (clusters, namespaces, managed-ledger cursors) beside, not inside, BookKeeper's `/ledgers`."""
JVM = ["-Xms256m", "-Xmx512m", "-XX:MaxDirectMemorySize=512m", "-XX:+UseSerialGC", *JAVA17_OPENS,
       "--add-exports", "java.base/jdk.internal.platform=ALL-UNNAMED"]
"""Small: one broker beside four bookies on two shared cores (jdk.internal.platform: the load manager's cgroup
probe)."""

requires_pulsar = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("java", "mvn")), reason="no JDK (java, mvn) on PATH"
)


def built_broker() -> Path:
    """The cached jars of Pulsar's broker (fetched on first use, once per Pulsar version)."""
    try:
        built = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        raise CommandError(f"fetching Pulsar's broker failed:\n{exc.stderr[-3000:]}") from None
    return Path(built.stdout.strip().splitlines()[-1]) / "lib"


def broker_settings(zk: str, broker_port: int, web_port: int) -> dict[str, object]:
    """What a broker needs on a bookfleet fleet; everything else is Pulsar's default (V2 wire protocol, CRC32C
    digests, an empty ledger password). Functions, transactions and system topics are off: a plain broker."""
    return {
        "clusterName": CLUSTER,
        "metadataStoreUrl": f"zk:{zk}{METADATA_ROOT}",
        "configurationMetadataStoreUrl": f"zk:{zk}{METADATA_ROOT}",
        "bookkeeperMetadataServiceUri": f"zk+hierarchical://{zk}/ledgers",
        "brokerServicePort": broker_port,
        "webServicePort": web_port,
        "bindAddress": "127.0.0.1",
        "advertisedAddress": "127.0.0.1",
        "managedLedgerDefaultEnsembleSize": 3,
        "managedLedgerDefaultWriteQuorum": 2,
        "managedLedgerDefaultAckQuorum": 2,
        "functionsWorkerEnabled": "false",
        "systemTopicEnabled": "false",
        "topicLevelPoliciesEnabled": "false",
        "transactionCoordinatorEnabled": "false",
    }


def admin(web_url: str, method: str, path: str, body: object = None, timeout: float = 60.0) -> object:
    """One call of a broker's admin REST API (at `web_url`); its JSON (or text) answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{web_url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        text = response.read().decode()
    try:
        return json.loads(text) if text else None
    except json.JSONDecodeError:
        return text


def healthy(web_url: str) -> bool:
    """The broker's health check answers ok: it writes and reads a heartbeat topic, so through the bookies."""
    try:
        return admin(web_url, "GET", "/admin/v2/brokers/health") == "ok"
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


class PulsarBroker(JavaProcess):
    """One broker process on the fleet whose ZooKeeper is `zk`; `start` returns once its health check (which writes
    and reads a heartbeat topic, so through the bookies) answers ok."""

    def __init__(self, directory: Path, zk: str):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        super().__init__(self.directory / "broker.log")
        self.zk = zk
        self.lib = built_broker()
        self.broker_port, self.web_port = free_port(), free_port()
        self.service_url = f"pulsar://127.0.0.1:{self.broker_port}"
        self.web_url = f"http://127.0.0.1:{self.web_port}"
        self.conf = self.directory / "broker.conf"
        settings = broker_settings(zk, self.broker_port, self.web_port)
        self.conf.write_text("".join(f"{name}={value}\n" for name, value in settings.items()))

    def _java(self, main: str, *args: object) -> list[str]:
        return ["java", *JVM, "-cp", f"{self.lib}/*", main, *map(str, args)]

    def initialize_cluster(self) -> None:
        """What `pulsar initialize-cluster-metadata` does, told the BookKeeper metadata exists (bookfleet's): the
        cluster, the `public/default` namespace; `/ledgers` is left as it is."""
        done = subprocess.run(self._java(
            "org.apache.pulsar.PulsarClusterMetadataSetup", "--cluster", CLUSTER,
            "--metadata-store", f"zk:{self.zk}{METADATA_ROOT}",
            "--configuration-metadata-store", f"zk:{self.zk}{METADATA_ROOT}",
            "--web-service-url", self.web_url, "--broker-service-url", self.service_url,
            "--existing-bk-metadata-service-uri", f"zk+hierarchical://{self.zk}/ledgers",
        ), capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"Pulsar's cluster metadata setup exited {done.returncode}:\n{done.stdout[-4000:]}")

    def start(self, timeout: float = 300.0) -> PulsarBroker:
        """A bound on a broker that never becomes healthy, not a speed claim: on two cores shared with bookies, Spark
        and other work its start took over 120 s (99 s of its own bootstrap at load 36)."""
        self.launch(self._java("org.apache.pulsar.PulsarBrokerStarter", "--broker-conf", self.conf), self._healthy,
                    timeout, "Pulsar broker did not become healthy")
        return self

    def _healthy(self) -> bool:
        return healthy(self.web_url)

    def admin(self, method: str, path: str, body: object = None, timeout: float = 60.0) -> object:
        return admin(self.web_url, method, path, body, timeout)

    def restart(self) -> PulsarBroker:
        """Kill -9 and start again on the same ports: what a crashed broker's supervisor does."""
        self.kill9()
        return self.start()

    def __enter__(self) -> PulsarBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(timeout=60)
