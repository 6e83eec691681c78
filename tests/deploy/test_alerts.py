"""The chart's PrometheusRule, checked by Prometheus' own promtool (built from its Go module by
scripts/build-promtool.sh): `promtool check rules`, and `promtool test rules` with series that make each alert fire
and series that must not. The rule is rendered by helm itself, told the PrometheusRule CRD exists (its capability
check); the offline render without that answer has none (test_chart.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.cluster.__main__ import ROOT, build
from tests.fixtures.manifests import CHART

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="no Go toolchain to build promtool and helm")

FLEET = {"namespace": "storage", "bookiecluster": "bk"}
OPERATOR = {**FLEET, "pod": "bookfleet-operator-0"}
"""A sample as the operator's monitors store it (honorLabels: the sample's namespace is its cluster's)."""


@pytest.fixture(scope="module")
def promtool() -> Path:
    result = subprocess.run([str(ROOT / "scripts" / "build-promtool.sh")], check=True, stdout=subprocess.PIPE,
                            text=True)
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def rule() -> dict:
    """The chart's PrometheusRule as `helm template` renders it where the CRD is installed."""
    rendered = subprocess.run(
        [str(build() / "helm"), "template", "bookfleet", str(CHART), "--namespace", "bookfleet",
         "--api-versions", "monitoring.coreos.com/v1/PrometheusRule", "--kube-version", "1.30.0"],
        check=True, stdout=subprocess.PIPE, text=True).stdout
    (found,) = [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "PrometheusRule"]
    return found


def series(name: str, values: str, **labels: str) -> dict:
    matchers = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return {"series": f"{name}{{{matchers}}}", "values": values}


@dataclass
class Case:
    """An alert's series over `minutes` minutes (one sample a minute): it fires, with these labels, or must not."""

    alert: str
    input_series: list[dict]
    minutes: int
    fires: dict[str, str] | None = None
    why: str = ""


CASES = [
    Case("BookfleetLedgersUnderReplicated",
         [series("bookfleet_operator_oldest_under_replicated_seconds", "0+60x40", **OPERATOR)], 40, FLEET,
         "a marker 40 minutes old (the default limit: 30)"),
    Case("BookfleetLedgersUnderReplicated",
         [series("bookfleet_operator_oldest_under_replicated_seconds", "0+60x20 0x20", **OPERATOR)], 40, None,
         "repaired after 20 minutes"),
    Case("BookfleetDataLoss", [series("bookfleet_operator_ledgers_data_loss", "0 0 1x5", **OPERATOR)], 5, FLEET),
    Case("BookfleetDataLoss", [series("bookfleet_operator_ledgers_data_loss", "0x5", **OPERATOR)], 5),
    Case("BookfleetRepairGaveUp", [series("bookfleet_operator_repairs_given_up", "0 1x5", **OPERATOR)], 5, FLEET),
    Case("BookfleetRepairGaveUp", [series("bookfleet_operator_repairs_given_up", "0x5", **OPERATOR)], 5),
    Case("BookfleetRolloutStuck", [series("bookfleet_operator_rollout_stuck", "0 1x5", **OPERATOR)], 5, FLEET),
    Case("BookfleetRolloutStuck", [series("bookfleet_operator_rollout_stuck", "0x5", **OPERATOR)], 5),
    Case("BookfleetBookieReadOnly", [series("bookie_read_only", "0 1x15", pod="bk-1", **FLEET)], 15,
         {**FLEET, "pod": "bk-1"}),
    Case("BookfleetBookieReadOnly", [series("bookie_read_only", "0 1x5 0x10", pod="bk-1", **FLEET)], 15, None,
         "writable again within the 10 minutes"),
    Case("BookfleetOperatorReconcileErrors",
         [series("bookfleet_operator_reconcile_errors_total", "0+1x30", resource="bookies", **OPERATOR)], 30,
         {**FLEET, "resource": "bookies"}, "a failing pass every minute"),
    Case("BookfleetOperatorReconcileErrors",
         [series("bookfleet_operator_reconcile_errors_total", "0 1x30", resource="bookies", **OPERATOR)], 30, None,
         "one failed pass, then all well"),
    Case("BookfleetBelowWriteQuorum",
         [series("bookfleet_operator_writable_bookies", "3 1x5", zone="a", **OPERATOR),
          series("bookfleet_operator_writable_bookies", "1x6", zone="b", **OPERATOR)], 5, FLEET,
         "zone a down to one: two writable in all"),
    Case("BookfleetBelowWriteQuorum",
         [series("bookfleet_operator_writable_bookies", "2x5", zone="a", **OPERATOR),
          series("bookfleet_operator_writable_bookies", "2x5", zone="a", **{**OPERATOR, "pod": "op-1"}),
          series("bookfleet_operator_writable_bookies", "1x5", zone="b", **OPERATOR)], 5, None,
         "three writable; both operator replicas serving zone a during a handover count once"),
    Case("BookfleetZoneWithoutWritableBookie",
         [series("bookfleet_operator_writable_bookies", "1 0x5", zone="a", **OPERATOR),
          series("bookfleet_operator_writable_bookies", "3x5", zone="b", **OPERATOR)], 5, {**FLEET, "zone": "a"}),
    Case("BookfleetZoneWithoutWritableBookie",
         [series("bookfleet_operator_writable_bookies", "0x5", zone="", **OPERATOR),
          series("bookfleet_operator_writable_bookies", "3x5", zone="b", **OPERATOR)], 5, None,
         "bookies without a zone are not a zone"),
]


def test_every_alert_has_a_case_that_fires_and_one_that_does_not(rule: dict) -> None:
    alerts = {r["alert"] for group in rule["spec"]["groups"] for r in group["rules"]}
    assert {case.alert for case in CASES if case.fires} == alerts == {case.alert for case in CASES if not case.fires}


def expanded(template: str, labels: dict[str, str]) -> str:
    """An annotation as Prometheus expands it: this rule file's templates only name labels."""
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda match: labels[match.group(1)], template)


def test_promtool_checks_the_rules_and_each_alert_fires_only_on_its_series(promtool: Path, rule: dict,
                                                                          tmp_path: Path) -> None:
    rules_file = tmp_path / "bookfleet.rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    checked = subprocess.run([str(promtool), "check", "rules", str(rules_file)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    by_name = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    tests = []
    for case in CASES:
        expected = []
        if case.fires is not None:
            alert = by_name[case.alert]
            expected = [{"exp_labels": {**alert["labels"], **case.fires},
                         "exp_annotations": {key: expanded(text, case.fires)
                                             for key, text in alert["annotations"].items()}}]
        tests.append({"interval": "1m", "input_series": case.input_series, "name": f"{case.alert}: {case.why}",
                      "alert_rule_test": [{"eval_time": f"{case.minutes}m", "alertname": case.alert,
                                           "exp_alerts": expected}]})
    test_file = tmp_path / "bookfleet.rules.test.yaml"
    test_file.write_text(yaml.safe_dump({"rule_files": [rules_file.name], "evaluation_interval": "1m",
                                         "tests": tests}))
    result = subprocess.run([str(promtool), "test", "rules", str(test_file)], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
