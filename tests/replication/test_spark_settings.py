"""Spark session settings: loopback driver addresses only where this process picks a local master itself.

A repair Job runs spark-submit with `--conf spark.driver.host=$(POD_IP)`; if the session forced 127.0.0.1 over it,
executor pods would be told to connect to their own loopback and never register, and the Job would never finish.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bookfleet import spark

# A loopback address other than 127.0.0.1, so the test can tell the given driver host from the forced one.
GIVEN_DRIVER_HOST = "127.0.0.2"

PROBE = """\
from bookfleet import spark
session = spark.session(None)
print("driver.host=" + session.conf.get("spark.driver.host"))
session.stop()
"""


def test_loopback_driver_settings_only_for_a_local_master() -> None:
    for master in ("local[2]", "local", "local[*]"):
        assert spark.session_conf(master)["spark.driver.host"] == spark.LOCAL_IP
    for master in (None, "k8s://https://kubernetes.default.svc", "spark://master:7077"):
        conf = spark.session_conf(master)
        assert "spark.driver.host" not in conf and "spark.driver.bindAddress" not in conf
        assert conf["spark.ui.enabled"] == "false"


@pytest.mark.spark
def test_a_session_under_spark_submit_keeps_the_driver_host_it_was_given(tmp_path: Path) -> None:
    """The job's own session (master None) must not override spark-submit's driver host, as on Kubernetes."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    command = [spark.spark_submit_binary(), "--master", "local[1]"]
    for key, value in {
        "spark.driver.host": GIVEN_DRIVER_HOST,
        "spark.driver.bindAddress": spark.LOCAL_IP,
        "spark.ui.enabled": "false",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }.items():
        command += ["--conf", f"{key}={value}"]
    result = subprocess.run([*command, str(probe)], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"driver.host={GIVEN_DRIVER_HOST}" in result.stdout.splitlines()


def test_a_small_repair_plan_runs_in_the_driver_alone_and_a_large_one_on_the_masters_executors() -> None:
    """A repair Job's plan of a few MB would wait longer for its executor pods than it copies: under the limit it runs
    `local[cores]` in the driver; over it, or with the limit 0, on the master it was given."""
    k8s, mb = "k8s://https://kubernetes.default.svc", 1_000_000
    assert spark.repair_master(None, 2 * mb, 256, 2) == "local[2]"  # None: spark-submit's master
    assert spark.repair_master(k8s, 256 * mb, 256, 4) == "local[4]"
    assert spark.repair_master(k8s, 256 * mb + 1, 256, 2) == k8s
    assert spark.repair_master(None, 300 * mb, 256, 2) is None
    assert spark.repair_master(k8s, 1, 0, 2) == k8s  # 0: executors for every plan
    assert spark.repair_master("local[2]", 1, 256, 8) == "local[2]"  # a local master stays as given
    assert spark.repair_master(k8s, 0, 256, 0) == "local[1]"


SMALL_PLAN_PROBE = """\
from bookfleet import spark
session = spark.session(spark.repair_master(None, 1_000_000, 256, 2))
print("master=" + session.sparkContext.master, "sum=" + str(session.sparkContext.parallelize(range(4), 2).sum()))
session.stop()
"""


@pytest.mark.spark
def test_a_small_plan_runs_locally_under_spark_submit_whatever_master_it_was_given(tmp_path: Path) -> None:
    """The driver of a repair Job is started by spark-submit with the cluster's master; a small plan's session runs
    in the driver's own JVM instead. The master given here answers nobody: on it the probe would never get a core."""
    probe = tmp_path / "probe.py"
    probe.write_text(SMALL_PLAN_PROBE)
    command = [spark.spark_submit_binary(), "--master", "spark://127.0.0.1:9", "--deploy-mode", "client"]
    for key, value in {"spark.executor.instances": "2", "spark.pyspark.python": sys.executable,
                       "spark.pyspark.driver.python": sys.executable}.items():
        command += ["--conf", f"{key}={value}"]
    result = subprocess.run([*command, str(probe)], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "master=local[2] sum=6" in result.stdout.splitlines()


def test_only_the_zips_of_an_installed_pyspark_move_behind_the_package(tmp_path: Path) -> None:
    """Spark puts SPARK_HOME/python/lib/*.zip first on a worker's path; when SPARK_HOME is the pip package, its
    installed modules (with cached bytecode) are the same code and must win over the zips."""
    site = tmp_path / "site-packages"
    (site / "pyspark" / "python" / "lib").mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    own = [str(site / "pyspark" / "python" / "lib" / name) for name in ("pyspark.zip", "py4j-0.10.9.9-src.zip")]
    other = str(tmp_path / "opt" / "spark" / "python" / "lib" / "pyspark.zip")  # a Spark distribution's
    path = [*own, other, "/usr/lib/python311.zip", str(site)]
    assert spark.installed_pyspark_first(path) == [other, "/usr/lib/python311.zip", str(site), *own]
    assert spark.installed_pyspark_first([other, str(site)]) == [other, str(site)]


def worker_probe(_: object) -> list[object]:
    import os
    import sys

    import pyspark

    parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    return [pyspark.__file__, "bookfleet.replication.repair" in sys.modules, [arg.decode() for arg in parent]]


@pytest.mark.spark
def test_tasks_run_in_workers_forked_from_bookfleets_daemon_with_the_job_code_imported(request) -> None:
    session = request.getfixturevalue("spark")  # the fixture's name is taken by the module here
    ((package_file, imported, daemon_command),) = session.sparkContext.parallelize([0], 1).map(worker_probe).collect()
    assert daemon_command[1:3] == ["-m", "bookfleet.replication.sparkdaemon"]
    assert imported, "the repair code was not imported by the daemon before the fork"
    assert ".zip" not in package_file, package_file
