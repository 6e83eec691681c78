"""The README's `kubectl apply -f examples/` against the emulator, with the chart's CRDs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bookfleet.kube.models import BookieCluster, Ledger

REPO = Path(__file__).resolve().parents[2]
MODELS = {"BookieCluster": BookieCluster, "Ledger": Ledger}

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


def kubectl(kube, *args: str) -> str:
    result = subprocess.run(["kubectl", "--kubeconfig", str(kube.kubeconfig), *args], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _keeps(stored: object, written: object) -> bool:
    """Every field written is stored with the same value; stored objects may carry more (defaults)."""
    if isinstance(written, dict):
        return isinstance(stored, dict) and all(k in stored and _keeps(stored[k], v) for k, v in written.items())
    return stored == written


def test_examples_apply_and_match_the_models(kube):
    kubectl(kube, "apply", "--validate=false", "-f", str(REPO / "charts/bookfleet/crds"))
    applied = kubectl(kube, "apply", "--validate=false", "-f", str(REPO / "examples"))
    documents = [d for f in sorted((REPO / "examples").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    assert applied.count(" created") == len(documents)
    for document in documents:
        plural = MODELS[document["kind"]].plural
        stored = json.loads(kubectl(kube, "get", plural, document["metadata"]["name"], "-o", "json"))
        # A real API server fills in the schema's defaults: what the file says is kept, the rest is added.
        assert _keeps(stored["spec"], document["spec"]), (stored["spec"], document["spec"])
        MODELS[document["kind"]].model_validate(stored)
    assert " created" not in kubectl(kube, "apply", "--validate=false", "-f", str(REPO / "examples"))
    header, row = kubectl(kube, "get", "ledgers").splitlines()
    assert header.split()[:3] == ["NAME", "LEDGER", "ID"] and row.split()[0] == "demo-ledger"
