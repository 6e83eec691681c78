"""`make cluster-pulsar`: Apache Pulsar's broker as a pod of the local cluster, keeping its topics on the bookies of
a BookieCluster the chart's operator runs (issue 40, item 2); the figures as one JSON line.

The chart and its BookieCluster are installed as the tier installs them (walkthrough.install), but with no
ZooKeeper credential: the broker's ZooKeeper and BookKeeper clients cannot present one (docs/bookkeeper.md). The
bookies keep their mutual TLS: the broker presents a client certificate the operator issues from the cluster's CA.
The broker (the `pulsar` image of scripts/build-images.sh, from the jars tests/pulsar runs) and its metadata setup
Job run on the system node. Pulsar's Python client runs here, on the host, against the broker pod's IP (the host
reaches every pod by its node's route): the same producer and consumer as the standalone run (tests/pulsar), no
image of its own. While it produces, the bookie first in a current ledger's ensemble loses its pod and volumes; the
operator marks its ledgers and its Spark repair Job copies them; then every message is consumed back and looked
for in the entry bookfleet's client reads (from a client pod) at its acknowledged MessageId.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import pulsar

from bookfleet.kube import resources
from bookfleet.polling import wait_for
from tests.cluster import realnode
from tests.cluster.walkthrough import (
    CLUSTER,
    NAMESPACE,
    LocalCluster,
    apply_settings,
    bookie_cluster,
    client_secret,
    install,
    issue_client_certificate,
    lose_bookie,
    new_repair_jobs,
    ready,
    run_client,
    running_cluster,
    say,
    scale,
    server_seconds,
)
from tests.pulsar.broker import CLUSTER as PULSAR_CLUSTER
from tests.pulsar.broker import METADATA_ROOT, admin, broker_settings, healthy
from tests.pulsar.migration import paced
from tests.pulsar.scenario import NAMESPACE as PULSAR_NAMESPACE
from tests.pulsar.scenario import QUIET, Produced, consume, order_figures, p99, payload, produce

BROKER = "pulsar-broker"
SETUP = "pulsar-setup"
CONF = "pulsar-broker-conf"
CONF_DIR = "/etc/pulsar"
LIB = "/opt/pulsar/lib/*"
"""The broker's jars in the pulsar image (pulsar-image/Dockerfile)."""
BROKER_PORT, WEB_PORT = 6650, 8080
JVM = ("-Xms256m", "-Xmx512m", "-XX:MaxDirectMemorySize=256m", "-XX:+UseSerialGC")
"""The JDK 17 flags are the image's (JDK_JAVA_OPTIONS)."""
TOPIC = "on-kubernetes"
LOST_BOOKIE_DELAY = 10
"""lostBookieRecoveryDelaySeconds: the operator marks the lost bookie's ledgers this long after it is gone."""


def broker_conf(zk: str) -> str:
    """tests/pulsar's broker settings on the cluster's ZooKeeper, listening on the pod's addresses (the advertised one,
    the pod IP, is added at start), with mutual TLS to the bookies: the client certificate mounted at TLS_DIR."""
    tls = resources.TLS_DIR
    settings = {
        **broker_settings(zk, BROKER_PORT, WEB_PORT),
        "bindAddress": "0.0.0.0",
        "bookkeeperTLSClientAuthentication": "true",
        "bookkeeperTLSProviderFactoryClass": "org.apache.bookkeeper.tls.TLSContextFactory",
        "bookkeeperTLSKeyFileType": "PEM",
        "bookkeeperTLSKeyFilePath": f"{tls}/{resources.KEY_KEY}",
        "bookkeeperTLSCertificateFilePath": f"{tls}/{resources.CERT_KEY}",
        "bookkeeperTLSTrustCertTypes": "PEM",
        "bookkeeperTLSTrustCertsFilePath": f"{tls}/{resources.CA_KEY}",
        # Pulsar hands `bookkeeper_<name>` to its BookKeeper client as `<name>`: the JDK's TLS (docs/bookkeeper.md),
        # and each bookie's certificate checked against the name it registered.
        "bookkeeper_tlsProvider": "JDK",
        "bookkeeper_hostnameVerificationEnabled": "true",
    }
    del settings["advertisedAddress"]
    return "".join(f"{name}={value}\n" for name, value in settings.items())


def pulsar_image(cluster: LocalCluster) -> str:
    """The pulsar image (built once per content hash) imported into the system node's containerd; its reference."""
    image = realnode.built_image("pulsar")
    seconds = realnode.import_image(realnode.socket_of(realnode.node_state(cluster.state)), image)
    say(f"image {image.reference} imported into {realnode.NAME} in {seconds:.0f} s")
    return image.reference


def pulsar_pod(cluster: LocalCluster, image: str, command: list[str], restart: str) -> dict[str, Any]:
    """A pod spec of the pulsar image on the system node: a client of the BookieCluster (its label, the client
    certificate), broker.conf from its ConfigMap, restricted Pod Security with a writable /tmp only."""
    container = {
        "name": "pulsar", "image": image, "imagePullPolicy": "Never", "command": command,
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "volumeMounts": [resources.tls_mount(), {"name": "conf", "mountPath": CONF_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": resources.container_security_context(),
        "resources": {"requests": {"cpu": "100m", "memory": "768Mi"}, "limits": {"memory": "1536Mi"}},
    }
    return {"restartPolicy": restart, "containers": [container], **realnode.PLACEMENT,
            "volumes": [resources.tls_volume(client_secret(CLUSTER)), {"name": "conf", "configMap": {"name": CONF}},
                        {"name": "tmp", "emptyDir": {}}],
            "securityContext": resources.pod_security_context()}


def start_broker(cluster: LocalCluster, image: str) -> str:
    """Pulsar's metadata setup as a Job (told BookKeeper's side exists: `/ledgers` is left alone), then the broker
    pod; its IP once its health check (a write and read through the bookies) answers ok."""
    zk = bookie_cluster(cluster).spec.zookeeper
    metadata = f"zk:{zk}{METADATA_ROOT}"
    cluster.kubectl("create", "configmap", "-n", NAMESPACE, CONF, f"--from-literal=broker.conf={broker_conf(zk)}")
    labels = {resources.CLIENT_LABEL: "true", "component": "broker"}
    setup = ["java", "-cp", LIB, *JVM, "org.apache.pulsar.PulsarClusterMetadataSetup", "--cluster", PULSAR_CLUSTER,
             "--metadata-store", metadata, "--configuration-metadata-store", metadata,
             "--web-service-url", f"http://{BROKER}:{WEB_PORT}", "--broker-service-url", f"pulsar://{BROKER}:{BROKER_PORT}",
             "--existing-bk-metadata-service-uri", f"zk+hierarchical://{zk}/ledgers"]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": SETUP, "namespace": NAMESPACE},
           "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": labels},
                                                    "spec": pulsar_pod(cluster, image, setup, "Never")}}}
    say("Pulsar's cluster metadata setup Job")
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(job))
    try:
        cluster.kubectl("wait", "-n", NAMESPACE, "--for=condition=Complete", f"job/{SETUP}", "--timeout=300s",
                        timeout=330)
    except AssertionError:
        [pod] = cluster.get("pods", "-n", NAMESPACE, "-l", f"job-name={SETUP}")["items"]
        raise AssertionError(f"{SETUP} did not complete:\n"
                             f"{cluster.container_log(NAMESPACE, pod['metadata']['name'], 'pulsar')[-4000:]}") from None
    start = (f'cat {CONF_DIR}/broker.conf > /tmp/broker.conf && echo "advertisedAddress=$POD_IP" >> /tmp/broker.conf'
             f' && exec java -cp "{LIB}" {" ".join(JVM)} org.apache.pulsar.PulsarBrokerStarter'
             " --broker-conf /tmp/broker.conf")
    spec = pulsar_pod(cluster, image, ["sh", "-c", start], "Always")
    spec["containers"][0]["readinessProbe"] = {
        "httpGet": {"path": "/admin/v2/brokers/health", "port": WEB_PORT}, "periodSeconds": 10, "timeoutSeconds": 5}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": BROKER, "namespace": NAMESPACE, "labels": labels},
           "spec": spec}
    say("the broker pod")
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    started = time.monotonic()

    def up() -> str | None:
        body = cluster.get("pod", "-n", NAMESPACE, BROKER)
        statuses = body["status"].get("containerStatuses") or []
        if any("terminated" in (status.get("lastState") or {}) for status in statuses):
            raise AssertionError(f"the broker exited:\n{cluster.container_log(NAMESPACE, BROKER, 'pulsar')[-4000:]}")
        return ready(body) and healthy(f"http://{body['status']['podIP']}:{WEB_PORT}") and body["status"]["podIP"]

    address = wait_for(up, timeout=600, what="the broker pod Ready and healthy from the host", interval=2.0)
    say(f"broker {address} healthy {time.monotonic() - started:.0f} s after its pod was created")
    return address


def ledger_documents(cluster: LocalCluster, name: str, commands: list[str]) -> list[dict[str, Any]]:
    """`bookfleet <command> --zk <the cluster's> --json` for each command, in one client pod: the JSON lines."""
    zk = bookie_cluster(cluster).spec.zookeeper
    log = run_client(cluster, name, " && ".join(f"bookfleet {command} --zk {zk} --json" for command in commands))
    return [json.loads(line) for line in log.splitlines() if line.startswith(("{", "["))]


def lose_current_bookie(cluster: LocalCluster, ledger_id: int) -> tuple[str, float]:
    """Delete the pod and volumes of the bookie first in a current ledger's last ensemble (the broker's writes then
    change ensembles); its bookie id and the wall-clock time of the deletion."""
    [info] = ledger_documents(cluster, "pulsar-victim", [f"ledger info {ledger_id}"])
    bookie_id = info["segments"][-1]["bookies"][0]
    say(f"deleting bookie pod {bookie_id.split('.')[0]} and its volumes (of ledger {ledger_id})")
    lose_bookie(cluster, bookie_id)
    return bookie_id, time.time()


def watch_operator(cluster: LocalCluster, bookie_id: str, deleted_at: float, timeout: float = 900
                   ) -> dict[str, float]:
    """From the deletion on (the producer running), until a repair Job of the lost bookie has succeeded: seconds
    after the deletion at which its Bookie was first seen Lost (polled: the operator marks its ledgers then), and its
    first succeeded repair Job was created and completed (the Job's own timestamps, whole seconds)."""
    pod = bookie_id.split(".")[0]
    seconds: dict[str, float] = {}

    def repaired() -> bool:
        phase = (cluster.get("bookie", "-n", NAMESPACE, pod).get("status") or {}).get("phase")
        if phase == "Lost" and "bookie_lost" not in seconds:
            seconds["bookie_lost"] = round(time.time() - deleted_at, 1)
            say(f"Bookie {pod} Lost {seconds['bookie_lost']:.0f} s after its pod was deleted")
        jobs = [cluster.get("job", "-n", NAMESPACE, name) for name in new_repair_jobs(cluster, pod, ())]
        done = sorted((job for job in jobs if (job.get("status") or {}).get("completionTime")),
                      key=lambda job: job["metadata"]["creationTimestamp"])
        if not done or "bookie_lost" not in seconds:
            return False
        seconds["repair_job_created"] = round(server_seconds(done[0]["metadata"]["creationTimestamp"], deleted_at))
        seconds["repair_job_completed"] = round(server_seconds(done[0]["status"]["completionTime"], deleted_at))
        say(f"repair Job {done[0]['metadata']['name']} completed {seconds['repair_job_completed']:.0f} s after")
        return True

    wait_for(repaired, timeout=timeout, what=f"a repair Job of {pod} to succeed", interval=2.0)
    return seconds


def lose_and_watch(cluster: LocalCluster, ledger_id: int) -> tuple[str, float, dict[str, float]]:
    """`lose_current_bookie`, then `watch_operator`."""
    bookie_id, deleted_at = lose_current_bookie(cluster, ledger_id)
    return bookie_id, deleted_at, watch_operator(cluster, bookie_id, deleted_at)


def ledgers_naming(cluster: LocalCluster, ledger_ids: set[int], bookie_id: str) -> set[int]:
    """The ledgers among `ledger_ids` marked under-replicated or whose ensembles still name `bookie_id`."""
    [marked, *infos] = ledger_documents(cluster, "pulsar-check", [
        "underreplicated list", *(f"ledger info {ledger_id}" for ledger_id in sorted(ledger_ids))])
    return ({ledger["ledger_id"] for ledger in marked} & ledger_ids) | {
        info["ledger_id"] for info in infos if any(bookie_id in s["bookies"] for s in info["segments"])}


def stored_entries(cluster: LocalCluster, ledger_ids: set[int]) -> dict[int, dict[int, str]]:
    """Every entry of the ledgers as bookfleet's client reads them in a client pod: ledger -> entry -> payload
    (its text, bytes outside ASCII escaped; the messages' payloads are ASCII)."""
    entries: dict[int, dict[int, str]] = {}
    for ledger_id in sorted(ledger_ids):
        documents = ledger_documents(cluster, "pulsar-reader", [f"ledger read {ledger_id}"])
        entries[ledger_id] = {document["entry_id"]: document["payload"] for document in documents}
    return entries


def not_found(entries: dict[int, dict[int, str]], positions: list[tuple[int, int, int]]) -> int:
    """How many (seq, ledger, entry) positions hold no entry with that message's payload inside."""
    return sum(payload(TOPIC, seq).decode() not in entries.get(ledger_id, {}).get(entry_id, "")
               for seq, ledger_id, entry_id in positions)


def run(cluster: LocalCluster, address: str, messages: int, partitions: int, rate: float) -> dict[str, Any]:
    """Produce while a bookie is lost, wait for the operator's repair, consume back; the figures."""
    web_url = f"http://{address}:{WEB_PORT}"
    admin(web_url, "PUT", f"/admin/v2/persistent/{PULSAR_NAMESPACE}/{TOPIC}/partitions", partitions)
    deleting = concurrent.futures.ThreadPoolExecutor(1)
    deletion: list[concurrent.futures.Future] = []

    def delete_bookie(produced: Produced) -> None:
        """In the background: the producer keeps sending while the victim is found and deleted."""
        deletion.append(deleting.submit(lose_and_watch, cluster, produced.last_acked().ledger_id))

    client = pulsar.Client(f"pulsar://{address}:{BROKER_PORT}", logger=QUIET, operation_timeout_seconds=120)
    try:
        say(f"producing {messages} messages at {rate:.0f}/s to {partitions} partitions; a third in, a bookie is lost")
        paced_seqs = itertools.islice(paced(rate, threading.Event()), messages)
        produced = produce(client, TOPIC, paced_seqs, {messages // 3: delete_bookie})
        produce_ended_at = time.time()
        admin(web_url, "PUT", f"/admin/v2/persistent/{PULSAR_NAMESPACE}/{TOPIC}/unload")  # closes its ledgers
        bookie_id, deleted_at, seconds = deletion[0].result()
        seconds["produce_ended"] = round(produce_ended_at - deleted_at, 1)
        ledger_ids = {acked.ledger_id for acked in produced.acked.values()}
        wait_for(lambda: not ledgers_naming(cluster, ledger_ids, bookie_id), timeout=600, interval=5.0,
                 what=f"the topic's ledgers repaired off {bookie_id}")
        seconds["ledgers_seen_repaired"] = round(time.time() - deleted_at, 1)
        expected: dict[int, int] = defaultdict(int)
        for acked in produced.acked.values():
            expected[acked.partition] += 1
        say("consuming every partition from its start")
        received = consume(client, TOPIC, partitions, expected)
    finally:
        client.close()
        deleting.shutdown()
    delivered = [(seq, ledger_id, entry_id) for partition in received.values()
                 for seq, ledger_id, entry_id in partition]
    say("reading the topic's ledgers with bookfleet's client")
    entries = stored_entries(cluster, ledger_ids | {ledger_id for _, ledger_id, _ in delivered})
    duplicates, reordered = order_figures(received)
    latencies = [acked.latency for acked in produced.acked.values()]
    return {
        "messages": messages,
        "partitions": partitions,
        "acked": len(produced.acked),
        "send_failures": produced.failed,
        "lost": len(produced.acked.keys() - {seq for seq, _, _ in delivered}),
        "reordered": reordered,
        "duplicates": duplicates,
        "not_where_acked": not_found(entries, [(seq, a.ledger_id, a.entry_id) for seq, a in produced.acked.items()]),
        "not_in_bookfleet_entry": not_found(entries, delivered),
        "ledgers": len(ledger_ids),
        "deleted_bookie": bookie_id,
        "lost_bookie_recovery_delay_s": LOST_BOOKIE_DELAY,
        "seconds_after_deletion": seconds,
        "repair_jobs": len(new_repair_jobs(cluster, bookie_id.split(".")[0], ())),
        "produce_rate_msg_s": round(len(produced.acked) / (produced.ended - produced.began)),
        "p99_publish_ms": round(p99(latencies) * 1000, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.pulsarpod", description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rate", type=float, default=300.0,
                        help="messages a second: the run lasts through the loss, the mark and the repair's start")
    args = parser.parse_args()
    say("starting the local cluster")
    finished: list[bool] = []
    with running_cluster(keep_logs=lambda: not finished) as cluster:
        if not cluster.real_node():
            print("no real nodes on this machine (see the cluster's log): the broker's image needs containerd",
                  file=sys.stderr)
            return 2
        say(f"helm install into namespace {NAMESPACE}: the chart's BookieCluster, without a ZooKeeper credential")
        install(cluster, zookeeper_credential=False)
        say("4 bookies (one to take a lost one's place), a client certificate for the broker, lost-bookie delay "
            f"{LOST_BOOKIE_DELAY} s")
        scale(cluster, 4)
        issue_client_certificate(cluster)
        apply_settings(cluster, {"autoRecovery": {"lostBookieRecoveryDelaySeconds": LOST_BOOKIE_DELAY}})
        address = start_broker(cluster, pulsar_image(cluster))
        figures = run(cluster, address, args.messages, args.partitions, args.rate)
        finished.append(True)
    print(json.dumps(figures), flush=True)
    clean = not any(figures[name] for name in ("send_failures", "lost", "reordered", "not_where_acked",
                                               "not_in_bookfleet_entry"))
    return 0 if clean and figures["acked"] == args.messages else 1


if __name__ == "__main__":
    sys.exit(main())
