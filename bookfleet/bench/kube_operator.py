"""`bookfleet bench operator`: the operator's reaction times and memory, on the Kubernetes API emulator; with
`--node-failure`, a bookie's node failing on the local Kubernetes cluster; with `--zone-loss`, a whole zone of it cut
off and returned (tests/cluster/zoneloss.py); with `--scale`, the operator over a fleet of
simulated nodes (bench/operator_scale.py).

A real `bookfleet operator` process watches the emulator (tests.emulator) and a real embedded ZooKeeper.
Pods are not run: the figures are the operator's own work. Reported next to the same-run cost of one emulator
round trip and one ZooKeeper write (what every reconciliation step is made of) and the raw fsync baseline.
`--node-failure` starts the local cluster (tests.cluster: a real control plane, process kubelets), installs the
chart and fails the node of a bookie holding a replica: seconds from the node being NotReady to the ledgers marked
and the repair Job created, to a healthy Ledger and a fresh bookie.

A development command: the emulator and the local cluster are test tooling, present only in a source checkout with
the `[dev]` extra.
(The module is not called `operator`: that would shadow the standard library's module of that name.)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from bookfleet.bench import operator_scale
from bookfleet.bench.baseline import cpu_loop, raw_fsync_bandwidth
from bookfleet.commanderror import CommandError
from bookfleet.kube import resources
from bookfleet.kube.models import Bookie, BookieCluster, Ledger
from bookfleet.meta import zk as zkclient
from bookfleet.meta.metadata import MetadataStore, new_metadata
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.polling import wait_for
from bookfleet.zkserver import ZooKeeperServer

NS = "default"
NODE_FAILURE_ENTRIES = 100


def register(subparsers) -> None:
    parser = subparsers.add_parser("operator", help="operator reaction times and RSS on the API emulator")
    parser.add_argument("--replicas", type=int, default=3, help="bookies of the cluster that is timed (default 3)")
    parser.add_argument("--large-bookies", type=int, default=100, help="bookies for the RSS figure (default 100)")
    parser.add_argument("--large-ledgers", type=int, default=5000, help="ledgers for the RSS figure (default 5000)")
    parser.add_argument("--delay", type=int, default=1, help="lostBookieRecoveryDelaySeconds (default 1)")
    parser.add_argument("--interval", type=float, default=1.0, help="operator reconciliation interval (default 1)")
    parser.add_argument("--node-failure", action="store_true",
                        help="instead: fail a bookie's node on the local Kubernetes cluster (minutes; builds it the"
                             " first time) and report the seconds to the repair Job and to a healthy Ledger")
    parser.add_argument("--zone-loss", action="store_true",
                        help="instead: cut a whole zone of the local Kubernetes cluster off for longer than the"
                             " lost-bookie delay, then return it; report the seconds to every ledger back at Qw and the"
                             " repairs the return started")
    operator_scale.add_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=handle)


def _wait(what: str, check: Callable[[], Any], timeout: float = 120.0) -> Any:
    return wait_for(check, timeout, what, interval=0.01)


def _cluster(name: str, replicas: int, zookeeper: str, delay: int) -> dict:
    return {"apiVersion": "bookfleet.io/v1alpha1", "kind": "BookieCluster", "metadata": {"name": name},
            "spec": {"replicas": replicas, "zookeeper": zookeeper, "security": {"tls": "Disabled"},
                     "autoRecovery": {"lostBookieRecoveryDelaySeconds": delay}}}


def _create_ledgers(connect: str, bookie_ids: list[str], count: int) -> None:
    """`count` ledgers' metadata, ensembles of 3 rotating over the bookies; concurrent, as clients would."""
    with zkclient.session(connect) as zk:
        store = MetadataStore(zk)
        ensembles = [[bookie_ids[(i + k) % len(bookie_ids)] for k in range(3)] for i in range(count)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda ensemble: store.create(new_metadata(ensemble, 2, 2)), ensembles))


def _pods(kube, cluster: str) -> list[dict]:
    return kube.list("pods", NS, f"{resources.LABEL_CLUSTER}={cluster}")


def _all_pods_seconds(kube, name: str, replicas: int, zookeeper: str, delay: int) -> float:
    started = time.perf_counter()
    kube.create("bookieclusters", _cluster(name, replicas, zookeeper, delay), NS)
    _wait(f"{replicas} pods of {name}", lambda: len(_pods(kube, name)) == replicas)
    return time.perf_counter() - started


def _api_roundtrip_ms(kube) -> float:
    started = time.perf_counter()
    for i in range(50):
        kube.create("configmaps", {"metadata": {"name": f"baseline-{i}"}}, NS)
    return (time.perf_counter() - started) / 50 * 1000


def _zk_write_ms(connect: str) -> float:
    with zkclient.session(connect) as zk:
        started = time.perf_counter()
        for i in range(50):
            zk.create(f"/bench-baseline-{i}", b"x")
        return (time.perf_counter() - started) / 50 * 1000


def _test_tooling(module: str) -> ModuleType:
    """A module of the source checkout's tests package (this bookfleet runs from an editable install)."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "tests" / "__init__.py").is_file() and str(checkout) not in sys.path:
        sys.path.append(str(checkout))
    try:
        return importlib.import_module(f"tests.{module}")
    except ImportError as exc:
        raise CommandError(
            f"bench operator is a development command: it needs tests/ of a source checkout and the [dev] extra "
            f"(pip install -e '.[dev]'); {exc}"
        ) from None


def handle(args: argparse.Namespace) -> int:
    if args.replicas < 1 or args.large_bookies < 3 or args.large_ledgers < 0 or args.delay < 0:
        raise CommandError("--replicas must be >= 1, --large-bookies >= 3, --large-ledgers and --delay >= 0")
    if args.scale:
        if args.bookies < 3 or args.ledgers < 1 or args.window <= 0:
            raise CommandError("--bookies must be >= 3, --ledgers >= 1, --window > 0")
        return operator_scale.run(args, _test_tooling)
    if args.node_failure:
        return _node_failure(args)
    if args.zone_loss:
        return _zone_loss(args)
    EmulatorThread = _test_tooling("emulator").EmulatorThread
    from bookfleet.kube import crdgen  # pyyaml, from the [operator] extra

    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp, ZooKeeperServer(Path(tmp) / "zk") as zk_server:
        baseline = {**raw_fsync_bandwidth(Path(tmp), 1024, seconds=1.0), **cpu_loop()}
        connect = zk_server.connect
        with EmulatorThread() as kube:
            kubeconfig = kube.write_kubeconfig(Path(tmp) / "kubeconfig")
            for model in (BookieCluster, Bookie, Ledger):
                kube.create("customresourcedefinitions", crdgen.crd(model))
            baseline["api_roundtrip_ms"] = _api_roundtrip_ms(kube)
            baseline["zk_write_ms"] = _zk_write_ms(connect)
            log = (Path(tmp) / "operator.log").open("wb")
            operator = subprocess.Popen(
                [sys.executable, "-m", "bookfleet", "--log-level", "WARNING", "operator", "--standalone", "--namespace",
                 NS, "--kubeconfig", str(kubeconfig), "--interval", str(args.interval)],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ},
            )
            try:
                result = _measure(args, kube, connect, operator.pid)
            finally:
                operator.kill()
                operator.wait(timeout=10)
                log.close()
    report = {"bench": "operator", **result, "baseline": baseline,
              "targets": {"apply_to_pods_s": 2.0, "loss_to_repair_job_s": 2.0, "rss_mb": 250.0}}
    print(json.dumps(report, indent=None if args.json else 2))
    return 0


def _node_failure(args: argparse.Namespace) -> int:
    walkthrough = _test_tooling("cluster.walkthrough")
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp:
        baseline = {**raw_fsync_bandwidth(Path(tmp), 1024, seconds=1.0), **cpu_loop()}
    with walkthrough.running_cluster() as cluster:
        walkthrough.install(cluster)
        failure = walkthrough.node_failure(cluster, NODE_FAILURE_ENTRIES)
    figures = failure.figures()
    report = {"bench": "operator", "scenario": "node-failure", **figures,
              "entries_read_back": len(failure.read_back), "baseline": baseline,
              "targets": {"repair_job_after_node_not_ready": figures["lost_bookie_recovery_delay_seconds"] + 5}}
    print(json.dumps(report, indent=None if args.json else 2))
    return 0 if len(failure.read_back) == NODE_FAILURE_ENTRIES else 1


def _zone_loss(args: argparse.Namespace) -> int:
    walkthrough, zoneloss = _test_tooling("cluster.walkthrough"), _test_tooling("cluster.zoneloss")
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp:
        baseline = {**raw_fsync_bandwidth(Path(tmp), 1024, seconds=1.0), **cpu_loop()}
    with walkthrough.running_cluster() as cluster:
        walkthrough.install(cluster)
        figures = zoneloss.zone_loss(cluster).figures()
    report = {"bench": "operator", "scenario": "zone-loss", **figures, "baseline": baseline,
              "targets": {"affected_ledgers_at_qw": figures["lost_bookie_recovery_delay_seconds"] + 60,
                          "entries_lost": 0, "repairs_started_by_return": 0}}
    print(json.dumps(report, indent=None if args.json else 2))
    return 0 if figures["entries_lost"] == 0 and figures["repairs_started_by_return"] == 0 else 1


def _measure(args: argparse.Namespace, kube, connect: str, pid: int) -> dict:
    apply_to_pods = _all_pods_seconds(kube, "small", args.replicas, connect, args.delay)
    # The timed bookie holds ledgers; its pod "ran" (status.pod recorded) before it is lost with its volumes.
    victim = resources.bookie_name("small", args.replicas - 1)
    victim_id = kube.get("bookies", NS, victim)["spec"]["bookieId"]
    others = [b["spec"]["bookieId"] for b in kube.list("bookies", NS) if b["metadata"]["name"] != victim]
    _create_ledgers(connect, [victim_id, *others], 20)
    _wait("the victim's status", lambda: (kube.get("bookies", NS, victim).get("status") or {}).get("pod"))
    deleted = time.perf_counter()
    kube.delete("pods", NS, victim)
    for claim in resources.claim_names(victim):
        kube.delete("persistentvolumeclaims", NS, claim)
    _wait("the repair Job", lambda: kube.list("jobs", NS))
    loss_to_job = time.perf_counter() - deleted - args.delay
    with zkclient.session(connect) as zk:
        marked = len(UnderReplication(zk).ledger_ids())
        on_victim = len(MetadataStore(zk).ledgers_on_bookie(victim_id))

    large_pods = _all_pods_seconds(kube, "large", args.large_bookies, connect, 3600)
    large_ids = [b["spec"]["bookieId"] for b in kube.list("bookies", NS, f"{resources.LABEL_CLUSTER}=large")]
    started = time.perf_counter()
    _create_ledgers(connect, large_ids, args.large_ledgers)
    ledgers_seconds = time.perf_counter() - started
    _wait("ledger counts on every bookie", lambda: all(
        (b.get("status") or {}).get("ledgers") for b in kube.list("bookies", NS, f"{resources.LABEL_CLUSTER}=large")
    ), timeout=300)
    time.sleep(3 * args.interval)  # a few more full reconciliation rounds at that size
    rss, peak = operator_scale.rss_mb(pid)
    return {
        "apply_to_pods_s": round(apply_to_pods, 3),
        "loss_to_repair_job_s": round(loss_to_job, 3),
        "ledgers_marked": marked,
        "ledgers_on_lost_bookie": on_victim,
        "large_bookies": args.large_bookies,
        "large_ledgers": args.large_ledgers,
        "large_apply_to_pods_s": round(large_pods, 3),
        "large_ledger_creation_s": round(ledgers_seconds, 3),
        "operator_rss_mb": round(rss, 1),
        "operator_peak_rss_mb": round(peak, 1),
    }
