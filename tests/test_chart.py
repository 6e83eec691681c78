"""The Helm chart: lints clean, renders valid Kubernetes objects with default and with every optional part."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from bookfleet.cli import build_parser
from bookfleet.kube import crdgen, resources
from bookfleet.kube.models import BookieCluster, cluster_problems

CHART = Path(__file__).resolve().parent.parent / "charts" / "bookfleet"
ALL_OPTIONAL = {
    "zookeeper": {"enabled": True, "replicas": 3, "storageClassName": "standard"},
    "bookieCluster": {"enabled": True, "zones": ["zone-a", "zone-b", "zone-c"]},
    "operator": {"watchNamespace": "storage", "extraArgs": ["--verbose"]},
}
VALUES = {"default": {}, "all-optional": ALL_OPTIONAL}


@pytest.fixture(scope="module")
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def render(chart: helm.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    rendered = chart.render(values, name="bookfleet", namespace="bookfleet", is_install=True)
    return [
        doc
        for path, text in sorted(rendered.items())
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


@pytest.fixture(scope="module", params=list(VALUES), ids=list(VALUES))
def rendered(request, chart: helm.Chart) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(chart, VALUES[request.param])


@pytest.mark.parametrize("values", list(VALUES.values()), ids=list(VALUES))
def test_lints_clean(values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, namespace="bookfleet")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_every_rendered_object_is_valid(rendered) -> None:
    name, objects = rendered
    kinds = {obj["kind"] for obj in objects}
    expected = {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Secret"}
    if name == "all-optional":
        expected |= {"StatefulSet", "Service", "BookieCluster"}
    assert kinds == expected
    for obj in objects:
        if obj["kind"] == "BookieCluster":
            cluster = BookieCluster.model_validate(obj)
            assert cluster.spec.zookeeper == "bookfleet-zookeeper.bookfleet.svc:2181"
            assert cluster_problems(cluster.spec) == []
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


def test_repair_account_has_exactly_what_the_builders_grant(chart: helm.Chart) -> None:
    objects = render(chart, ALL_OPTIONAL)
    (role,) = by_kind(objects, "Role", "repair")
    assert role["metadata"]["namespace"] == "storage"
    assert role["rules"] == resources.REPAIR_RULES
    (binding,) = by_kind(objects, "RoleBinding", "repair")
    (cluster,) = by_kind(objects, "BookieCluster")
    repair = BookieCluster.model_validate(cluster).spec.auto_recovery.repair
    assert binding["subjects"][0]["name"] == repair.service_account_name == "bookfleet-repair"


def test_operator_may_manage_what_it_builds_and_nothing_cluster_wide_but_crds(chart: helm.Chart) -> None:
    objects = render(chart, {})
    (cluster_role,) = by_kind(objects, "ClusterRole")
    crds = {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"]}
    assert cluster_role["rules"] == [{**crds, "verbs": ["get", "list", "watch"]}]
    (role,) = [role for role in by_kind(objects, "Role") if role["metadata"]["name"] == "bookfleet"]
    granted = grants(role["rules"])
    built = {("", "pods"), ("", "persistentvolumeclaims"), ("", "services"), ("batch", "jobs")}
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
    assert command[:7] == ["bookfleet", "--log-level", "INFO", "operator", "--namespace", "bookfleet", "--standalone"]
    assert command[7:] == ["--liveness", "http://0.0.0.0:8080/healthz"]
    parsed = build_parser().parse_args(command[1:])
    assert (parsed.namespaces, parsed.standalone) == (["bookfleet"], True)


def test_a_bookie_cluster_without_zookeeper_is_refused_with_a_clear_error(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmError, match=r"bookieCluster\.zookeeper is empty"):
        render(chart, {"bookieCluster": {"enabled": True}})
    with pytest.raises(helm.HelmError, match=r"zookeeper\.replicas must be 1, 3 or 5"):
        render(chart, {"zookeeper": {"enabled": True, "replicas": 2}})


def test_tls_and_zookeeper_auth_are_on_by_default(chart: helm.Chart) -> None:
    objects = render(chart, ALL_OPTIONAL)
    (cluster,) = by_kind(objects, "BookieCluster")
    security = BookieCluster.model_validate(cluster).spec.security
    assert security.tls == "Operator" and security.zookeeper_auth_secret == "bookfleet-zk-auth"
    (secret,) = by_kind(objects, "Secret")
    user, _, password = base64.b64decode(secret["data"]["auth"]).decode().partition(":")
    assert user == "bookfleet" and len(password) == 32
    (deployment,) = by_kind(objects, "Deployment")
    (env,) = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    credential = {"secretKeyRef": {"name": "bookfleet-zk-auth", "key": "auth"}}
    assert env == {"name": "BOOKFLEET_ZK_AUTH", "valueFrom": credential}
