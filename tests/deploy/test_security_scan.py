"""checkov over everything the chart renders and the operator builds: every failed check is either fixed or listed
in tests/security-scan-skips.yaml with its reason, and every listed skip still matches a failure.

checkov lives in its own virtualenv (`make test` builds it once per version in ~/.cache/bookfleet/checkov-VERSION:
its pins clash with the project's dev tools) and is found through BOOKFLEET_CHECKOV. `make test` sets both that and
BOOKFLEET_REQUIRE_SCAN=1, so there a missing checkov fails instead of skipping.
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

SKIPS = Path(__file__).resolve().parent / "security-scan-skips.yaml"
CHECKOV = Path(os.environ.get("BOOKFLEET_CHECKOV", "checkov-not-configured"))


def checkov_or_skip() -> Path:
    if CHECKOV.exists():
        return CHECKOV
    message = f"checkov is not installed at {CHECKOV} (BOOKFLEET_CHECKOV): `make test` installs and sets it"
    if os.environ.get("BOOKFLEET_REQUIRE_SCAN"):
        pytest.fail(message)
    pytest.skip(message)


def scan(objects: list[dict[str, Any]], directory: Path) -> dict[str, Any]:
    """checkov's Kubernetes report on `objects`, offline (no platform download)."""
    manifests = directory / "manifests.yaml"
    manifests.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    command = [str(checkov_or_skip()), "--file", str(manifests), "--framework", "kubernetes", "--output", "json",
               "--compact", "--skip-download"]
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_NO_OUTPUT_COLORS": "TRUE"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=directory)
    assert result.returncode in (0, 1), result.stderr[-2000:]  # 1: some check failed
    report = json.loads(result.stdout)
    return report[0] if isinstance(report, list) else report


def failures(report: dict[str, Any]) -> set[tuple[str, str]]:
    """(check id, Kind/name) of every failed check."""
    found = set()
    for check in report["results"]["failed_checks"]:
        kind, _namespace, name = check["resource"].split(".", 2)
        found.add((check["check_id"], f"{kind}/{name}"))
    return found


def explained(failure: tuple[str, str], skips: dict[str, Any]) -> bool:
    check, obj = failure
    return check in skips and any(fnmatch.fnmatchcase(obj, pattern) or pattern == "*"
                                  for pattern in skips[check]["objects"])


def test_every_failed_check_is_fixed_or_skipped_with_a_reason(shipped_objects, tmp_path: Path) -> None:
    report = scan(shipped_objects, tmp_path)
    summary = report["summary"]
    assert summary["parsing_errors"] == 0 and summary["passed"] > 0
    assert summary["resource_count"] >= len([o for o in shipped_objects if o["kind"] != "SparkApplication"]) - 5
    skips = yaml.safe_load(SKIPS.read_text())
    assert all(entry["reason"].strip() and entry["objects"] for entry in skips.values())
    found = failures(report)
    assert sorted(failure for failure in found if not explained(failure, skips)) == []
    stale = [check for check in skips if not any(failed == check for failed, _ in found)]
    assert stale == [], "skips that no longer match a failure: remove them"
    scanned = {check["resource"].split(".")[0] for check in report["results"]["passed_checks"]}
    assert {"Pod", "Job", "Deployment", "StatefulSet", "Role", "ClusterRole"} <= scanned
