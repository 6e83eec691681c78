"""`bookfleet bench operator --scale`: the operator at fleet scale on a real API server, its nodes and pods simulated.

The local control plane (tests/cluster: etcd, kube-apiserver, controller-manager, scheduler from the pinned Go
modules) with kwok (`sigs.k8s.io/kwok`, built once per pinned version by scripts/build-kwok.sh) faking the nodes and
the pods' lifecycles, and a real embedded ZooKeeper. The bookies are registered in ZooKeeper by the bench (no bookie
process runs), the ledgers' metadata is written there, one Ledger resource adopts each.

1. The bookies register, the operator brings up their BookieCluster (pods Running on kwok nodes) and is stopped.
2. M ledgers and their Ledger resources are created; an idle window measures what the API server and ZooKeeper
   serve without the operator (kwok's heartbeats, the controllers, the bench's session): the same-run baseline.
3. The operator starts over the whole fleet: seconds until every Ledger shows its state (each reconciled once).
4. After --settle seconds, a steady window: the operator's CPU and RSS, API requests/s (kube-apiserver's own
   `apiserver_request_total`, by verb/resource, minus the idle window) and ZooKeeper requests/s (`mntr`
   zk_packets_received, likewise).
5. Pod death: a bookie's pod and volumes deleted, its registration gone: seconds to its ledgers marked, to its
   repair Job and to every Ledger of it shown under-replicated, minus the lost-bookie delay (the restart below then
   starts from statuses that are all current).
6. The operator restarted over the reconciled fleet (an upgrade, a failover): seconds until it has passed every
   Ledger once (its own pass counter on --metrics-port), and what it asked of the API server and ZooKeeper
   meanwhile: a Ledger whose status is current costs no write. Its floor, measured just before: one paged LIST of
   every Ledger (the informer's pages of 500), which the restart's passes follow page by page.

`--operator-python` runs another checkout's operator (its virtualenv's python) against the same setup: the
before/after figures of an operator change, measured the same way.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bookfleet.bench.baseline import cpu_loop
from bookfleet.kube import resources
from bookfleet.kube.models import Bookie, BookieCluster, Ledger
from bookfleet.meta import zk as zkclient
from bookfleet.meta import zkpaths
from bookfleet.meta.metadata import MetadataStore, new_metadata
from bookfleet.meta.registry import BookieInfo
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.polling import wait_for
from bookfleet.zkserver import ZooKeeperServer, four_letter_word, free_port
from tests.cluster import __main__ as cluster_main
from tests.cluster import controlplane
from tests.operatorbench import zookeeper

NS = "default"
CLUSTER = "fleet"
ROOT = Path(__file__).resolve().parents[2]
ZONES = ("zone-a", "zone-b", "zone-c")
BOOKIES_PER_NODE = 20
DELAY = 5
"""lostBookieRecoveryDelaySeconds of the cluster (the pod-death figure is given minus it)."""
TARGETS = {"startup_s": 120.0, "steady_cpu_cores": 0.1, "api_requests_per_s": 5.0, "zk_requests_per_s": 20.0,
           "rss_mb": 400.0, "pod_death_to_repair_job_s": 5.0, "status_s": 2.0}
"""At 1,000 bookies and 100,000 Ledgers (the scale targets)."""
NOT_THE_OPERATOR = {"leases", "nodes", "nodes/status", "pods/status", "endpoints", "endpointslices",
                    "poddisruptionbudgets/status"}
"""Resources only kwok and the controllers write or read (the operator never does): left out of its share."""


def run(args: argparse.Namespace) -> int:
    if args.zookeeper_only:
        baseline = {"cpu_loop_before": cpu_loop(), "load_average_1m_before": round(os.getloadavg()[0], 1)}
        with tempfile.TemporaryDirectory(prefix="bench-zk-scale-") as tmp:
            result = zookeeper.standalone(Path(tmp), args.bookies, args.ledgers)
        baseline.update(cpu_loop_after=cpu_loop(), load_average_1m_after=round(os.getloadavg()[0], 1))
        print(json.dumps({"bench": "operator", "scenario": "scale-zookeeper", "bookies": args.bookies,
                          "ledgers": args.ledgers, **result, "baseline": baseline,
                          "target_status_s": TARGETS["status_s"]}, indent=None if args.json else 2))
        return 0
    if shutil.which("go") is None:
        print("bench operator --scale: skipped: no Go toolchain on PATH (the control plane and kwok are built from"
              " Go modules)")
        return 0
    binaries = cluster_main.build()
    kwok = Path(subprocess.run([str(ROOT / "scripts" / "build-kwok.sh")], check=True, stdout=subprocess.PIPE,
                               text=True).stdout.strip().splitlines()[-1])
    baseline = {"cpu_loop_before": cpu_loop()}
    with controlplane.on_loopback(binaries, "bench-scale-") as plane:
        state = plane.state
        with _process(state, "kwok", [str(kwok), "--kubeconfig", str(plane.kubeconfig), "--manage-all-nodes",
                                      "--config", str(kwok.parent / "stages.yaml"),
                                      "--cidr", "10.128.0.0/10",
                                      # a lease renewed every 2 s: the controllers' 20 s grace outlasts kwok's
                                      # lag on a loaded machine (nodes had gone NotReady, their bookies lost)
                                      "--node-lease-duration-seconds", "8"]), \
                ZooKeeperServer(state / "zk") as zk_server:
            result = Scale(args, plane, zk_server, state).measure()
    baseline["cpu_loop_after"] = cpu_loop()
    report = {"bench": "operator", "scenario": "scale", **result, "baseline": baseline,
              "targets_at_1000_bookies_100000_ledgers": TARGETS}
    print(json.dumps(report, indent=None if args.json else 2))
    return 0


@contextmanager
def _process(state: Path, name: str, command: list[str], env: dict[str, str] | None = None
             ) -> Iterator[subprocess.Popen]:
    with (state / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=30)


class Scale:
    def __init__(self, args: argparse.Namespace, plane: Any, zk_server: ZooKeeperServer, state: Path) -> None:
        import kubernetes  # the [operator] extra

        self.args, self.plane, self.zk_server, self.state = args, plane, zk_server, state
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(str(plane.kubeconfig), client_configuration=config)
        config.connection_pool_maxsize = 32
        client = kubernetes.client.ApiClient(config)
        self.core = kubernetes.client.CoreV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.extensions = kubernetes.client.ApiextensionsV1Api(client)
        self.batch = kubernetes.client.BatchV1Api(client)
        self.tls = ssl.create_default_context(cafile=str(plane.pki.ca_cert))
        self.tls.load_cert_chain(str(plane.pki.admin_cert), str(plane.pki.admin_key))

    # --- the fleet ------------------------------------------------------------------------------------------------

    def measure(self) -> dict[str, Any]:
        from bookfleet.kube import crdgen  # pyyaml, from the [operator] extra

        for model in (BookieCluster, Bookie, Ledger):
            self.extensions.create_custom_resource_definition(crdgen.crd(model))
        wait_for(lambda: self._served("ledgers"), 60, "the CRDs served", interval=0.5)
        self._nodes()
        self._volumes()
        cluster = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "BookieCluster",
                   "metadata": {"name": CLUSTER, "namespace": NS},
                   "spec": {"replicas": self.args.bookies, "zookeeper": self.zk_server.connect,
                            "security": {"tls": "Disabled"}, "autoRecovery": {"enabled": False}}}
        # The bookies register as they would once started (their ids follow from the cluster), before their pods
        # exist: none ever counts lost.
        bookies = {b["metadata"]["name"]: b["spec"]["bookieId"]
                   for b in resources.bookies_for_cluster(BookieCluster.model_validate(
                       {**cluster, "metadata": {**cluster["metadata"], "uid": "not-created-yet"}}))}
        started = time.monotonic()
        with zkclient.session(self.zk_server.connect) as registrations, self._operator("operator-1") as operator:
            for index, bookie_id in enumerate(bookies.values()):
                info = BookieInfo(bookie_id=bookie_id, address=f"10.0.{index // 250}.{index % 250}:3181",
                                  zone=ZONES[index % 3])
                registrations.create(zkpaths.available(bookie_id), info.encode(), makepath=True, ephemeral=True)
            self.custom.create_namespaced_custom_object("bookfleet.io", "v1alpha1", NS, "bookieclusters", cluster)
            wait_for(self._pods_running, 1800, f"{self.args.bookies} bookie pods Running", interval=2)
            wait_for(self._none_lost, 600, "no Bookie counted lost", interval=2)
            bring_up = time.monotonic() - started
            operator.terminate()
            operator.wait(timeout=60)
            # Off while the pods came up (a Pending pod is no loss to repair here); on for the pod death.
            self.custom.patch_namespaced_custom_object("bookfleet.io", "v1alpha1", NS, "bookieclusters", CLUSTER, {
                "spec": {"autoRecovery": {"enabled": True, "lostBookieRecoveryDelaySeconds": DELAY}}})
            result = self._with_fleet(bookies, registrations)
        return {"bookies": self.args.bookies, "ledgers": self.args.ledgers, "bring_up_s": round(bring_up, 1),
                "operator_python": self.args.operator_python, **result}

    def _with_fleet(self, bookies: dict[str, str], registrations: Any) -> dict[str, Any]:
        started = time.monotonic()
        self._ledgers(list(bookies.values()))
        creation = time.monotonic() - started
        idle = self._window(None)
        started = time.monotonic()
        port = free_port()
        with self._operator("operator-2", "--metrics-port", str(port)) as operator:
            # The operator's own pass counter first: a LIST of 100,000 Ledgers every few seconds made the API
            # server and this bench busier than the operator; then the LIST that proves it.
            wait_for(lambda: _ledger_passes(port) >= self.args.ledgers, 3600,
                     f"{self.args.ledgers} Ledger passes", interval=1)
            wait_for(self._all_ledgers_reconciled, 3600, f"{self.args.ledgers} Ledgers reconciled", interval=5)
            startup = time.monotonic() - started
            time.sleep(self.args.settle)
            busy = self._window(operator.pid)
            death = self._pod_death(bookies, registrations, port)
        restart = self._restart()
        api = {key: round(max(0.0, busy["api"].get(key, 0) - idle["api"].get(key, 0)), 2) for key in busy["api"]
               if key[1] not in NOT_THE_OPERATOR}
        operator_api = sum(api.values())
        return {
            "ledger_creation_s": round(creation, 1),
            "startup_s": round(startup, 1),
            "steady_cpu_cores": busy["cpu"],
            "rss_mb": busy["rss_mb"],
            "peak_rss_mb": busy["peak_rss_mb"],
            "api_requests_per_s": round(operator_api, 2),
            "api_requests_per_s_by_endpoint": {f"{verb} {resource}": rate
                                               for (verb, resource), rate in sorted(api.items(), key=lambda kv: -kv[1])
                                               if rate >= 0.05},
            "api_requests_per_s_idle": round(sum(idle["api"].values()), 2),
            "zk_requests_per_s": round(busy["zk"] - idle["zk"], 2),
            "zk_requests_per_s_idle": round(idle["zk"], 2),
            "load_average_1m": {"idle": idle["load_average"], "steady": busy["load_average"]},
            **death,
            **restart,
        }

    def _restart(self) -> dict[str, Any]:
        """Seconds until a restarted operator has passed every Ledger once, its API requests by verb and resource and
        its ZooKeeper requests meanwhile (the fleet's idle rates not taken off: a few seconds' worth)."""
        listing = self._list_seconds()
        port = free_port()
        api, zk = self._api_counts(), self._zk_packets()
        started = time.monotonic()
        with self._operator("operator-3", "--metrics-port", str(port)):
            wait_for(lambda: _ledger_passes(port) >= self.args.ledgers, 3600,
                     f"{self.args.ledgers} Ledgers passed after a restart", interval=2)
            seconds = time.monotonic() - started
        api_after = self._api_counts()
        return {"restart_all_ledgers_passed_s": round(seconds, 1),
                "restart_floor_list_ledgers_s": round(listing, 1),
                "restart_api_requests": {f"{verb} {resource}": int(count) for (verb, resource), count in sorted(
                    ((key, api_after[key] - api.get(key, 0)) for key in api_after), key=lambda kv: -kv[1])
                    if count >= 10 and resource not in NOT_THE_OPERATOR},
                "restart_zk_requests": int(self._zk_packets() - zk)}

    def _served(self, plural: str) -> bool:
        try:
            self.custom.list_namespaced_custom_object("bookfleet.io", "v1alpha1", NS, plural, limit=1)
            return True
        except Exception:
            return False

    def _nodes(self) -> None:
        """kwok nodes, BOOKIES_PER_NODE bookies' worth each, over three zones."""
        count = max(3, -(-self.args.bookies // BOOKIES_PER_NODE))
        capacity = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        for index in range(count):
            zone = ZONES[index % 3]
            self.core.create_node({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": f"kwok-{index}", "annotations": {"kwok.x-k8s.io/node": "fake"},
                             "labels": {"topology.kubernetes.io/zone": zone, resources.HOSTNAME_LABEL: f"kwok-{index}",
                                        "kubernetes.io/os": "linux", "type": "kwok"}},
                "status": {"capacity": capacity, "allocatable": capacity},
            })

    def _volumes(self) -> None:
        """A PersistentVolume bound ahead to each claim the operator will make (no provisioner runs here)."""
        cluster = BookieCluster.model_validate({"metadata": {"name": CLUSTER, "namespace": NS},
                                                "spec": {"replicas": 1, "zookeeper": "x"}})
        sizes = {"journal": cluster.spec.storage.journal.size, "ledgers": cluster.spec.storage.ledgers.size}
        volumes = [(claim, sizes[claim.rsplit("-", 1)[1]]) for ordinal in range(self.args.bookies)
                   for claim in resources.claim_names(resources.bookie_name(CLUSTER, ordinal))]

        def create(volume: tuple[str, str]) -> None:
            claim, size = volume
            self.core.create_persistent_volume({
                "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"pv-{claim}"},
                "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                         "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": f"/nonexistent/{claim}"},
                         "claimRef": {"namespace": NS, "name": claim}, "storageClassName": ""},
            })
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(create, volumes))

    def _pods_running(self) -> bool:
        selector = ",".join(f"{k}={v}" for k, v in {**resources.BOOKIE_POD_SELECTOR,
                                                     resources.LABEL_CLUSTER: CLUSTER}.items())
        pods = self.core.list_namespaced_pod(NS, label_selector=selector).items
        return len(pods) == self.args.bookies and all(p.status.phase == "Running" for p in pods)

    def _none_lost(self) -> bool:
        """A pod that was Pending a while may have counted lost: it must be back before auto-recovery is on."""
        items = self.custom.list_namespaced_custom_object("bookfleet.io", "v1alpha1", NS, "bookies")["items"]
        return not any((b.get("status") or {}).get("lostSince") for b in items)

    def _ledgers(self, bookie_ids: list[str]) -> None:
        """M ledgers' metadata (ensembles of 3 rotating over the bookies) and a Ledger resource adopting each."""
        with zkclient.session(self.zk_server.connect) as zk:
            store = MetadataStore(zk)
            ensembles = [[bookie_ids[(i + k) % len(bookie_ids)] for k in range(3)] for i in range(self.args.ledgers)]
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                ledger_ids = list(pool.map(lambda ensemble: store.create(new_metadata(ensemble, 3, 2)), ensembles))

        def create(ledger_id: int) -> None:
            self.custom.create_namespaced_custom_object("bookfleet.io", "v1alpha1", NS, "ledgers", {
                "apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger", "metadata": {"name": f"ledger-{ledger_id}"},
                "spec": {"cluster": CLUSTER, "ledgerId": ledger_id}})
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(create, ledger_ids))

    def _list_seconds(self) -> float:
        """Seconds to LIST every Ledger in pages of 500, as the operator's informer does (JSON decoded, nothing else):
        the floor under a restart, which passes each Ledger as its page arrives."""
        started, token = time.monotonic(), None
        while True:
            response = self.custom.list_namespaced_custom_object("bookfleet.io", "v1alpha1", NS, "ledgers", limit=500,
                                                                 _continue=token, _preload_content=False)
            token = json.loads(response.data)["metadata"].get("continue")
            if not token:
                return time.monotonic() - started

    def _all_ledgers_reconciled(self) -> bool:
        """Every Ledger shows a state (paged LIST, as a client at this scale must)."""
        token, done = None, 0
        while True:
            page = self.custom.list_namespaced_custom_object("bookfleet.io", "v1alpha1", NS, "ledgers", limit=2000,
                                                             _continue=token)
            done += sum(1 for item in page["items"] if (item.get("status") or {}).get("state"))
            token = page["metadata"].get("continue")
            if not token:
                return done >= self.args.ledgers

    # --- the operator and what it costs ---------------------------------------------------------------------------

    @contextmanager
    def _operator(self, name: str, *flags: str) -> Iterator[subprocess.Popen]:
        command = [self.args.operator_python, "-m", "bookfleet", "--log-level", "WARNING", "operator", "--standalone",
                   "--namespace", NS, "--kubeconfig", str(self.plane.kubeconfig), "--interval", "10", *flags]
        with _process(self.state, name, command, env={**os.environ}) as process:
            yield process

    def _window(self, pid: int | None) -> dict[str, Any]:
        """Rates over one window: API requests by (verb, resource), ZooKeeper packets, the operator's CPU and RSS."""
        api, zk, cpu = self._api_counts(), self._zk_packets(), _cpu_seconds(pid)
        started = time.monotonic()
        time.sleep(self.args.window)
        seconds = time.monotonic() - started
        api_after, zk_after, cpu_after = self._api_counts(), self._zk_packets(), _cpu_seconds(pid)
        window: dict[str, Any] = {
            "api": {key: (api_after[key] - api.get(key, 0)) / seconds for key in api_after},
            "zk": (zk_after - zk) / seconds,
        }
        if pid is not None:
            rss, peak = rss_mb(pid)
            window.update(cpu=round((cpu_after - cpu) / seconds, 3), rss_mb=round(rss, 1), peak_rss_mb=round(peak, 1))
        window["load_average"] = round(os.getloadavg()[0], 1)
        return window

    def _api_counts(self) -> Counter:
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"{self.plane.server}/metrics", context=self.tls, timeout=30) as response:
            text = response.read().decode()
        counts: Counter = Counter()
        for family in text_string_to_metric_families(text):
            if family.name == "apiserver_request":
                for sample in family.samples:
                    if sample.name == "apiserver_request_total":
                        labels = sample.labels
                        resource = labels.get("resource", "") + (f"/{labels['subresource']}"
                                                                 if labels.get("subresource") else "")
                        counts[(labels.get("verb", ""), resource)] += sample.value
        return counts

    def _zk_packets(self) -> float:
        for line in four_letter_word(self.zk_server.port, "mntr", timeout=10).splitlines():
            key, _, value = line.partition("\t")
            if key == "zk_packets_received":
                return float(value)
        raise RuntimeError("ZooKeeper's mntr has no zk_packets_received")

    def _pod_death(self, bookies: dict[str, str], registrations: Any, port: int) -> dict[str, Any]:
        """The last bookie's pod and volumes go and it deregisters: seconds to a ledger of it marked and to its repair
        Job, minus the lost-bookie delay; then until every Ledger of it shows under-replicated (the operator's gauge on
        `port`), so that the restart after it starts from a fleet whose statuses are all current."""
        victim = resources.bookie_name(CLUSTER, self.args.bookies - 1)
        victim_id = bookies[victim]
        on_victim = MetadataStore(registrations).ledgers_on_bookie(victim_id)
        registrations.delete(zkpaths.available(victim_id))
        died = time.monotonic()
        self.core.delete_namespaced_pod(victim, NS, grace_period_seconds=0)
        for claim in resources.claim_names(victim):
            self.core.delete_namespaced_persistent_volume_claim(claim, NS)
        markers = UnderReplication(registrations)
        try:
            wait_for(lambda: markers.marker(on_victim[0]) is not None, 300, "a ledger of the dead bookie marked",
                     interval=0.2)
            marked = time.monotonic() - died
            selector = ",".join(f"{k}={v}" for k, v in {**resources.REPAIR_SELECTOR,
                                                         resources.LABEL_BOOKIE: victim}.items())
            wait_for(lambda: self.batch.list_namespaced_job(NS, label_selector=selector).items, 300,
                     "its repair Job", interval=0.2)
            job = time.monotonic() - died
            wait_for(lambda: _operator_metric(port, "bookfleet_operator_ledgers_under_replicated") >= len(on_victim),
                     1800, "every Ledger of the dead bookie shown under-replicated", interval=2)
            shown = time.monotonic() - died
        except TimeoutError as exc:
            return {"pod_death": str(exc)}
        return {"pod_death_to_marked_s": round(marked - DELAY, 1), "pod_death_to_repair_job_s": round(job - DELAY, 1),
                "pod_death_to_all_shown_s": round(shown - DELAY, 1), "lost_bookie_recovery_delay_s": DELAY,
                "ledgers_on_dead_bookie": len(on_victim)}


def _ledger_passes(port: int) -> float:
    """The operator's count of Ledger passes (0 until it serves its metrics)."""
    return _operator_metric(port, "bookfleet_operator_reconciles_total", resource="ledgers")


def _operator_metric(port: int, name: str, **labels: str) -> float:
    """The sum of the operator's samples of `name` with those labels (0 until it serves its metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


def _cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of a process in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
