"""`helm upgrade` from release N to N+1 with the real helm binary on a real API server (no nodes: nothing here runs a
pod). What the chart side of an upgrade must hold for an operator upgrade to restart no bookie it need not: the
BookieCluster's spec is not touched, the operator's pod changes only in its image, and the CRDs helm leaves alone
are left to the operator (--apply-crds). The operator's side, given those: tests/kube/test_operator_upgrade.py (a
restart with the same settings rolls nothing; a new bookie image rolls one cluster at a time) and
tests/kube/test_crds.py (it applies its CRDs, with the chart's ClusterRole, so a field added later is served)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from bookfleet.kube.models import BookieCluster
from bookfleet.kube.runtime.api import CUSTOM, KubeApi
from tests.cluster.__main__ import build
from tests.cluster.controlplane import ControlPlane
from tests.fixtures.manifests import CHART

NAMESPACE = "bookfleet"
NEXT_OPERATOR = "0.1.1"
RELEASE_MARK = "bookfleet.io/test-release"
"""An annotation only release N+1's CRDs carry: helm upgrade must not bring it."""


def helm(api_server: ControlPlane, *args: str) -> str:
    result = subprocess.run([str(build() / "helm"), "--kubeconfig", str(api_server.kubeconfig), *args],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"helm {' '.join(args)}: {result.stdout}\n{result.stderr}"
    return result.stdout


def next_release(folder: Path) -> Path:
    """The chart as its next release: a new chart version, and CRDs that differ (marked) from the installed ones."""
    chart = folder / "bookfleet"
    shutil.copytree(CHART, chart)
    metadata = yaml.safe_load((chart / "Chart.yaml").read_text())
    (chart / "Chart.yaml").write_text(yaml.safe_dump({**metadata, "version": NEXT_OPERATOR}))
    for path in (chart / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        crd["metadata"].setdefault("annotations", {})[RELEASE_MARK] = NEXT_OPERATOR
        path.write_text(yaml.safe_dump(crd))
    return chart


def operator_pod(api: KubeApi) -> dict[str, Any]:
    deployment = api.get("apps/v1", "deployments", NAMESPACE, "bookfleet")
    assert deployment is not None
    return deployment["spec"]["template"]


def test_helm_upgrade_to_a_new_operator_leaves_the_bookie_cluster_and_the_crds_to_the_operator(api_server, tmp_path):
    api = KubeApi(kubernetes.config.new_client_from_config(str(api_server.kubeconfig)))
    values = ["--set", "bookieCluster.enabled=true", "--set", "bookieCluster.zookeeper=zk.example:2181"]
    helm(api_server, "install", "bookfleet", str(CHART), "--namespace", NAMESPACE, "--create-namespace", *values)
    cluster = api.get(CUSTOM, "bookieclusters", NAMESPACE, "bookfleet")
    assert cluster is not None and not BookieCluster.model_validate(cluster).spec.image.endswith(NEXT_OPERATOR)
    before = operator_pod(api)
    crd = api.get("apiextensions.k8s.io/v1", "customresourcedefinitions", None, BookieCluster.crd_name())

    helm(api_server, "upgrade", "bookfleet", str(next_release(tmp_path)), "--namespace", NAMESPACE,
         "--reuse-values", "--set", f"image.operator.tag={NEXT_OPERATOR}")

    upgraded = api.get(CUSTOM, "bookieclusters", NAMESPACE, "bookfleet")
    assert upgraded is not None
    assert (upgraded["metadata"]["generation"], upgraded["spec"]) == (cluster["metadata"]["generation"],
                                                                    cluster["spec"])
    after = operator_pod(api)
    (old,), (new,) = before["spec"]["containers"], after["spec"]["containers"]
    assert new["image"] == f"bookfleet/operator:{NEXT_OPERATOR}" != old["image"]
    assert json.dumps({**after, "spec": {**after["spec"], "containers": [{**new, "image": ""}]}}, sort_keys=True) == \
        json.dumps({**before, "spec": {**before["spec"], "containers": [{**old, "image": ""}]}}, sort_keys=True)
    assert "--apply-crds" in new["command"]
    live = api.get("apiextensions.k8s.io/v1", "customresourcedefinitions", None, BookieCluster.crd_name())
    assert live is not None and crd is not None
    assert RELEASE_MARK not in (live["metadata"].get("annotations") or {}), "helm upgrade never applies crds/"
    assert live["metadata"]["resourceVersion"] == crd["metadata"]["resourceVersion"]
