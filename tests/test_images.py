"""The images: the operator writes repair Jobs without pyspark (its image has none)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

from bookfleet import spark
from bookfleet.kube.models import BookieCluster

ROOT = Path(__file__).resolve().parents[1]

HIDE_PYSPARK = """
import sys
from importlib.machinery import PathFinder

HIDDEN = {"pyspark", "py4j"}


class WithoutPyspark(PathFinder):
    '''The path finder of an interpreter where pyspark is not installed: no module, no distribution.'''

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.partition(".")[0] in HIDDEN else super().find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        return (d for d in super().find_distributions(*args, **kwargs) if d.metadata["Name"] not in HIDDEN)


sys.meta_path[sys.meta_path.index(PathFinder)] = WithoutPyspark
"""

REPAIR_SPECS = """
import datetime as dt
import importlib.util
import json
import sys

from bookfleet.kube import resources
from bookfleet.kube.models import Bookie, BookieCluster

assert importlib.util.find_spec("pyspark") is None, "pyspark is importable here"
cluster = BookieCluster.model_validate(
    {"metadata": {"name": "demo", "namespace": "storage", "uid": "u1"}, "spec": {"zookeeper": "zk:2181"}}
)
bookie = resources.bookies_for_cluster(cluster)[0]
bookie = Bookie.model_validate({**bookie, "metadata": {**bookie["metadata"], "uid": "u2"}})
lost = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
job = resources.repair_job(cluster, bookie, lost, ledgers=[7])
application = resources.spark_application(cluster, bookie, lost, ledgers=[7])
(driver,) = job["spec"]["template"]["spec"]["containers"]
print(json.dumps({"driver": driver, "application": application["spec"], "pyspark": "pyspark" in sys.modules}))
"""


def check_repair_specs(stdout: str) -> None:
    specs = json.loads(stdout.splitlines()[-1])
    defaults = BookieCluster.model_validate({"metadata": {"name": "demo"}, "spec": {"zookeeper": "zk:2181"}}).spec
    repair_image = defaults.image
    driver, application = specs["driver"], specs["application"]
    assert driver["image"] == application["image"] == repair_image
    assert driver["command"][0] == "spark-submit"
    assert f"spark.kubernetes.container.image={repair_image}" in driver["command"]
    assert driver["command"][-2:] == ["--ledger", "7"]
    assert application["sparkVersion"] == spark.SPARK_VERSION
    assert specs["pyspark"] is False


def test_the_operator_builds_repair_jobs_where_pyspark_is_not_installed() -> None:
    """The operator image has no pyspark: writing a repair Job must not need it (it raised AttributeError there)."""
    result = subprocess.run(
        [sys.executable, "-c", HIDE_PYSPARK + REPAIR_SPECS], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    check_repair_specs(result.stdout)


def test_the_operator_names_the_spark_version_of_pyspark() -> None:
    assert importlib.metadata.version("pyspark") == spark.SPARK_VERSION
