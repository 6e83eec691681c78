"""Manifest builders: valid Kubernetes objects with stable names, the right labels, probes and owners."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bookfleet import __version__, spark
from bookfleet.bookie import config as bookie_config
from bookfleet.cli import build_parser
from bookfleet.kube import resources
from bookfleet.kube.models import BOOKIE_CONFIG_KEYS, Bookie, BookieCluster, Ledger, Retention
from bookfleet.meta.zk import ZK_TLS_DIR_ENV
from bookfleet.replication import spark_repair
from bookfleet.security.tls import TLS_DIR_ENV
from tests.fixtures.models import bookie_cluster

LOST = dt.datetime(2024, 5, 1, 12, 30, 15, 250_000, tzinfo=dt.UTC)


def stored(manifest: dict[str, Any], uid: str) -> dict[str, Any]:
    """The manifest as the API server returns it after create: with a uid."""
    return {**manifest, "metadata": {**manifest["metadata"], "uid": uid}}


@pytest.fixture
def cluster() -> BookieCluster:
    return bookie_cluster(
        4, name="demo", namespace="storage", uid="cluster-uid", zookeeper="zk.storage.svc:2181",
        zones=["zone-a", "zone-b", "zone-c"],
        antiAffinity="required",
        resources={"requests": {"cpu": 1, "memory": "1Gi"}},
        storage={"ledgers": {"size": "5Gi", "storageClassName": "fast"}},
        bookie={"extraArgs": ["--max-in-flight", "500"]},
        autoRecovery={"repair": {"executors": 3, "executorMemory": "2g", "throttleMbPerS": 50}},
        security={"tls": "Disabled"},  # TLS wiring: tests/kube/test_certificates.py
    )


@pytest.fixture
def bookie(cluster: BookieCluster) -> Bookie:
    return Bookie.model_validate(stored(resources.bookies_for_cluster(cluster)[1], "bookie-uid"))


def valid(manifest: dict[str, Any]) -> dict[str, Any]:
    kubernetes_validate.validate(manifest, "1.30", strict=True)
    return manifest


def owner(manifest: dict[str, Any]) -> tuple[str, str, str]:
    (reference,) = manifest["metadata"]["ownerReferences"]
    assert reference["controller"] is True and reference["blockOwnerDeletion"] is True
    return reference["kind"], reference["name"], reference["uid"]


def test_bookies_of_a_cluster_have_stable_names_and_round_robin_zones(cluster: BookieCluster) -> None:
    bookies = [Bookie.model_validate(manifest) for manifest in resources.bookies_for_cluster(cluster)]
    assert [b.metadata.name for b in bookies] == ["demo-0", "demo-1", "demo-2", "demo-3"]
    assert [b.spec.zone for b in bookies] == ["zone-a", "zone-b", "zone-c", "zone-a"]
    assert bookies[2].spec.bookie_id == "demo-2.demo-bookies.storage.svc:3181"
    assert bookies[0].spec.storage.ledgers.storage_class_name == "fast"
    assert bookies[0].metadata.labels[resources.LABEL_CLUSTER] == "demo"
    assert owner(resources.bookies_for_cluster(cluster)[0]) == ("BookieCluster", "demo", "cluster-uid")


def test_bookie_pod(cluster: BookieCluster, bookie: Bookie) -> None:
    pod = valid(resources.bookie_pod(cluster, bookie))
    assert pod["metadata"]["name"] == "demo-1" and pod["metadata"]["namespace"] == "storage"
    assert owner(pod) == ("Bookie", "demo-1", "bookie-uid")
    pod_labels = pod["metadata"]["labels"]
    assert pod_labels.items() >= {**resources.BOOKIE_POD_SELECTOR, "bookfleet.io/cluster": "demo"}.items()
    assert pod_labels["bookfleet.io/bookie"] == "demo-1"
    spec = pod["spec"]
    assert (spec["hostname"], spec["subdomain"]) == ("demo-1", resources.service_name("demo"))
    assert spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    command = container["command"]
    assert command[:2] == ["bookfleet", "bookie"]
    flags = dict(zip(command[2::2], command[3::2], strict=False))
    assert flags["--id"] == flags["--advertised-address"] == "demo-1.demo-bookies.storage.svc:3181"
    assert (flags["--zk"], flags["--zone"], flags["--port"], flags["--http-port"]) == (
        "zk.storage.svc:2181",
        "zone-b",
        "3181",
        "8000",
    )
    assert flags["--listen-host"] == "0.0.0.0"
    assert (flags["--journal-dir"], flags["--ledger-dir"]) == ("/data/journal", "/data/ledgers")
    assert flags["--disk-quota"] == str(5 * 2**30)
    assert command[-2:] == ["--max-in-flight", "500"]
    parsed = build_parser().parse_args(command[1:])
    assert (parsed.command, parsed.bookie_id, parsed.disk_quota) == ("bookie", flags["--id"], 5 * 2**30)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["resources"] == {"requests": {"cpu": 1, "memory": "1Gi"}, "limits": {}}
    zone_term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert zone_term == [{"matchExpressions": [{"key": resources.ZONE_LABEL, "operator": "In", "values": ["zone-b"]}]}]
    (spread,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert spread["topologyKey"] == resources.HOSTNAME_LABEL
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if v["name"] != "tmp"}
    assert claims == {"journal": "demo-1-journal", "ledgers": "demo-1-ledgers"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {**resources.VOLUMES, "tmp": "/tmp"}, "the data volumes and /tmp are the only writable paths"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["automountServiceAccountToken"] is False
    assert spec["shareProcessNamespace"] is True, "the bookie is not PID 1: a SIGTERM before its handler still ends it"
    assert "topologySpreadConstraints" not in spec, "explicit zones pin each bookie already"


def test_bookies_without_zones_spread_over_zones_and_get_default_resources(cluster: BookieCluster) -> None:
    unzoned = BookieCluster.model_validate(
        {"metadata": {"name": "flat", "namespace": "storage", "uid": "u"}, "spec": {"zookeeper": "zk:2181"}}
    )
    bookie = Bookie.model_validate(stored(resources.bookies_for_cluster(unzoned)[0], "bookie-uid"))
    spec = valid(resources.bookie_pod(unzoned, bookie))["spec"]
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == resources.ZONE_LABEL and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"][resources.LABEL_CLUSTER] == "flat"
    (container,) = spec["containers"]
    assert container["resources"]["requests"].keys() == container["resources"]["limits"].keys() == {"cpu", "memory"}


def test_bookie_probes_allow_for_a_busy_event_loop(cluster: BookieCluster) -> None:
    """The probes share the event loop of the data path: each waits seconds (not the 1 s default) for an answer,
    and liveness restarts a bookie only after a minute of silence."""
    bookie = Bookie.model_validate(stored(resources.bookies_for_cluster(cluster)[0], "bookie-uid"))
    (container,) = resources.bookie_pod(cluster, bookie)["spec"]["containers"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe].get("timeoutSeconds", 1) >= 5, probe
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60


def test_disruption_budget_allows_max_unavailable_bookies_down(cluster: BookieCluster) -> None:
    budget = valid(resources.bookie_disruption_budget(cluster))
    assert budget["spec"]["minAvailable"] == 3, "4 replicas, maxUnavailable 1 by default"
    assert owner(budget)[0] == "BookieCluster"
    bookie = Bookie.model_validate(stored(resources.bookies_for_cluster(cluster)[0], "bookie-uid"))
    pod_labels = resources.bookie_pod(cluster, bookie)["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    wide = cluster.model_copy(update={"spec": cluster.spec.model_copy(update={"max_unavailable": 9})})
    assert resources.bookie_disruption_budget(wide)["spec"]["minAvailable"] == 0


def selects(selector: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    return selector.get("matchLabels", {}).items() <= pod_labels.items()


def admits(policy: dict[str, Any], pod_labels: dict[str, str], port: int, same_namespace: bool = True) -> bool:
    """Whether a NetworkPolicy lets a pod with these labels reach `port` (matchLabels peers only)."""
    for rule in policy["spec"]["ingress"]:
        if "ports" in rule and port not in {p["port"] for p in rule["ports"]}:
            continue
        if "from" not in rule:
            return True
        for peer in rule["from"]:
            namespace_ok = same_namespace or "namespaceSelector" in peer
            if namespace_ok and selects(peer["podSelector"], pod_labels):
                return True
    return False


def test_bookie_port_only_for_the_fleet_and_labelled_clients(cluster: BookieCluster, bookie: Bookie) -> None:
    bookies_policy, repair_policy = (valid(policy) for policy in resources.network_policies(cluster))
    pod = resources.bookie_pod(cluster, bookie)
    assert selects(bookies_policy["spec"]["podSelector"], pod["metadata"]["labels"])
    assert bookies_policy["spec"]["policyTypes"] == ["Ingress"], "everything not allowed is denied"
    port, http = cluster.spec.bookie.port, cluster.spec.bookie.http_port
    job = resources.repair_job(cluster, bookie, LOST)
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    conf = dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")
    executor = {k.removeprefix("spark.kubernetes.executor.label."): v for k, v in conf.items() if ".label." in k}
    operator = {resources.LABEL_NAME: "bookfleet", resources.LABEL_COMPONENT: "operator"}
    for peer in (pod["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"], executor):
        assert admits(bookies_policy, peer, port)
    assert not admits(bookies_policy, operator, port, same_namespace=False)  # it never connects to a bookie
    assert not admits(bookies_policy, operator, port)
    assert admits(bookies_policy, {resources.CLIENT_LABEL: "true"}, port)
    assert not admits(bookies_policy, {"app": "curious"}, port)
    assert not admits(bookies_policy, {resources.CLIENT_LABEL: "true"}, port, same_namespace=False)
    other_cluster = {**pod["metadata"]["labels"], resources.LABEL_CLUSTER: "other"}
    assert not admits(bookies_policy, other_cluster, port)
    assert admits(bookies_policy, {"app": "prometheus"}, http), "probes and metrics stay reachable"
    driver = job["spec"]["template"]["metadata"]["labels"]
    assert all(selects(repair_policy["spec"]["podSelector"], pod_labels) for pod_labels in (driver, executor))
    assert admits(repair_policy, executor, resources.DRIVER_PORT) and admits(repair_policy, driver, 40000)
    assert not admits(repair_policy, pod["metadata"]["labels"], resources.DRIVER_PORT)
    kinds = [obj["kind"] for obj in resources.cluster_objects(cluster)]
    assert kinds == ["Service", "PodDisruptionBudget", "NetworkPolicy", "NetworkPolicy"]


def in_namespace(peer: dict[str, Any], namespace_labels: dict[str, str], pod_labels: dict[str, str]) -> bool:
    """Whether a NetworkPolicy peer with a namespaceSelector admits a pod of another namespace (matchLabels only)."""
    return ("namespaceSelector" in peer and selects(peer["namespaceSelector"], namespace_labels)
            and selects(peer.get("podSelector", {}), pod_labels))


def test_clients_of_other_namespaces_and_switching_policies_off(cluster: BookieCluster) -> None:
    """Pulsar brokers run in their own namespace: spec.networkPolicy.clients admits them on the bookie port; with
    enabled false the operator builds no NetworkPolicies at all (it deletes its own, clusters.apply_owned_objects)."""
    brokers = {"app": "pulsar-broker"}
    pulsar = {"kubernetes.io/metadata.name": "pulsar"}
    port = cluster.spec.bookie.port
    (bookies_policy, _) = resources.network_policies(cluster)
    assert not any(in_namespace(peer, pulsar, brokers) for rule in bookies_policy["spec"]["ingress"]
                   for peer in rule.get("from", []))
    opened = BookieCluster.model_validate({**cluster.to_wire(), "spec": {**cluster.spec.to_wire(), "networkPolicy": {
        "clients": [{"namespaceSelector": {"matchLabels": pulsar}, "podSelector": {"matchLabels": brokers}}]}}})
    (bookies_policy, _) = (valid(policy) for policy in resources.network_policies(opened))
    (rule,) = [rule for rule in bookies_policy["spec"]["ingress"] if rule["ports"][0]["port"] == port]
    assert any(in_namespace(peer, pulsar, brokers) for peer in rule["from"])
    assert not any(in_namespace(peer, pulsar, {"app": "other"}) for peer in rule["from"])
    closed = BookieCluster.model_validate({**cluster.to_wire(), "spec": {**cluster.spec.to_wire(),
                                                                        "networkPolicy": {"enabled": False}}})
    assert [obj["kind"] for obj in resources.cluster_objects(closed)] == ["Service", "PodDisruptionBudget"]


def test_bookie_pvcs_and_headless_service(cluster: BookieCluster, bookie: Bookie) -> None:
    journal, ledgers = (valid(pvc) for pvc in resources.bookie_pvcs(cluster, bookie))
    assert [journal["metadata"]["name"], ledgers["metadata"]["name"]] == ["demo-1-journal", "demo-1-ledgers"]
    assert "ownerReferences" not in journal["metadata"]  # Retain by default: they outlive the Bookie and the cluster
    deleting = cluster.model_copy(deep=True)
    deleting.spec.persistent_volume_claim_retention_policy.when_deleted = Retention.DELETE
    assert all(owner(pvc) == ("Bookie", "demo-1", "bookie-uid") for pvc in resources.bookie_pvcs(deleting, bookie))
    assert journal["spec"]["resources"]["requests"]["storage"] == "2Gi" and "storageClassName" not in journal["spec"]
    assert ledgers["spec"]["storageClassName"] == "fast"
    service = valid(resources.bookies_service(cluster))
    assert service["metadata"]["name"] == "demo-bookies" and owner(service)[0] == "BookieCluster"
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    pod_labels = resources.bookie_pod(cluster, bookie)["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_repair_names_are_deterministic(cluster: BookieCluster, bookie: Bookie) -> None:
    name = resources.repair_name("demo", "demo-1", LOST)
    same_second_elsewhere = LOST.replace(microsecond=0).astimezone(dt.timezone(dt.timedelta(hours=2)))
    assert name == resources.repair_name("demo", "demo-1", same_second_elsewhere)
    assert name != resources.repair_name("demo", "demo-1", LOST + dt.timedelta(seconds=1))
    assert name != resources.repair_name("demo", "demo-1", LOST, attempt=1)
    assert name != resources.repair_name("other", "demo-1", LOST)
    assert name.startswith("demo-1-repair-")
    assert len(resources.repair_name("c" * 80, "b" * 80, LOST)) <= resources.MAX_NAME
    assert resources.repair_job(cluster, bookie, LOST)["metadata"]["name"] == name


def test_repair_job_runs_spark_submit_on_kubernetes_in_client_mode(cluster: BookieCluster, bookie: Bookie) -> None:
    job = valid(resources.repair_job(cluster, bookie, LOST, ledgers=[7, 9]))
    assert owner(job) == ("BookieCluster", "demo", "cluster-uid")
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "repair"
    assert job["metadata"]["annotations"][resources.ANNOTATION_LOST_SINCE] == "2024-05-01T12:30:15+00:00"
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "bookfleet-repair" and pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["image"] == resources.repair_image(cluster) == f"bookfleet/repair:{__version__}"
    command = container["command"]
    assert command[0] == "spark-submit"
    options = dict(zip(command[1::2], command[2::2], strict=False))
    assert options["--master"] == "k8s://https://kubernetes.default.svc"
    assert options["--deploy-mode"] == "client"
    conf = dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")
    assert conf["spark.kubernetes.namespace"] == "storage"
    assert conf["spark.kubernetes.container.image"] == resources.repair_image(cluster)
    assert conf["spark.executor.instances"] == "3" and conf["spark.executor.memory"] == "2g"
    assert conf["spark.driver.host"] == "$(POD_IP)" and conf["spark.kubernetes.driver.pod.name"] == "$(POD_NAME)"
    # Executors connect to the bind address on Spark 4 (seen on a real cluster: 0.0.0.0:7078, connection refused).
    assert conf["spark.driver.bindAddress"] == "$(POD_IP)"
    assert conf["spark.driver.extraJavaOptions"] == "-XX:TieredStopAtLevel=1"  # a one-run JVM: C1 only, less start CPU
    assert job["spec"]["activeDeadlineSeconds"] == 3600 and job["spec"]["backoffLimit"] == 3
    assert job["spec"]["ttlSecondsAfterFinished"] == 86400  # finished repairs do not pile up
    assert conf["spark.kubernetes.driver.service.deleteOnTermination"] == "false"  # it may not touch services
    assert container["resources"] == cluster.spec.auto_recovery.repair.driver_resources.to_wire()
    assert container["resources"]["limits"]["memory"] and container["resources"]["requests"]["cpu"]
    template_path = conf["spark.kubernetes.executor.podTemplateFile"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (template_volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert template_path.startswith(mounts[template_volume["name"]] + "/")
    assert template_volume["configMap"]["name"] == resources.executor_template_name(cluster)
    assert conf["spark.kubernetes.executor.limit.cores"] == conf["spark.kubernetes.executor.request.cores"] == "1"
    assert {env["name"] for env in container["env"]} == {"POD_IP", "POD_NAME"}
    application = next(arg for arg in command if arg.endswith("spark_repair.py"))
    assert not application.startswith("local://"), "client mode reads the application from the driver's disk"
    app_args = command[command.index(application) + 1 :]
    assert app_args[:2] == ["--zk", "zk.storage.svc:2181"]
    parsed = repair_flags(app_args)
    assert (parsed.zk, list(parsed.ledgers), parsed.throttle_mb_s) == ("zk.storage.svc:2181", [7, 9], 50.0)
    assert parsed.lock_wait_s == spark.DEFAULT_LOCK_WAIT_S < job["spec"]["activeDeadlineSeconds"]
    # A plan of at most the limit runs in the driver with the executors' cores (3 x 1), a larger one on executors.
    assert (parsed.local_max_mb, parsed.local_cores) == (spark.DEFAULT_LOCAL_MODE_MAX_MB, 3)


def test_a_repair_drivers_lock_wait_ends_well_before_its_jobs_deadline(cluster: BookieCluster, bookie: Bookie) -> None:
    """A driver waiting for another repair's locks ends by itself, Succeeded, instead of being failed by Kubernetes
    mid-wait: its wait is at most half the Job's activeDeadlineSeconds."""
    repair = {**cluster.spec.auto_recovery.repair.to_wire(), "activeDeadlineSeconds": 300}
    short = overridden(cluster, autoRecovery={**cluster.spec.auto_recovery.to_wire(), "repair": repair})
    command = resources.repair_job(short, bookie, LOST)["spec"]["template"]["spec"]["containers"][0]["command"]
    application = next(arg for arg in command if arg.endswith("spark_repair.py"))
    assert repair_flags(command[command.index(application) + 1 :]).lock_wait_s == 150
    assert repair_flags(resources.spark_application(short, bookie, LOST)["spec"]["arguments"]).lock_wait_s == 150


def repair_flags(app_args: list[str]) -> argparse.Namespace:
    """The repair driver's flags as it parses them."""
    parser = argparse.ArgumentParser()
    spark_repair.add_arguments(parser)
    return parser.parse_args(app_args)


def test_spark_application_variant(cluster: BookieCluster, bookie: Bookie) -> None:
    app = resources.spark_application(cluster, bookie, LOST, ledgers=[7])
    assert app["apiVersion"] == "sparkoperator.k8s.io/v1beta2" and app["kind"] == "SparkApplication"
    assert app["metadata"]["name"] == resources.repair_name("demo", "demo-1", LOST)
    spec = app["spec"]
    assert (spec["type"], spec["mode"], spec["image"]) == ("Python", "cluster", resources.repair_image(cluster))
    assert spec["mainApplicationFile"].startswith("local://")
    assert spec["arguments"][:2] == ["--zk", "zk.storage.svc:2181"]
    assert spec["driver"]["serviceAccount"] == "bookfleet-repair"
    # driverResources, as the Job's driver gets them (the default: 500m/2 CPUs, 1536Mi requested), not 1 CPU/512m
    driver = {key: spec["driver"][key] for key in ("cores", "coreRequest", "coreLimit", "memory")}
    assert driver == {"cores": 1, "coreRequest": "500m", "coreLimit": "2", "memory": "1536m"}
    assert (spec["executor"]["instances"], spec["executor"]["memory"]) == (3, "2g")
    assert spec["timeToLiveSeconds"] == 86400
    assert owner(app) == ("BookieCluster", "demo", "cluster-uid")


def test_a_repair_driver_serves_its_counters_on_a_named_port_scrapers_may_reach(cluster: BookieCluster,
                                                                                   bookie: Bookie) -> None:
    """The dashboard's repair panels: the driver (Job or SparkApplication) serves bookfleet_repair_* on the port the
    chart's repair PodMonitor names, lingering for one more scrape; the repair NetworkPolicy lets a scraper in."""
    job = resources.repair_job(cluster, bookie, LOST)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert {"name": "metrics", "containerPort": resources.METRICS_PORT, "protocol": "TCP"} in container["ports"]
    application = next(arg for arg in container["command"] if arg.endswith("spark_repair.py"))
    flags = repair_flags(container["command"][container["command"].index(application) + 1 :])
    assert (flags.metrics_port, flags.metrics_linger_s) == (resources.METRICS_PORT, resources.METRICS_LINGER_S)
    app = resources.spark_application(cluster, bookie, LOST)
    assert repair_flags(app["spec"]["arguments"]).metrics_port == resources.METRICS_PORT
    assert app["spec"]["driver"]["ports"] == [resources.METRICS_CONTAINER_PORT]
    _, repair_policy = resources.network_policies(cluster)
    assert admits(repair_policy, {"app": "prometheus"}, resources.METRICS_PORT)
    assert not admits(repair_policy, {"app": "prometheus"}, resources.DRIVER_PORT)


def test_the_config_keys_are_the_bookies_own_flags_but_those_the_operator_sets() -> None:
    """models.BOOKIE_CONFIG_KEYS is written down in kube (which may not import the bookie): held here to the bookie's
    flags, less those bookie_command sets (TLS on, a zone) and the two a cluster must never set."""
    parser = argparse.ArgumentParser()
    bookie_config.add_arguments(parser)
    flags = {action.option_strings[0] for action in parser._actions if action.option_strings} - {"-h"}
    zoned = bookie_cluster(1, zones=["zone-a"])
    command = resources.bookie_command(zoned, Bookie.model_validate(resources.bookies_for_cluster(zoned)[0]))
    managed = {arg for arg in command if arg.startswith("--")}
    assert "--tls-dir" in managed
    assert {f"--{key}" for key in BOOKIE_CONFIG_KEYS} == flags - managed - {"--no-verify-ledgers", "--http-tls"}


def test_repair_namespace_objects_are_namespaced_and_minimal(cluster: BookieCluster) -> None:
    template, account, role, binding = (valid(obj) for obj in resources.repair_namespace_objects(cluster))
    assert (account["kind"], role["kind"], binding["kind"]) == ("ServiceAccount", "Role", "RoleBinding")
    assert template["metadata"]["name"] == resources.executor_template_name(cluster)
    assert owner(template) == ("BookieCluster", "demo", "cluster-uid")  # deleted with its cluster, not left behind
    twin = cluster.model_copy(update={"metadata": cluster.metadata.model_copy(update={"name": "twin"})})
    assert resources.executor_template_name(twin) != template["metadata"]["name"]  # each cluster owns its own
    executor = yaml.safe_load(template["data"][resources.EXECUTOR_TEMPLATE_FILE])
    assert executor == resources.executor_pod_template(cluster)
    assert executor["spec"]["containers"][0]["name"] == resources.EXECUTOR_CONTAINER
    assert {resource for rule in role["rules"] for resource in rule["resources"]} == {"pods", "configmaps"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "bookfleet-repair", "namespace": "storage"}]


def test_owner_references_need_a_stored_owner() -> None:
    ledger = Ledger.model_validate({"metadata": {"name": "l1"}, "spec": {"cluster": "demo"}})
    with pytest.raises(ValueError, match="Ledger 'l1' has no uid yet"):
        resources.owner_reference(ledger)
    body = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "Ledger", "metadata": {"name": "l1", "uid": "u"}}
    assert resources.owner_reference(body)["uid"] == "u"


def test_quantities() -> None:
    assert resources.quantity_bytes("10Gi") == 10 * 2**30
    assert resources.quantity_bytes("500M") == 500 * 10**6
    assert resources.quantity_bytes(1024) == 1024
    assert resources.quantity_bytes("1.5Ki") == 1536
    with pytest.raises(ValueError, match="'10GB' is not a storage quantity"):
        resources.quantity_bytes("10GB")


OVERRIDES = {
    "labels": {"team": "storage", resources.LABEL_COMPONENT: "mine"},
    "annotations": {"cost-center": "42"},
    "nodeSelector": {"pool": "storage"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "storage", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["nvme"]}]}]}}},
    "priorityClassName": "storage-critical",
    "imagePullSecrets": ["registry"],
    "serviceAccountName": "custom",
}


def overridden(cluster: BookieCluster, **spec: Any) -> BookieCluster:
    return BookieCluster.model_validate({**cluster.to_wire(), "spec": {**cluster.spec.to_wire(), **spec}})


def assert_overrides(metadata: dict[str, Any], pod_spec: dict[str, Any], component: str) -> None:
    assert metadata["labels"]["team"] == "storage" and metadata["labels"][resources.LABEL_COMPONENT] == component
    assert metadata["annotations"]["cost-center"] == "42"
    assert pod_spec["nodeSelector"] == {"pool": "storage"} and pod_spec["tolerations"] == OVERRIDES["tolerations"]
    assert pod_spec["priorityClassName"] == "storage-critical"
    assert pod_spec["imagePullSecrets"] == [{"name": "registry"}] and pod_spec["serviceAccountName"] == "custom"


def test_bookie_pods_take_the_clusters_pod_template(cluster: BookieCluster) -> None:
    """Tolerations, node selection, priority, pull secrets, identity: what a real cloud's node pools need. The
    operator's labels win (selectors rely on them) and its zone pinning is ANDed with the user's node terms."""
    custom = overridden(cluster, podTemplate=OVERRIDES)
    bookie = Bookie.model_validate(stored(resources.bookies_for_cluster(custom)[1], "bookie-uid"))
    pod = valid(resources.bookie_pod(custom, bookie))
    assert_overrides(pod["metadata"], pod["spec"], resources.BOOKIE)
    (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert [e["key"] for e in term["matchExpressions"]] == [resources.ZONE_LABEL, "disk"]
    assert "podAntiAffinity" in pod["spec"]["affinity"], "bookies still spread over nodes"
    plain = resources.bookie_pod(cluster, Bookie.model_validate(stored(resources.bookies_for_cluster(cluster)[1],
                                                                       "bookie-uid")))
    assert plain["metadata"]["annotations"][resources.ANNOTATION_CONFIG_HASH] != pod["metadata"]["annotations"][
        resources.ANNOTATION_CONFIG_HASH], "a new pod template rolls the bookies"


def test_repair_drivers_and_executors_take_their_pod_templates(cluster: BookieCluster, bookie: Bookie) -> None:
    repair = {**cluster.spec.auto_recovery.repair.to_wire(), "driverPodTemplate": OVERRIDES,
              "executorPodTemplate": {**OVERRIDES, "serviceAccountName": None}}
    custom = overridden(cluster, autoRecovery={**cluster.spec.auto_recovery.to_wire(), "repair": repair})
    job = valid(resources.repair_job(custom, bookie, LOST))
    assert_overrides(job["spec"]["template"]["metadata"], job["spec"]["template"]["spec"], resources.REPAIR)
    executor = resources.executor_pod_template(custom)
    assert executor["metadata"]["labels"]["team"] == "storage"
    assert executor["spec"]["tolerations"] == OVERRIDES["tolerations"] and "serviceAccountName" not in executor["spec"]
    assert executor["spec"]["imagePullSecrets"] == [{"name": "registry"}]
    assert resources.executor_template_name(custom) != resources.executor_template_name(cluster)
    (template,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    assert template["configMap"]["name"] == resources.executor_template_name(custom)
    app = resources.spark_application(custom, bookie, LOST)["spec"]
    for side in ("driver", "executor"):
        assert app[side]["tolerations"] == OVERRIDES["tolerations"] and app[side]["nodeSelector"] == {"pool": "storage"}
        assert app[side]["priorityClassName"] == "storage-critical" and app[side]["labels"]["team"] == "storage"
        assert app[side]["labels"][resources.LABEL_COMPONENT] == resources.REPAIR
    assert app["driver"]["serviceAccount"] == "custom" and app["imagePullSecrets"] == ["registry"]


def test_a_zookeeper_tls_secret_reaches_every_zookeeper_session_of_the_cluster(cluster: BookieCluster,
                                                                                bookie: Bookie) -> None:
    """spec.security.zookeeperTlsSecret: the bookie and the repair driver (Job or SparkApplication) get the Secret
    mounted whole and $BOOKFLEET_ZK_TLS_DIR pointing at it, beside the cluster's own TLS directory; executors, which
    never open a ZooKeeper session, get neither. Setting it changes what the bookie runs, so the bookies roll."""
    security = {"tls": "Operator", "zookeeperTlsSecret": "zk-client"}
    secure = overridden(cluster, security=security)
    zk_tls_env = {"name": ZK_TLS_DIR_ENV, "value": resources.ZK_TLS_DIR}

    def zookeeper_tls(container: dict[str, Any], volumes: list[dict[str, Any]]) -> dict[str, Any]:
        """The ZooKeeper TLS mount's volume, checked to be the Secret at ZK_TLS_DIR beside the bookie TLS one."""
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts[resources.ZK_TLS_DIR]["readOnly"] and resources.TLS_DIR in mounts
        assert len({v["name"] for v in volumes}) == len(volumes)
        (volume,) = [v for v in volumes if v["name"] == mounts[resources.ZK_TLS_DIR]["name"]]
        return volume["secret"]

    pod = valid(resources.bookie_pod(secure, bookie))
    (container,) = pod["spec"]["containers"]
    assert zk_tls_env in container["env"]
    assert zookeeper_tls(container, pod["spec"]["volumes"])["secretName"] == "zk-client"
    plain = resources.bookie_pod(overridden(cluster, security={"tls": "Operator"}), bookie)
    (plain_container,) = plain["spec"]["containers"]
    assert zk_tls_env not in plain_container.get("env", [])
    assert resources.ZK_TLS_DIR not in {m["mountPath"] for m in plain_container["volumeMounts"]}
    assert resources.runs_hash(secure, pod) != resources.runs_hash(cluster, plain)

    job = valid(resources.repair_job(secure, bookie, LOST))["spec"]["template"]["spec"]
    (driver,) = job["containers"]
    assert zk_tls_env in driver["env"]
    assert zookeeper_tls(driver, job["volumes"])["secretName"] == "zk-client"
    executor_conf = [arg for arg in driver["command"] if "executor" in arg]
    assert not [arg for arg in executor_conf if "zk-client" in arg or ZK_TLS_DIR_ENV in arg]
    assert [arg for arg in executor_conf if TLS_DIR_ENV in arg], "executors still get the bookie TLS directory"

    conf = resources.spark_application(secure, bookie, LOST)["spec"]["sparkConf"]
    assert conf["spark.kubernetes.driver.secrets.zk-client"] == resources.ZK_TLS_DIR
    assert conf[f"spark.kubernetes.driverEnv.{ZK_TLS_DIR_ENV}"] == resources.ZK_TLS_DIR
    assert not [key for key in conf if key.startswith("spark.kubernetes.executor") and "zk-client" in key]
    assert f"spark.executorEnv.{ZK_TLS_DIR_ENV}" not in conf
