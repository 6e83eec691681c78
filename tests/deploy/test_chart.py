"""The Helm chart: lints clean, renders valid Kubernetes objects with default and with every optional part."""

from __future__ import annotations

import base64
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import prometheus_client
import pytest

from bookfleet.bookie.http import BookieMetrics
from bookfleet.cli import build_parser, main
from bookfleet.kube import crdgen, resources
from bookfleet.kube.models import RESOURCES, Bookie, BookieCluster, cluster_problems
from bookfleet.kube.runtime import metrics
from bookfleet.kube.runtime.api import PLURALS
from bookfleet.zkserver import free_port
from tests.fixtures.manifests import CHART, VALIDATING_ADMISSION_POLICY, operator_objects, render_chart
from tests.fixtures.promql import metric_names

ALL_OPTIONAL = {
    "zookeeper": {"enabled": True, "replicas": 3, "storageClassName": "standard"},
    "bookieCluster": {"enabled": True, "zones": ["zone-a", "zone-b", "zone-c"]},
    "operator": {"watchNamespace": "storage", "extraArgs": ["--verbose"]},
    "metrics": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}},
    "grafanaDashboard": {"enabled": True},
    "alerts": {"always": True},
}
PROMETHEUS_OPERATOR_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
"""monitoring.coreos.com resources: no offline schema, checked by the tests below instead."""
VALUES = {"default": {}, "all-optional": ALL_OPTIONAL}


@pytest.fixture(scope="module")
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


@pytest.fixture(scope="module", params=list(VALUES), ids=list(VALUES))
def rendered(request) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render_chart(VALUES[request.param])


@pytest.mark.parametrize("values", list(VALUES.values()), ids=list(VALUES))
def test_lints_clean(values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, namespace="bookfleet")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_every_rendered_object_is_valid(rendered) -> None:
    name, objects = rendered
    kinds = {obj["kind"] for obj in objects}
    expected = {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Secret"}
    expected |= {"NetworkPolicy", "KopfPeering", "PodDisruptionBudget"}
    expected |= {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    if name == "all-optional":
        expected |= {"StatefulSet", "Service", "BookieCluster", "ConfigMap", "Job", "Pod"}
        expected |= PROMETHEUS_OPERATOR_KINDS
    assert kinds == expected
    for obj in objects:
        if obj["kind"] == "BookieCluster":
            cluster = BookieCluster.model_validate(obj)
            assert cluster.spec.zookeeper == "bookfleet-zookeeper.bookfleet.svc:2181"
            assert cluster_problems(cluster.spec) == []
        elif obj["kind"] in PROMETHEUS_OPERATOR_KINDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        elif obj["kind"] == "KopfPeering":
            assert obj["apiVersion"] == "kopf.dev/v1" and "spec" not in obj
        else:
            kubernetes_validate.validate(obj, "1.30", strict=True)


def test_chart_crds_are_the_generated_ones(chart: helm.Chart) -> None:
    names = sorted(crd["name"] for crd in chart.crds)
    assert names == sorted(f"crds/{name}" for name in crdgen.crd_files())
    for crd in chart.crds:
        assert crd["data"] == crdgen.crd_files()[crd["name"].removeprefix("crds/")]


def by_kind(objects: list[dict[str, Any]], kind: str, component: str | None = None) -> list[dict[str, Any]]:
    return [
        obj
        for obj in objects
        if obj["kind"] == kind
        and (component is None or obj["metadata"]["labels"].get("app.kubernetes.io/component") == component)
    ]


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """Every (apiGroup, resource, verb) a list of RBAC rules allows."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_repair_account_has_exactly_what_the_builders_grant() -> None:
    objects = render_chart(ALL_OPTIONAL)
    (role,) = by_kind(objects, "Role", "repair")
    assert role["metadata"]["namespace"] == "storage"
    assert role["rules"] == resources.REPAIR_RULES
    (binding,) = by_kind(objects, "RoleBinding", "repair")
    (cluster,) = by_kind(objects, "BookieCluster")
    repair = BookieCluster.model_validate(cluster).spec.auto_recovery.repair
    assert binding["subjects"][0]["name"] == repair.service_account_name == "bookfleet-repair"


def test_the_repair_account_may_touch_only_repair_pods() -> None:
    """Spark's driver needs to create, label and delete its executor pods, which RBAC cannot tell from bookie pods:
    it gets no services or volumes, and an admission policy bound with Deny confines its pod writes to pods labelled
    as repair pods (the executors' labels, resources.repair_command)."""
    objects = render_chart(ALL_OPTIONAL)
    (role,) = by_kind(objects, "Role", "repair")
    assert {resource for _, resource, _ in grants(role["rules"])} == {"pods", "configmaps"}
    assert not any(verb in ("get", "list") for _, resource, verb in grants(role["rules"]) if resource == "configmaps")
    (policy,) = by_kind(objects, "ValidatingAdmissionPolicy")
    (binding,) = by_kind(objects, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["pods"] and set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    (account,) = policy["spec"]["matchConditions"]
    assert '["bookfleet-repair"].exists(' in account["expression"]
    label = f"'{resources.LABEL_COMPONENT}'"
    assert all(label in v["expression"] and f"'{resources.REPAIR}'" in v["expression"]
               for v in policy["spec"]["validations"])
    executor_labels = resources.repair_command(BookieCluster.model_validate(by_kind(objects, "BookieCluster")[0]), "r")
    assert f"spark.kubernetes.executor.label.{resources.LABEL_COMPONENT}={resources.REPAIR}" in executor_labels
    assert by_kind(render_chart({"repair": {"podAdmissionPolicy": {"enabled": False}}}),
                   "ValidatingAdmissionPolicy") == []


def test_the_repair_pod_policy_is_left_out_where_the_api_server_does_not_serve_it() -> None:
    """admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy is served from Kubernetes 1.30; Chart.yaml says
    1.25 and up, where the policy made the whole install fail."""
    for served, kinds in (((), []), ((VALIDATING_ADMISSION_POLICY,), ["ValidatingAdmissionPolicy"])):
        assert [o["kind"] for o in render_chart(ALL_OPTIONAL, api_versions=served)
                if o["kind"] == "ValidatingAdmissionPolicy"] == kinds, served


def test_the_repair_pod_policy_confines_every_repair_account_named() -> None:
    """A BookieCluster with its own repair.serviceAccountName (which the operator grants the repair Role) was left
    unguarded: the policy matched only the chart's account."""
    (policy,) = by_kind(render_chart({"repair": {"podAdmissionPolicy": {"serviceAccountNames": ["team-repair"]}}}),
                        "ValidatingAdmissionPolicy")
    (account,) = policy["spec"]["matchConditions"]
    assert '["bookfleet-repair","team-repair"].exists(' in account["expression"]


def test_two_releases_in_one_namespace_name_nothing_alike() -> None:
    """Fixed names (bookfleet-repair, bookfleet-zk-auth) made a second release in a namespace fail to install, or
    share and then uninstall the first one's account and ZooKeeper credential."""
    def names(release: str) -> set[tuple[str, str]]:
        return {(o["kind"], o["metadata"]["name"]) for o in render_chart(ALL_OPTIONAL, release=release)
                if o["kind"] not in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                                     "ValidatingAdmissionPolicyBinding", "BookieCluster")}
    assert names("first") & names("second") == set()
    (cluster,) = by_kind(render_chart(ALL_OPTIONAL, release="first"), "BookieCluster")
    spec = BookieCluster.model_validate(cluster).spec
    assert spec.auto_recovery.repair.service_account_name == "first-bookfleet-repair"
    assert spec.security.zookeeper_auth_secret == "first-bookfleet-zk-auth"


def test_operator_may_manage_what_it_builds_and_only_read_cluster_wide() -> None:
    objects = render_chart({})
    (cluster_role,) = by_kind(objects, "ClusterRole")
    crds = {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"]}
    nodes = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    volumes = {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get"]}
    own_crds = {**crds, "resourceNames": [crdgen.crd(resource)["metadata"]["name"] for resource in RESOURCES] + [
        crdgen.KOPF_PEERING["metadata"]["name"]], "verbs": ["patch"]}  # applied at its start (crdgen.apply_crds)
    assert cluster_role["rules"] == [{**crds, "verbs": ["get", "list", "watch"]}, own_crds, nodes, volumes]
    (role,) = [role for role in by_kind(objects, "Role") if role["metadata"]["name"] == "bookfleet"]
    granted = grants(role["rules"])
    built = {("", "pods"), ("", "persistentvolumeclaims"), ("", "services"), ("batch", "jobs")}
    for kind in ("poddisruptionbudgets", "networkpolicies", "configmaps"):
        group = {"poddisruptionbudgets": "policy", "networkpolicies": "networking.k8s.io"}.get(kind, "")
        assert {(group, kind, "get"), (group, kind, "create")} <= granted
    cluster = BookieCluster.model_validate({"metadata": {"name": "bk", "namespace": "bookfleet", "uid": "u"},
                                            "spec": {"zookeeper": "zk:2181"}})
    applied = resources.cluster_objects(cluster) + resources.repair_namespace_objects(cluster)
    for manifest in applied:  # server-side apply: create when missing, patch after
        group = manifest["apiVersion"].rpartition("/")[0]
        plural = PLURALS[manifest["kind"]]
        assert {(group, plural, "create"), (group, plural, "patch")} <= granted, plural
    assert ("networking.k8s.io", "networkpolicies", "delete") in granted, "spec.networkPolicy.enabled: false"
    built |= {("sparkoperator.k8s.io", "sparkapplications")} | {("bookfleet.io", p) for p in ("bookies", "ledgers")}
    for group, resource in built:
        assert {(group, resource, verb) for verb in ("get", "list", "watch", "create", "delete")} <= granted
    for plural in ("bookieclusters", "bookies", "ledgers"):
        assert ("bookfleet.io", f"{plural}/status", "patch") in granted
    assert ("", "events", "create") in granted
    assert grants(resources.REPAIR_RULES) <= granted, "creating the repair Role needs every permission it grants"
    for kind in ("serviceaccounts", "roles", "rolebindings"):
        group = "" if kind == "serviceaccounts" else "rbac.authorization.k8s.io"
        assert {(group, kind, "get"), (group, kind, "create")} <= granted
    assert not any(verb in ("escalate", "bind", "*") or "*" in (group, resource) for group, resource, verb in granted)
    # certificates: the operator writes its clusters' Secrets by name, but can never list or watch every Secret
    assert {verb for _, resource, verb in granted if resource == "secrets"} == {"get", "create", "patch"}
    (deployment,) = by_kind(objects, "Deployment")
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:6] == ["bookfleet", "--log-level", "INFO", "operator", "--namespace", "bookfleet"]
    assert command[6:] == ["--peering", "bookfleet", "--liveness", "http://0.0.0.0:8080/healthz",
                           "--metrics-port", "9090", "--bookie-image", "bookfleet/bookie", "--repair-image",
                           "bookfleet/repair", "--apply-crds"]
    parsed = build_parser().parse_args(command[1:])
    assert (parsed.namespaces, parsed.standalone, parsed.peering) == (["bookfleet"], False, "bookfleet")
    assert parsed.apply_crds and (parsed.bookie_image, parsed.repair_image) == ("bookfleet/bookie", "bookfleet/repair")
    assert ("kopf.dev", "kopfpeerings", "patch") in granted and ("kopf.dev", "kopfpeerings", "watch") in granted


def test_without_apply_crds_the_operator_may_not_patch_crds_and_is_not_asked_to() -> None:
    objects = render_chart({"operator": {"applyCRDs": False}, "image": {"bookie": {"repository": "mirror/bk"}}})
    (cluster_role,) = by_kind(objects, "ClusterRole")
    assert ("apiextensions.k8s.io", "customresourcedefinitions", "patch") not in grants(cluster_role["rules"])
    (deployment,) = by_kind(objects, "Deployment")
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--apply-crds" not in command and command[command.index("--bookie-image") + 1] == "mirror/bk"


def test_a_bookie_cluster_without_zookeeper_is_refused_with_a_clear_error() -> None:
    with pytest.raises(helm.HelmError, match=r"bookieCluster\.zookeeper is empty"):
        render_chart({"bookieCluster": {"enabled": True}})
    with pytest.raises(helm.HelmError, match=r"/zookeeper/replicas': value must be one of 1, 3, 5"):
        render_chart({"zookeeper": {"enabled": True, "replicas": 2}})


def test_values_are_checked_against_the_charts_schema() -> None:
    """values.schema.json: a misspelt or misplaced setting, or one of the wrong kind, stops the install with the
    path that is wrong, where it used to be ignored (a default silently in its place)."""
    for values, path in (({"bookieCluster": {"replica": 3}}, "/bookieCluster"),
                         ({"operator": {"replicas": "two"}}, "/operator/replicas"),
                         ({"security": {"tls": "operator"}}, "/security/tls"),
                         ({"repair": {"podAdmissionPolicy": {"enable": False}}}, "/repair/podAdmissionPolicy")):
        with pytest.raises(helm.HelmError, match=f"at '{path}'"):
            render_chart(values)
    render_chart(ALL_OPTIONAL)  # every documented setting passes
    # `--set operator.extraArgs={--interval,10}` hands helm a number: passed on as the string it was typed as.
    (deployment,) = by_kind(render_chart({"operator": {"extraArgs": ["--interval", 10]}}), "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["--interval", "10"]


def test_zookeeper_data_dir_exists_before_the_entrypoint_writes_myid() -> None:
    """The image's entrypoint (set -e) writes $ZOO_DATA_DIR/myid before ZooKeeper starts: the directory must be a
    mount point, not a subdirectory of an empty volume; every other directory written is a mount too."""
    (statefulset,) = by_kind(render_chart(ALL_OPTIONAL), "StatefulSet")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert env["ZOO_DATA_DIR"] in mounts
    assert env["ZOO_DATA_LOG_DIR"].startswith(env["ZOO_DATA_DIR"] + "/"), "ZooKeeper creates its log dir itself"
    assert {env["ZOO_CONF_DIR"], env["ZOO_LOG_DIR"], "/tmp"} <= mounts


def test_disruption_budget_and_zone_spread_for_zookeeper() -> None:
    objects = render_chart(ALL_OPTIONAL)
    (budget,) = by_kind(objects, "PodDisruptionBudget", "zookeeper")
    (statefulset,) = by_kind(objects, "StatefulSet")
    assert budget["spec"] == {**budget["spec"], "minAvailable": 2} and "maxUnavailable" not in budget["spec"]
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    keys = {c["topologyKey"] for c in statefulset["spec"]["template"]["spec"]["topologySpreadConstraints"]}
    assert keys == {resources.ZONE_LABEL, resources.HOSTNAME_LABEL}


def test_zookeeper_servers_go_where_their_node_settings_say() -> None:
    dedicated = {"nodeSelector": {"pool": "zookeeper"},
                 "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]}
    (statefulset,) = by_kind(render_chart({"zookeeper": {"enabled": True, **dedicated}}), "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    assert {key: pod.get(key) for key in dedicated} == dedicated
    (default,) = by_kind(render_chart({"zookeeper": {"enabled": True}}), "StatefulSet")
    assert not {"nodeSelector", "tolerations"} & default["spec"]["template"]["spec"].keys()


@pytest.mark.parametrize(("replicas", "quorum"), [(3, 2), (5, 3)])
def test_zookeeper_drains_always_leave_a_quorum(replicas: int, quorum: int) -> None:
    objects = render_chart({"zookeeper": {"enabled": True, "replicas": replicas}})
    (budget,) = by_kind(objects, "PodDisruptionBudget", "zookeeper")
    assert budget["spec"]["minAvailable"] == quorum


def test_zookeeper_purges_old_snapshots_keeps_its_heap_inside_the_limit_and_probes_without_a_jvm() -> None:
    """What a chart ZooKeeper hits in its first weeks: a volume filled by snapshots and transaction logs (no
    autopurge), a kernel OOM kill (zkEnv.sh's 1000 MiB default heap at a 1Gi limit), probes that start a JVM and
    time out on a busy node."""
    (statefulset,) = by_kind(render_chart(ALL_OPTIONAL), "StatefulSet")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert int(env["ZOO_AUTOPURGE_PURGEINTERVAL"]) >= 1 and int(env["ZOO_AUTOPURGE_SNAPRETAINCOUNT"]) >= 3
    limit = resources.quantity_bytes(container["resources"]["limits"]["memory"])
    assert int(env["ZK_SERVER_HEAP"]) * 2**20 <= 0.75 * limit
    for probe in ("readinessProbe", "livenessProbe"):
        command = " ".join(container[probe]["exec"]["command"])
        assert "zkServer.sh" not in command and "java" not in command and "/dev/tcp/127.0.0.1/2181" in command
        assert container[probe]["timeoutSeconds"] >= 5
        assert set(command.split("printf ")[1].split()[0].split(",")) <= set(env["ZOO_4LW_COMMANDS_WHITELIST"]
                                                                              .split(","))


def test_zookeeper_probes_answer_against_a_real_zookeeper(zk_server, zk) -> None:
    """The probe commands as rendered, pointed at the test ZooKeeper: both pass once it serves, both fail on a port
    nothing listens on (the readiness one also while a server is not in a quorum: srvr has no Mode line then).
    `zk`: a session is open, so the server serves."""
    (statefulset,) = by_kind(render_chart(ALL_OPTIONAL), "StatefulSet")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    host, port = zk_server.connect.split(":")
    for probe in ("readinessProbe", "livenessProbe"):
        command = container[probe]["exec"]["command"]
        for target, ok in ((f"{host}/{port}", True), (f"{host}/{free_port()}", False)):
            pointed = [part.replace("127.0.0.1/2181", target) for part in command]
            assert (subprocess.run(pointed, timeout=30).returncode == 0) == ok, (probe, target)


def test_zookeeper_only_from_the_fleet_and_labelled_clients() -> None:
    """Bookies and repair pods (watched namespace), the operator (release namespace), labelled clients; peers only
    between servers; and the client label is the one the operator's bookie policies allow."""
    objects = render_chart(ALL_OPTIONAL)
    (policy,) = by_kind(objects, "NetworkPolicy", "zookeeper")
    client_rule, peer_rule = policy["spec"]["ingress"]
    assert [port["port"] for port in client_rule["ports"]] == [2181]
    allowed = {
        (peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
         tuple(sorted(peer["podSelector"]["matchLabels"].items())))
        for peer in client_rule["from"]
    }
    fleet = ((resources.LABEL_NAME, resources.APP),)
    client = ((resources.CLIENT_LABEL, "true"),)
    assert allowed == {(ns, labels) for ns in ("bookfleet", "storage") for labels in (fleet, client)}
    (operator,) = by_kind(objects, "Deployment")
    assert operator["spec"]["template"]["metadata"]["labels"][resources.LABEL_NAME] == resources.APP
    assert {p["port"] for p in peer_rule["ports"]} == {2888, 3888}
    (operator_policy,) = by_kind(objects, "NetworkPolicy", "operator")
    assert operator_policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8080},
                                                             {"protocol": "TCP", "port": 9090}]}]
    assert by_kind(render_chart({**ALL_OPTIONAL, "networkPolicy": {"enabled": False}}), "NetworkPolicy") == []


def test_network_policy_settings_reach_the_chart_cluster_and_zookeeper() -> None:
    """networkPolicy.enabled reaches the chart's BookieCluster (whose policies the operator builds), and the extra
    clients (Pulsar brokers in their namespace) are admitted to the bookies and to ZooKeeper alike."""
    brokers = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "pulsar"}},
               "podSelector": {"matchLabels": {"component": "broker"}}}
    objects = render_chart({**ALL_OPTIONAL, "networkPolicy": {"clients": [brokers]}})
    (cluster,) = by_kind(objects, "BookieCluster")
    assert BookieCluster.model_validate(cluster).spec.network_policy.to_wire() == {"enabled": True,
                                                                                   "clients": [brokers]}
    (zookeeper,) = by_kind(objects, "NetworkPolicy", "zookeeper")
    assert brokers in zookeeper["spec"]["ingress"][0]["from"]
    objects = render_chart({**ALL_OPTIONAL, "networkPolicy": {"enabled": False}})
    (cluster,) = by_kind(objects, "BookieCluster")
    assert BookieCluster.model_validate(cluster).spec.network_policy.enabled is False
    assert by_kind(objects, "NetworkPolicy") == []


def test_pod_settings_reach_the_chart_cluster() -> None:
    """Scheduling and pull settings for bookies, repair drivers and executors go from values to the BookieCluster."""
    pool = {"nodeSelector": {"pool": "storage"}, "imagePullSecrets": ["registry"],
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]}
    repair = {"driverPodTemplate": {"priorityClassName": "high"}, "executorPodTemplate": pool}
    objects = render_chart({**ALL_OPTIONAL, "bookieCluster": {**ALL_OPTIONAL["bookieCluster"], "podTemplate": pool,
                                                               "autoRecovery": {"repair": repair}}})
    (cluster,) = by_kind(objects, "BookieCluster")
    spec = BookieCluster.model_validate(cluster).spec
    assert spec.pod_template.to_wire() == pool
    assert spec.auto_recovery.repair.driver_pod_template.priority_class_name == "high"
    assert spec.auto_recovery.repair.executor_pod_template.to_wire() == pool
    assert spec.auto_recovery.repair.ttl_seconds_after_finished == 86400
    assert spec.auto_recovery.planned_restart_delay_seconds == 600


def test_client_certificates_reach_the_chart_cluster() -> None:
    values = {"bookieCluster": {"enabled": True, "zookeeper": "zk:2181"},
              "security": {"clientCertificates": ["billing"]}}
    (cluster,) = by_kind(render_chart(values), "BookieCluster")
    assert BookieCluster.model_validate(cluster).spec.security.client_certificates == ["billing", "helm-test"]
    for without_test in ({"test": {"clientCertificate": ""}}, {"security": {"tls": "Disabled"}}):
        (cluster,) = by_kind(render_chart(values | {"security": values["security"] | without_test.get("security", {}),
                                                    "test": without_test.get("test", {})}), "BookieCluster")
        assert BookieCluster.model_validate(cluster).spec.security.client_certificates == ["billing"]


def test_a_zookeeper_tls_secret_reaches_the_chart_cluster_only_for_a_zookeeper_of_its_own() -> None:
    """The chart's ZooKeeper serves plain TCP: TLS to ZooKeeper needs bookieCluster.zookeeper, else a clear error."""
    values = {"bookieCluster": {"enabled": True, "zookeeper": "zk.example:2281"},
              "security": {"zookeeperTlsSecret": "zk-client"}}
    (cluster,) = by_kind(render_chart(values), "BookieCluster")
    assert BookieCluster.model_validate(cluster).spec.security.zookeeper_tls_secret == "zk-client"
    (default,) = by_kind(render_chart({"bookieCluster": {"enabled": True, "zookeeper": "zk:2181"}}), "BookieCluster")
    assert "zookeeperTlsSecret" not in default["spec"]["security"]
    with pytest.raises(helm.HelmError, match=r"security\.zookeeperTlsSecret needs bookieCluster\.zookeeper"):
        render_chart({"zookeeper": {"enabled": True}, "bookieCluster": {"enabled": True},
                      "security": {"zookeeperTlsSecret": "zk-client"}})


def test_autoscaling_reaches_the_chart_cluster_and_leaves_its_replicas_to_the_operator() -> None:
    """An upgrade writing the chart's replicas would undo the autoscaler's: with autoscaling, the chart sets none."""
    policy = {"minReplicas": 3, "maxReplicas": 6}
    values = {"bookieCluster": {"enabled": True, "zookeeper": "zk:2181", "autoscaling": policy}}
    (cluster,) = by_kind(render_chart(values), "BookieCluster")
    assert cluster["spec"]["autoscaling"] == policy and "replicas" not in cluster["spec"]
    spec = BookieCluster.model_validate(cluster).spec
    assert spec.autoscaling is not None and spec.autoscaling.scale_up_disk_usage == 0.8
    (fixed,) = by_kind(render_chart({"bookieCluster": {"enabled": True, "zookeeper": "zk:2181"}}), "BookieCluster")
    assert fixed["spec"]["replicas"] == 3 and "autoscaling" not in fixed["spec"]


def test_operator_is_probed_for_readiness() -> None:
    (deployment,) = by_kind(render_chart({}), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["port"] == "health"


def test_monitors_scrape_bookie_metrics_in_the_watched_namespace() -> None:
    assert [obj for obj in render_chart({}) if obj["kind"] in PROMETHEUS_OPERATOR_KINDS] == []
    objects = render_chart(ALL_OPTIONAL)
    (pod_monitor,) = by_kind(objects, "PodMonitor", "bookie")
    (service_monitor,) = by_kind(objects, "ServiceMonitor", "bookie")
    built = operator_objects()
    pod = next(obj for obj in built if obj["kind"] == "Pod")
    service = next(obj for obj in built if obj["kind"] == "Service")
    pairs = ((pod_monitor, pod, "podMetricsEndpoints"), (service_monitor, service, "endpoints"))
    for monitor, target, endpoints in pairs:
        assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["storage"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= target["metadata"]["labels"].items()
        (endpoint,) = monitor["spec"][endpoints]
        assert endpoint["path"] == "/metrics"
    ports = {port["name"] for port in pod["spec"]["containers"][0]["ports"]}
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports
    assert service_monitor["spec"]["endpoints"][0]["port"] in {port["name"] for port in service["spec"]["ports"]}


def test_repair_drivers_are_scraped_under_their_cluster_and_bookies_too() -> None:
    """The dashboard's repair panels: the repair PodMonitor finds the driver's metrics port (not its executors'),
    whichever monitor kind is on; bookie and repair samples get their BookieCluster's name from the pod label."""
    built = operator_objects()
    job = next(obj for obj in built if obj["kind"] == "Job")
    driver = job["spec"]["template"]
    executor = next(obj for obj in built if obj["kind"] == "Pod" and obj["metadata"]["name"].endswith("-exec-1"))
    for enabled in ({"podMonitor": {"enabled": True}}, {"serviceMonitor": {"enabled": True}}):
        (monitor,) = by_kind(render_chart({"operator": {"watchNamespace": "storage"}, "metrics": enabled}),
                             "PodMonitor", "repair")
        assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["storage"]
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= driver["metadata"]["labels"].items()
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] in {p["name"] for p in driver["spec"]["containers"][0]["ports"]}
        assert endpoint["port"] not in {p.get("name") for p in executor["spec"]["containers"][0].get("ports", [])}
    objects = render_chart(ALL_OPTIONAL)
    for monitor in (*by_kind(objects, "PodMonitor"), *by_kind(objects, "ServiceMonitor")):
        (endpoint,) = monitor["spec"].get("podMetricsEndpoints") or monitor["spec"]["endpoints"]
        if monitor["metadata"]["labels"]["app.kubernetes.io/component"] == "operator":
            assert endpoint["honorLabels"] is True  # its samples' namespace is their cluster's, not the operator's
            continue
        label = resources.LABEL_CLUSTER.replace(".", "_").replace("/", "_")
        assert {"sourceLabels": [f"__meta_kubernetes_pod_label_{label}"], "targetLabel": "bookiecluster"} in \
            endpoint["relabelings"]
        assert resources.LABEL_CLUSTER in driver["metadata"]["labels"]


def test_alerts_render_where_the_prometheus_rule_crd_is_and_query_only_exported_metrics() -> None:
    """Offline (no CRD known) the rule is left out, so an install without the Prometheus Operator works; helm told
    the CRD exists renders it (test_alerts.py, with promtool); `always` renders it regardless, `enabled` false never."""
    assert by_kind(render_chart({}), "PrometheusRule") == []
    assert by_kind(render_chart({"alerts": {"always": True, "enabled": False}}), "PrometheusRule") == []
    (rule,) = by_kind(render_chart({"alerts": {"always": True, "labels": {"release": "prometheus"}}}),
                      "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"] == "prometheus"
    exprs = [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    assert set().union(*(metric_names(expr) for expr in exprs)) - exported_metric_names() == set()


def test_monitors_scrape_the_operators_metrics_port() -> None:
    """Each operator replica serves /metrics on the port its command names; the monitors find that port by name."""
    objects = render_chart({"metrics": ALL_OPTIONAL["metrics"]})
    (deployment,) = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
    assert build_parser().parse_args(container["command"][1:]).metrics_port == port
    (pod_monitor,) = by_kind(objects, "PodMonitor", "operator")
    (service_monitor,) = by_kind(objects, "ServiceMonitor", "operator")
    (service,) = by_kind(objects, "Service", "operator")
    namespaces = {obj["metadata"]["namespace"] for obj in (deployment, pod_monitor, service_monitor, service)}
    assert len(namespaces) == 1
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    assert [e["port"] for e in service_monitor["spec"]["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def exported_metric_names() -> set[str]:
    """Every sample name the code exports: a bookie's registry, the repair job's counters, the operator's registry."""
    importlib.import_module("bookfleet.replication.spark_repair")  # registers the repair counters
    registries = (BookieMetrics().registry, prometheus_client.REGISTRY, metrics.REGISTRY)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {
        family.name + suffix  # by family, so a labelled counter counts before its first sample
        for registry in registries
        for family in registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def test_dashboard_queries_only_metrics_the_code_exports() -> None:
    (config_map,) = [obj for obj in by_kind(render_chart(ALL_OPTIONAL), "ConfigMap")]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["bookfleet.json"])
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = set().union(*(metric_names(expr) for expr in exprs))
    assert used - exported_metric_names() == set()
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for topic in ("adds", "reads", "add latency", "journal sync", "disk", "repair", "under-replicated", "reconcil"):
        assert topic in titles
    assert metric_names("sum by (pod) (rate(bookie_add_entries_total{job=\"x\"}[5m]))") == {"bookie_add_entries_total"}


def test_two_operator_replicas_peer_through_a_kopf_peering_the_chart_installs(chart: helm.Chart) -> None:
    """kopf pauses a peered operator until its KopfPeering exists and it holds the top priority: the chart ships the
    CRD and the object (in the watched namespace), and each replica draws its own priority so two never tie."""
    objects = render_chart({"operator": {"watchNamespace": "storage"}})
    (deployment,) = by_kind(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    (peering,) = by_kind(objects, "KopfPeering")
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    parsed = build_parser().parse_args(command[1:])
    assert parsed.peering == peering["metadata"]["name"] and parsed.priority is None
    assert peering["metadata"]["namespace"] == "storage" == parsed.namespaces[0]
    names = {crd["name"] for crd in chart.crds}
    assert "crds/kopf.dev_kopfpeerings.yaml" in names
    (budget,) = by_kind(objects, "PodDisruptionBudget", "operator")
    assert budget["spec"]["maxUnavailable"] == 1


def test_operator_priority_needs_peering(capsys) -> None:
    assert main(["operator", "--priority", "5"]) == 2
    assert "--priority needs --peering NAME" in capsys.readouterr().err
    assert main(["operator", "--peering", "bookfleet", "--peering-lifetime", "0"]) == 2
    assert "--peering-lifetime must be at least 1 second, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", "--standalone", "--peering", "bookfleet"])


def test_tls_and_zookeeper_auth_are_on_by_default() -> None:
    objects = render_chart(ALL_OPTIONAL)
    (cluster,) = by_kind(objects, "BookieCluster")
    security = BookieCluster.model_validate(cluster).spec.security
    assert security.tls == "Operator" and security.zookeeper_auth_secret == "bookfleet-zk-auth"
    (secret,) = by_kind(objects, "Secret")
    user, _, password = base64.b64decode(secret["data"]["auth"]).decode().partition(":")
    assert user == "bookfleet" and len(password) == 32
    assert secret["metadata"]["namespace"] == cluster["metadata"]["namespace"]
    (deployment,) = by_kind(objects, "Deployment")
    env = {item["name"] for item in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "BOOKFLEET_ZK_AUTH" not in env  # it reads each cluster's own Secret (kube/runtime/context.py)


def pod_templates(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(namespace, pod spec) of every workload the chart renders."""
    found = []
    for obj in objects:
        spec = obj.get("spec") or {}
        template = (spec.get("template") or {}).get("spec")
        if template:
            found.append((obj["metadata"]["namespace"], template))
    return found


@pytest.mark.parametrize("watch", ["", "storage"])
def test_every_secret_a_pod_refers_to_is_rendered_in_its_namespace(watch: str) -> None:
    """A secretKeyRef or secret volume resolves in the pod's own namespace: one naming a Secret the chart puts in
    another namespace (the watched one) leaves the pod in CreateContainerConfigError for ever."""
    objects = render_chart({**ALL_OPTIONAL, "operator": {"watchNamespace": watch}})
    secrets = {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in by_kind(objects, "Secret")}
    referred = []
    for namespace, pod in pod_templates(objects):
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            for item in container.get("env") or []:
                if ref := (item.get("valueFrom") or {}).get("secretKeyRef"):
                    referred.append((namespace, ref["name"]))
        referred += [(namespace, v["secret"]["secretName"]) for v in pod.get("volumes") or [] if "secret" in v]
    assert set(referred) <= secrets


def test_uninstall_deletes_the_chart_cluster_first_and_never_waits_for_ever() -> None:
    """helm uninstall leaves the Ledgers users made: a pre-delete hook deletes the chart's BookieCluster and its
    Ledgers (see kube/reconcilers/teardown.py), its volumes kept by default."""
    objects = render_chart(ALL_OPTIONAL)
    (cluster,) = [o for o in objects if o["kind"] == "BookieCluster"]
    assert cluster["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    (hook,) = [o for o in objects if o["kind"] == "Job"]
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = hook["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == deployment["spec"]["template"]["spec"]["serviceAccountName"]
    command = pod["containers"][0]["command"]
    args = build_parser().parse_args(command[1:])
    assert (args.name, args.namespace, args.timeout) == (cluster["metadata"]["name"], "storage", 120)
    # It ends by itself, not by the deadline: 100,000 Ledgers' deletes at ~2.4 ms of CPU each (bench operator
    # --teardown on a real API server), then the wait.
    assert pod["containers"][0]["resources"]["limits"]["cpu"] == "1"
    assert hook["spec"]["activeDeadlineSeconds"] > args.timeout + 100_000 * 0.0024
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= hook["spec"]["template"]["metadata"]["labels"].items()  # not an operator replica
    assert all(o["kind"] != "Job" for o in render_chart({}))  # no cluster from the chart, nothing to delete


def test_the_uninstall_hook_runs_where_the_operator_may_run() -> None:
    """The hook runs the operator's image: on clusters that keep the operator on nodes of its own (a system pool, with
    a taint), the hook goes there too, rather than to nodes that may not hold or be allowed that image."""
    system = {"nodeSelector": {"pool": "system"},
              "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]}
    placed = {**ALL_OPTIONAL, "operator": {**ALL_OPTIONAL["operator"], **system}}
    for values, expected in ((placed, system), (ALL_OPTIONAL, {})):
        (hook,) = by_kind(render_chart(values), "Job")
        pod = hook["spec"]["template"]["spec"]
        assert {key: pod[key] for key in system if key in pod} == expected


CHART_CLUSTER = {"bookieCluster": {"enabled": True, "zookeeper": "zk:2181"}}


def stored_cluster_and_bookie_pod(objects: list[dict[str, Any]]) -> tuple[BookieCluster, dict[str, Any]]:
    """The chart's BookieCluster as stored (a uid), and the pod the operator builds for its first bookie."""
    (manifest,) = by_kind(objects, "BookieCluster")
    cluster = BookieCluster.model_validate({**manifest, "metadata": {**manifest["metadata"], "uid": "c"}})
    bookie = resources.bookies_for_cluster(cluster)[0]
    bookie["metadata"]["uid"] = "b"
    return cluster, resources.bookie_pod(cluster, Bookie.model_validate(bookie))


def test_helm_test_is_a_client_of_the_chart_cluster_as_the_operator_builds_clients() -> None:
    """`helm test`'s pod: a hook of kind test, labelled as a client (the NetworkPolicies admit it), the ZooKeeper
    credential and TLS directory a client of the cluster gets (resources.security_env), the client certificate the
    cluster keeps issued for it, readable as the operator's client pods read it (their pod security context: the
    group reads the 0440 Secret files); ZooKeeper's TLS Secret mounted where bookies have it. The operator's image
    where the operator runs (its node holds that image, maybe not the bookie image), and helm prints the pod's log
    whether it passes or fails. No chart cluster: no test."""
    placement = {"nodeSelector": {"pool": "system"}, "tolerations": [{"key": "system", "effect": "NoSchedule"}]}
    for values in (CHART_CLUSTER, {**CHART_CLUSTER, "security": {"zookeeperTlsSecret": "zk-client"}},
                   {**CHART_CLUSTER, "operator": placement}):
        objects = render_chart(values)
        (pod,) = by_kind(objects, "Pod")
        cluster, bookie = stored_cluster_and_bookie_pod(objects)
        (operator,) = by_kind(objects, "Deployment")
        assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
        assert pod["metadata"]["annotations"]["helm.sh/hook-output-log-policy"] == "hook-succeeded,hook-failed"
        assert pod["spec"]["securityContext"] == resources.pod_security_context()
        assert pod["spec"]["containers"][0]["image"] == operator["spec"]["template"]["spec"]["containers"][0]["image"]
        assert {key: pod["spec"].get(key) for key in placement} == {
            key: operator["spec"]["template"]["spec"].get(key) for key in placement}
        assert pod["metadata"]["labels"][resources.CLIENT_LABEL] == "true"
        assert pod["metadata"]["namespace"] == cluster.metadata.namespace
        (container,) = pod["spec"]["containers"]
        assert container["env"] == [{"name": "BOOKFLEET_ZK", "value": cluster.spec.zookeeper},
                                    *resources.security_env(cluster, with_tls_dir=True)]
        secret = resources.client_secret_name(cluster.metadata.name, "helm-test")
        assert "helm-test" in cluster.spec.security.client_certificates
        assert resources.tls_volume(secret) in pod["spec"]["volumes"]
        assert resources.tls_mount() in container["volumeMounts"]
        zookeeper_tls = [m for m in bookie["spec"]["containers"][0]["volumeMounts"]
                         if m["mountPath"] == resources.ZK_TLS_DIR]
        assert [m for m in container["volumeMounts"] if m["mountPath"] == resources.ZK_TLS_DIR] == zookeeper_tls
    (pod,) = by_kind(render_chart({**CHART_CLUSTER, "security": {"tls": "Disabled"}}), "Pod")
    assert "BOOKFLEET_TLS_DIR" not in {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert by_kind(render_chart({}), "Pod") == []


def test_the_helm_test_client_certificate_restarts_no_bookie() -> None:
    """An upgrade to a chart with `helm test` adds its client certificate to the cluster's spec: nothing a bookie
    runs changes, so no bookie is rolled for it."""
    def bookie_digest(values: dict[str, Any]) -> str:
        _, bookie = stored_cluster_and_bookie_pod(render_chart(values))
        return bookie["metadata"]["annotations"][resources.ANNOTATION_CONFIG_HASH]

    assert bookie_digest(CHART_CLUSTER) == bookie_digest({**CHART_CLUSTER, "test": {"clientCertificate": ""}})


def test_the_helm_test_script_passes_against_a_running_fleet(zk_connect, bookie_fleet) -> None:
    """The pod's script itself, run here against three bookies (plain TCP: the TLS wiring is checked above): it writes
    through every bookie of a 3-bookie ensemble, reads the entry back and leaves no ledger behind; with a bookie
    gone it fails."""
    (pod,) = by_kind(render_chart(CHART_CLUSTER), "Pod")
    command = pod["spec"]["containers"][0]["command"]
    env = {**os.environ, "BOOKFLEET_ZK": zk_connect, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    bookies = bookie_fleet.start(3)
    passed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert passed.returncode == 0, passed.stderr
    assert re.search(r"^ledger (\d+): written to 3 bookies, read back\ndeleted ledger \1$", passed.stdout, re.M)
    listed = subprocess.run([sys.executable, "-m", "bookfleet", "ledger", "list", "--json"], env=env,
                            capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(listed.stdout) == []
    bookies[0].kill9()
    failed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0
