"""Against a real cluster (kind): the generated CRDs are accepted and their CEL rules enforced by a real API server.

These carry the `kind` marker and skip unless a kubeconfig is present ($KUBECONFIG or ~/.kube/config).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBECONFIG = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))

pytestmark = [
    pytest.mark.kind,
    pytest.mark.skipif(not KUBECONFIG.is_file(), reason=f"no kubeconfig at {KUBECONFIG}: needs a real cluster"),
]


def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(KUBECONFIG), *args], input=stdin, capture_output=True, text=True, timeout=60
    )


def test_crds_and_examples_are_accepted_by_the_api_server():
    applied = kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
    assert applied.returncode == 0, applied.stderr
    for crd in ("bookieclusters", "bookies", "ledgers"):
        established = kubectl("wait", "--for=condition=Established", f"crd/{crd}.bookfleet.io", "--timeout=60s")
        assert established.returncode == 0, established.stderr
    dry_run = kubectl("apply", "--dry-run=server", "-f", str(ROOT / "examples"))
    assert dry_run.returncode == 0, dry_run.stderr


def test_the_quorum_rule_is_enforced_by_the_api_server():
    ledger = yaml.safe_load((ROOT / "examples" / "ledger.yaml").read_text())
    ledger["spec"]["ackQuorum"] = ledger["spec"]["writeQuorum"] + 1
    rejected = kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(ledger))
    assert rejected.returncode != 0
    assert "ackQuorum" in rejected.stderr or "Qa" in rejected.stderr, rejected.stderr
