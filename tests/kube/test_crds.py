"""The CRDs: generated from the models, committed without drift, structural, and as strict as the models."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes_validate
import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from bookfleet import __version__
from bookfleet.cli import main
from bookfleet.kube import crdgen
from bookfleet.kube.models import (
    BOOKIE_CONFIG_KEYS,
    DATA_LOSS,
    RESOURCES,
    VALID,
    Autoscaling,
    BookieCluster,
    BookieClusterSpec,
    BookieSettings,
    Condition,
    ConditionStatus,
    Ledger,
    LedgerSpec,
    cluster_problems,
    ledger_problems,
    set_condition,
    validated_cluster,
    validity_condition,
)
from bookfleet.kube.runtime.api import CUSTOM, KubeApi
from bookfleet.polling import wait_for
from tests.fixtures.apiserver import install_crds
from tests.fixtures.manifests import render_chart

ROOT = Path(__file__).resolve().parents[2]
COPIES = [ROOT / "crds", ROOT / "charts" / "bookfleet" / "crds"]


def version_schema(resource) -> dict[str, Any]:
    return crdgen.crd(resource)["spec"]["versions"][0]


def test_committed_crds_and_chart_copy_match_the_models() -> None:
    for directory in COPIES:
        assert crdgen.drift(directory) == [], "run `bookfleet crds` and commit the result"


def test_crds_command_writes_both_copies_and_check_reports_drift(tmp_path: Path, capsys) -> None:
    out, chart = tmp_path / "crds", tmp_path / "chart"
    assert main(["crds", "--out", str(out), "--chart", str(chart)]) == 0
    assert main(["crds", "--out", str(out), "--chart", str(chart), "--check"]) == 0
    stale = chart / "bookfleet.io_ledgers.yaml"
    stale.write_text(stale.read_text().replace("minimum: 1", "minimum: 0"))
    (out / "bookfleet.io_bookies.yaml").unlink()
    assert main(["crds", "--out", str(out), "--chart", str(chart), "--check"]) == 2
    error = capsys.readouterr().err
    assert f"{stale} is stale" in error
    assert "bookfleet.io_bookies.yaml is missing" in error


@pytest.mark.parametrize("path", sorted(COPIES[0].glob("*.yaml")), ids=lambda p: p.name)
def test_every_crd_validates_offline(path: Path) -> None:
    kubernetes_validate.validate(yaml.safe_load(path.read_text()), "1.30", strict=True)


def structural_violations(schema: dict[str, Any], where: str = "") -> list[str]:
    """The rules of a Kubernetes structural schema that a pydantic translation could break."""
    found = []
    for key in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "title", "const"):
        if key in schema:
            found.append(f"{where or '/'}: {key}")
    typed = "type" in schema or schema.get("x-kubernetes-int-or-string") or schema.get(
        "x-kubernetes-preserve-unknown-fields"
    )
    if not typed:
        found.append(f"{where or '/'}: no type")
    if "properties" in schema and "additionalProperties" in schema:
        found.append(f"{where}: properties with additionalProperties")
    if "default" in schema and schema["default"] is None:
        found.append(f"{where}: null default")
    for name, child in schema.get("properties", {}).items():
        found += structural_violations(child, f"{where}/{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += structural_violations(schema[key], f"{where}/{key}")
    return found


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind_name)
def test_schemas_are_structural_with_status_subresource(resource) -> None:
    version = version_schema(resource)
    schema = version["schema"]["openAPIV3Schema"]
    assert structural_violations(schema) == []
    assert version["subresources"]["status"] == {}
    assert schema["properties"]["status"]["x-kubernetes-preserve-unknown-fields"] is True
    assert "x-kubernetes-preserve-unknown-fields" not in schema["properties"]["spec"]


def test_optional_fields_are_nullable_and_quantities_int_or_string() -> None:
    spec = version_schema(BookieCluster)["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    storage_class = spec["storage"]["properties"]["ledgers"]["properties"]["storageClassName"]
    assert (storage_class["type"], storage_class["nullable"]) == ("string", True)
    assert spec["storage"]["properties"]["journal"]["properties"]["size"]["x-kubernetes-int-or-string"] is True
    assert spec["resources"]["properties"]["limits"]["additionalProperties"]["x-kubernetes-int-or-string"] is True
    threshold = spec["bookie"]["properties"]["diskUsageThreshold"]
    assert (threshold["minimum"], threshold["exclusiveMinimum"], threshold["maximum"]) == (0, True, 1)
    recovery = spec["autoRecovery"]
    # Nested defaults apply only when the parent object exists, so the parent's default carries them.
    assert recovery["default"] == {k: p["default"] for k, p in recovery["properties"].items() if "default" in p}
    assert spec["autoRecovery"]["properties"]["repair"]["properties"]["launcher"]["enum"] == ["job", "sparkapplication"]
    assert spec["zones"]["x-kubernetes-list-type"] == "set"


def test_quorum_rules_live_in_the_model_and_as_cel_in_the_crd() -> None:
    with pytest.raises(ValidationError, match="ensembleSize 2 >= writeQuorum 3 >= ackQuorum 2 does not hold"):
        LedgerSpec.model_validate({"cluster": "demo", "ensembleSize": 2, "writeQuorum": 3, "ackQuorum": 2})
    with pytest.raises(ValidationError, match="writeQuorum 2 >= ackQuorum 3"):
        LedgerSpec(cluster="demo", ensemble_size=3, write_quorum=2, ack_quorum=3)
    with pytest.raises(ValidationError, match="ackQuorum\n  Input should be greater than or equal to 1"):
        LedgerSpec.model_validate({"cluster": "demo", "ackQuorum": 0})
    spec = version_schema(Ledger)["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = {rule["rule"] for rule in spec["x-kubernetes-validations"]}
    assert {"self.ensembleSize >= self.writeQuorum", "self.writeQuorum >= self.ackQuorum"} <= rules
    assert all(spec["properties"][field]["minimum"] == 1 for field in ("ensembleSize", "writeQuorum", "ackQuorum"))
    assert spec["required"] == ["cluster"]


def test_bookie_settings_rules_match_their_cel_twins() -> None:
    with pytest.raises(ValidationError, match=re.escape("diskUsageLwm 0.95 must be below diskUsageThreshold 0.9")):
        BookieSettings(disk_usage_threshold=0.9, disk_usage_lwm=0.95)
    with pytest.raises(ValidationError, match="port and httpPort must differ"):
        BookieSettings(port=8000, http_port=8000)
    with pytest.raises(ValidationError, match="replicaz"):
        BookieClusterSpec.model_validate({"zookeeper": "zk:2181", "replicaz": 3})
    with pytest.raises(ValidationError, match="duplicate entries: zone-a"):
        BookieClusterSpec(zookeeper="zk:2181", zones=["zone-a", "zone-b", "zone-a"])
    spec = version_schema(BookieCluster)["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = {rule["rule"] for rule in spec["properties"]["bookie"]["x-kubernetes-validations"]}
    assert rules == {"self.diskUsageLwm < self.diskUsageThreshold", "self.port != self.httpPort",
                     "self.port == oldSelf.port"}  # bookie ids include the port: changing it strands every ledger
    peer = spec["properties"]["networkPolicy"]["properties"]["clients"]["items"]
    assert [r["rule"] for r in peer["x-kubernetes-validations"]] == [
        "has(self.namespaceSelector) || has(self.podSelector)"]
    with pytest.raises(ValidationError, match="needs namespaceSelector or podSelector"):
        BookieClusterSpec.model_validate({"zookeeper": "zk:2181", "networkPolicy": {"clients": [{}]}})


def test_autoscaling_rules_match_their_cel_twins() -> None:
    with pytest.raises(ValidationError, match="minReplicas 4 must not be above maxReplicas 3"):
        Autoscaling(min_replicas=4, max_replicas=3)
    with pytest.raises(ValidationError, match=re.escape("scaleDownDiskUsage 0.8 must be below scaleUpDiskUsage 0.8")):
        Autoscaling(max_replicas=6, scale_down_disk_usage=0.8)
    spec = version_schema(BookieCluster)["schema"]["openAPIV3Schema"]["properties"]["spec"]
    autoscaling = spec["properties"]["autoscaling"]
    assert {rule["rule"] for rule in autoscaling["x-kubernetes-validations"]} == {
        "self.minReplicas <= self.maxReplicas", "self.scaleDownDiskUsage < self.scaleUpDiskUsage"}
    assert autoscaling["required"] == ["maxReplicas"]  # the others have defaults, so the rules always see them
    zoned = BookieClusterSpec(zookeeper="zk:2181", zones=["a", "b", "c"], autoscaling={"minReplicas": 2,
                                                                                    "maxReplicas": 6})
    assert cluster_problems(zoned) == ["autoscaling.minReplicas 2 cannot cover 3 zones"]


def test_an_unknown_bookie_setting_is_refused_by_the_model_naming_it_and_its_cel_twin_lists_the_same_keys() -> None:
    with pytest.raises(ValidationError, match="unknown bookie settings journal-max-waitt, port "):
        BookieSettings.model_validate({"config": {"journal-max-waitt": "0.002", "port": "3182"}})
    assert BookieSettings.model_validate({"config": {"journal-max-wait": "0.002"}}).config == {
        "journal-max-wait": "0.002"}
    spec = version_schema(BookieCluster)["schema"]["openAPIV3Schema"]["properties"]["spec"]
    config = spec["properties"]["bookie"]["properties"]["config"]
    (rule,) = config["x-kubernetes-validations"]
    assert rule["rule"] == f"self.all(key, key in {list(BOOKIE_CONFIG_KEYS)})"
    assert config["maxProperties"] == len(BOOKIE_CONFIG_KEYS)  # bounds the rule's cost, as the API server needs


def test_the_api_server_refuses_an_unknown_bookie_setting(api_server) -> None:
    """The CEL rule as a real kube-apiserver compiles and applies it: the cluster is refused before any bookie
    restarts with a flag it would not know."""
    api = install_crds(api_server)

    def cluster(name: str, config: dict[str, str]) -> dict:
        return {"apiVersion": "bookfleet.io/v1alpha1", "kind": "BookieCluster",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"zookeeper": "zk:2181", "bookie": {"config": config}}}

    with pytest.raises(ApiException) as refused:
        api.create(cluster("typo", {"journal-max-waitt": "0.002"}))
    assert refused.value.status == 422 and "config keys must be bookie settings" in refused.value.body
    created = api.create(cluster("tuned", {"journal-max-wait": "0.002"}))
    assert created["spec"]["bookie"]["config"] == {"journal-max-wait": "0.002"}


def test_names_and_printer_columns() -> None:
    bookies = crdgen.crd(RESOURCES[1])
    assert bookies["metadata"]["name"] == "bookies.bookfleet.io"
    assert bookies["spec"]["names"]["shortNames"] == ["bk"]
    columns = [column["name"] for column in bookies["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:4] == ["Phase", "Registered", "Zone", "Ledgers"] and columns[-1] == "Age"


def columns(resource) -> dict[str, str]:
    return {column["name"]: column["jsonPath"] for column in version_schema(resource)["additionalPrinterColumns"]}


def test_printer_columns_answer_the_first_questions_on_call() -> None:
    """ready/desired, phase, under-replication, repair state, data loss and age, each a field the model has."""
    assert columns(BookieCluster).keys() >= {"Ready", "Desired", "Phase", "Age"}
    assert columns(BookieCluster)["Desired"] == ".spec.replicas"
    assert columns(Ledger)["Under-replicated"] == ".status.underReplicated.missingBookies"
    assert columns(Ledger)["Repair"] == ".status.repair.state"
    assert DATA_LOSS in columns(Ledger)["Data Loss"]
    for resource in RESOURCES:
        schema = version_schema(resource)["schema"]["openAPIV3Schema"]
        for path in columns(resource).values():
            if path == crdgen.AGE["jsonPath"]:
                continue
            node = schema
            for part in path.split("[")[0].strip(".").split("."):
                node = node["properties"][part]  # a KeyError names a column that shows a field nobody writes


def test_bookie_cluster_has_a_scale_subresource_on_spec_replicas() -> None:
    scale = version_schema(BookieCluster)["subresources"]["scale"]
    assert scale["specReplicasPath"] == ".spec.replicas"
    status = version_schema(BookieCluster)["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert scale["statusReplicasPath"].removeprefix(".status.") in status
    assert "scale" not in version_schema(Ledger)["subresources"]


def test_resources_default_as_a_whole_in_the_model_and_the_crd() -> None:
    """Left out, resources get requests and limits; given, only what the user wrote (no default limit below it)."""
    spec = version_schema(BookieCluster)["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    default = BookieClusterSpec(zookeeper="zk:2181")
    assert spec["resources"]["default"] == default.resources.to_wire()
    assert default.resources.requests and default.resources.limits
    repair = spec["autoRecovery"]["properties"]["repair"]["properties"]
    assert repair["driverResources"]["default"] == default.auto_recovery.repair.driver_resources.to_wire()
    own = BookieClusterSpec(zookeeper="zk:2181", resources={"requests": {"memory": "8Gi"}})
    assert own.resources.to_wire() == {"requests": {"memory": "8Gi"}, "limits": {}}


def test_camel_case_on_the_wire_snake_case_in_python() -> None:
    ledger = Ledger.model_validate(
        {
            "metadata": {"name": "l1", "namespace": "ns", "resourceVersion": "7"},
            "spec": {"cluster": "demo", "ensembleSize": 3, "passwordSecretRef": {"name": "s", "key": "k"}},
            "status": {"ledgerId": 12, "underReplicated": {"missingBookies": ["b1"]}, "kopf": {"progress": {}}},
        }
    )
    assert (ledger.spec.ensemble_size, ledger.status.ledger_id) == (3, 12)
    assert ledger.status.under_replicated.missing_bookies == ["b1"]
    wire = ledger.to_wire()
    assert wire["spec"]["passwordSecretRef"] == {"name": "s", "key": "k"}
    assert "ledgerId" not in wire["spec"], "unset optional fields stay off the wire"
    assert wire["apiVersion"] == "bookfleet.io/v1alpha1" and wire["kind"] == "Ledger"


def test_examples_are_valid_resources_without_problems() -> None:
    cluster = BookieCluster.model_validate(yaml.safe_load((ROOT / "examples" / "bookiecluster.yaml").read_text()))
    ledger = Ledger.model_validate(yaml.safe_load((ROOT / "examples" / "ledger.yaml").read_text()))
    assert (ledger.spec.ensemble_size, ledger.spec.write_quorum, ledger.spec.ack_quorum) == (3, 3, 2)
    assert cluster.spec.replicas == 3 and ledger.spec.cluster == cluster.metadata.name
    assert cluster_problems(cluster.spec) == [] and ledger_problems(ledger.spec, cluster.spec) == []


def test_specs_the_schema_cannot_reject_get_a_clear_condition() -> None:
    cluster = BookieClusterSpec(zookeeper="zk:2181", replicas=2, zones=["zone-a", "zone-b", "zone-c"])
    assert cluster_problems(cluster) == ["replicas 2 cannot cover 3 zones: zone-c would have no bookie"]
    wide = LedgerSpec(cluster="demo", ensemble_size=5, write_quorum=3, ack_quorum=2)
    assert ledger_problems(wide, cluster) == ["ensembleSize 5 is larger than BookieCluster 'demo' (2 bookies)"]
    zoned = LedgerSpec(cluster="demo", ensemble_size=2, write_quorum=2, ack_quorum=1, zones=["zone-a"])
    assert ledger_problems(zoned, cluster) == ["ensembleSize 2 is larger than the 1 bookies in zones zone-a"]
    assert ledger_problems(LedgerSpec(cluster="demo", zones=["zone-x"]), cluster)[-1] == (
        "zones zone-x are not zones of BookieCluster 'demo'"
    )
    assert ledger_problems(wide, None) == ["BookieCluster 'demo' does not exist in this namespace"]
    condition = validity_condition(ledger_problems(wide, cluster))
    assert (condition.type, condition.status, condition.reason) == (VALID, ConditionStatus.FALSE, "InvalidSpec")
    assert "ensembleSize 5" in condition.message
    assert validity_condition([]).status == ConditionStatus.TRUE


def test_set_condition_moves_the_transition_time_only_on_a_status_change() -> None:
    import datetime as dt

    first, later = dt.datetime(2024, 1, 1, tzinfo=dt.UTC), dt.datetime(2024, 1, 2, tzinfo=dt.UTC)
    lost = Condition(type="DataLoss", status=ConditionStatus.TRUE, reason="EntriesLost")
    conditions = set_condition([], lost, now=first)
    conditions = set_condition(conditions, lost.model_copy(update={"message": "entry 7"}), now=later)
    assert len(conditions) == 1
    assert (conditions[0].message, conditions[0].last_transition_time) == ("entry 7", first)
    conditions = set_condition(conditions, Condition(type="DataLoss", status=ConditionStatus.FALSE), now=later)
    assert conditions[0].last_transition_time == later


def _object_defaults(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)] if "properties" in schema and "default" in schema else []
    for name, prop in schema.get("properties", {}).items():
        found += _object_defaults(prop, f"{path}.{name}")
    return found + (_object_defaults(schema["items"], f"{path}[]") if "items" in schema else [])


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind_name)
def test_object_defaults_carry_their_fields_defaults(resource) -> None:
    """A real API server checks an object's default against its CEL rules as written: `{}` under a rule such as
    `self.port != self.httpPort` fails with "no such key" and the whole CRD is refused (seen on kube-apiserver 1.34)."""
    for path, obj in _object_defaults(version_schema(resource)["schema"]["openAPIV3Schema"]):
        defaulted = {name for name, prop in obj["properties"].items() if "default" in prop}
        assert defaulted <= set(obj["default"]), f"{path}: default {obj['default']} lacks {defaulted}"


def server_defaults(schema: dict[str, Any], value: Any) -> Any:
    """`value` with the schema's defaults filled in, as the API server defaults an object before storing it."""
    if not isinstance(value, dict) or "properties" not in schema:
        return value
    filled = dict(value)
    for name, prop in schema["properties"].items():
        if name not in filled and "default" in prop:
            filled[name] = prop["default"]
        if name in filled:
            filled[name] = server_defaults(prop, filled[name])
    return filled


@pytest.mark.parametrize(
    "resource, minimal",
    [(BookieCluster, {"zookeeper": "zk:2181"}), (Ledger, {"cluster": "demo"})],
    ids=["BookieCluster", "Ledger"],
)
def test_the_api_server_fills_the_same_defaults_as_the_models(resource, minimal) -> None:
    """A resource applied with only its required fields gets the defaults the operator's models assume."""
    schema = version_schema(resource)["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_model = resource.model_fields["spec"].annotation
    expected = spec_model.model_validate(minimal).to_wire()
    assert without_empty(server_defaults(schema, minimal)) == without_empty(expected)


def without_empty(value: Any) -> Any:
    """Empty lists and maps left out: an absent list and an empty one mean the same to the operator."""
    if isinstance(value, dict):
        kept = {key: without_empty(item) for key, item in value.items()}
        return {key: item for key, item in kept.items() if item not in ([], {})}
    return value


def test_a_cluster_is_validated_once_per_version_and_anew_when_it_changes() -> None:
    """Every pass of 100,000 Ledgers reads their cluster: one validation per version of it, shared."""
    body = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "BookieCluster",
            "metadata": {"name": "bk", "namespace": "ns", "uid": "u-1", "resourceVersion": "1"},
            "spec": {"replicas": 3, "zookeeper": "zk:2181"}}
    first = validated_cluster(body)
    assert validated_cluster({**body, "metadata": dict(body["metadata"])}) is first
    changed = {**body, "metadata": {**body["metadata"], "resourceVersion": "2"},
               "spec": {**body["spec"], "replicas": 5}}
    assert validated_cluster(changed).spec.replicas == 5 and first.spec.replicas == 3
    unversioned = {**body, "metadata": {"name": "bk", "namespace": "ns"}}
    assert validated_cluster(unversioned) is not validated_cluster(unversioned)  # nothing to key it by


def test_the_api_server_refuses_a_new_zookeeper_or_storage_class_and_takes_a_larger_volume(api_server) -> None:
    """A new spec.zookeeper left every bookie crash-looping on its cookie, and a new storageClassName was ignored
    (claims keep their class): both are refused at the API server now, with a message that says why; a volume's size
    still grows."""
    api = install_crds(api_server)
    cluster = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "BookieCluster",
               "metadata": {"name": "bk", "namespace": "default"}, "spec": {"zookeeper": "zk:2181"}}
    api.create(cluster)

    def refusal(spec: dict[str, Any]) -> str:
        try:
            api.patch(CUSTOM, "bookieclusters", "default", "bk", {"spec": spec})
        except ApiException as exc:
            assert exc.status == 422
            return exc.body
        return ""

    assert "zookeeper is immutable" in refusal({"zookeeper": "other-zk:2181"})
    assert "storageClassName is immutable" in refusal({"storage": {"ledgers": {"storageClassName": "fast"}}})
    assert refusal({"storage": {"ledgers": {"size": "20Gi"}}, "replicas": 4}) == ""


def without_rollout(manifest: dict[str, Any]) -> dict[str, Any]:
    """The BookieCluster CRD of release 0.1.0, which had no spec.rollout."""
    released = copy.deepcopy(manifest)
    spec = released["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    del spec["properties"]["rollout"]
    return released


def test_the_operator_applies_its_crds_so_a_field_added_later_is_served_and_no_image_is_stored(api_server) -> None:
    """`helm upgrade` never touches the chart's crds/: a field added by a later release was pruned from every object
    that set it. The operator applies its own CRDs at its start (server-side, field manager bookfleet); a CRD a newer
    operator applied is left alone. Objects no longer store an image: empty means the operator's own version's."""
    api = KubeApi(kubernetes.config.new_client_from_config(str(api_server.kubeconfig)))
    api.create(without_rollout(crdgen.crd(BookieCluster)))
    cluster = {"apiVersion": "bookfleet.io/v1alpha1", "kind": "BookieCluster",
               "metadata": {"name": "bk", "namespace": "default"},
               "spec": {"zookeeper": "zk:2181", "rollout": {"paused": True}}}
    wait_for(lambda: api.served(CUSTOM, "bookieclusters", "default"), 60, "the released CRD served")
    created = api.create(cluster)
    assert "rollout" not in created["spec"], "pruned by the released CRD"
    assert created["spec"]["image"] == ""

    assert crdgen.apply_crds(api) == [crdgen.crd(resource)["metadata"]["name"] for resource in RESOURCES] + [
        crdgen.KOPF_PEERING["metadata"]["name"]]

    def paused_kept() -> bool:
        patched = api.patch(CUSTOM, "bookieclusters", "default", "bk", {"spec": {"rollout": {"paused": True}}})
        return patched["spec"].get("rollout") == {"paused": True}

    wait_for(paused_kept, 60, "spec.rollout served after the operator applied its CRDs")
    crd = api.get(crdgen.CRDS, "customresourcedefinitions", None, BookieCluster.crd_name())
    assert crd["metadata"]["annotations"][crdgen.ANNOTATION_OPERATOR_VERSION] == __version__
    assert crdgen.CRD_FIELD_MANAGER in {entry["manager"] for entry in crd["metadata"]["managedFields"]}
    assert crdgen.apply_crds(api, version="0.0.1") == [], "an older operator leaves a newer one's CRDs alone"
    assert api.get(CUSTOM, "bookieclusters", "default", "bk")["spec"]["rollout"] == {"paused": True}


def test_the_charts_operator_account_may_apply_its_crds_and_nothing_else(api_server) -> None:
    """The chart's ClusterRole lets the operator patch its four CRDs by name (applyCRDs), as a real API server
    authorizes a server-side apply: it applies them, and may not patch another CRD."""
    install_crds(api_server)
    admin = kubernetes.config.new_client_from_config(str(api_server.kubeconfig))
    KubeApi(admin).create(crdgen.KOPF_PEERING)  # the four as `helm install` puts them from crds/
    account = "system:serviceaccount:bookfleet:bookfleet"
    rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
    (role,) = [obj for obj in render_chart({}) if obj["kind"] == "ClusterRole"]
    rbac.create_cluster_role(role)
    rbac.create_cluster_role_binding({
        "metadata": {"name": "bookfleet"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                       "name": role["metadata"]["name"]},
        "subjects": [{"kind": "User", "name": account}]})
    operator = kubernetes.config.new_client_from_config(str(api_server.kubeconfig))
    operator.set_default_header("Impersonate-User", account)
    api = KubeApi(operator)
    wait_for(lambda: api.get(crdgen.CRDS, "customresourcedefinitions", None, BookieCluster.crd_name()) is not None,
             30, "the ClusterRole in force")
    assert len(crdgen.apply_crds(api)) == 4
    other = {**crdgen.KOPF_PEERING, "metadata": {"name": "others.example.com"},
             "spec": {**crdgen.KOPF_PEERING["spec"], "group": "example.com",
                      "names": {"kind": "Other", "plural": "others", "singular": "other"}}}
    with pytest.raises(ApiException) as refused:
        api.apply(other, manager=crdgen.CRD_FIELD_MANAGER)
    assert refused.value.status == 403
