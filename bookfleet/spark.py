"""Spark settings in one place: the in-process SparkSession and the spark-submit command line.

The repair and audit jobs run the same code whether the driver lives in this process (standalone fleet, tests,
`bookfleet repair`) or is launched by spark-submit (the operator's Kubernetes Job, `--master k8s://...`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bookfleet import childprocess

DEFAULT_MASTER = "local[2]"
LOCAL_IP = "127.0.0.1"
IMAGE_APP_DIR = "/opt/bookfleet"
"""Where the bookfleet image keeps its Spark entry points (the operator's image copies them there)."""

SESSION_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.python.worker.reuse": "true",
    "spark.task.maxFailures": "2",
    "spark.python.daemon.module": "bookfleet.replication.sparkdaemon",
}
LOOPBACK_DRIVER_CONF = {"spark.driver.host": LOCAL_IP, "spark.driver.bindAddress": LOCAL_IP}
"""Only for a local master this process picks itself: under spark-submit on Kubernetes the driver's address is the
pod IP it was given (`--conf spark.driver.host=$(POD_IP)`), and executors in other pods must reach it there."""


LOG4J2_PROPERTIES = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""
"""Spark's JVM logs errors only: its default profile fills a terminal (and the demo) with startup notices."""


def log4j2_config() -> Path:
    """The log4j2 file for the driver JVM, written once per user under the temp dir."""
    path = Path(tempfile.gettempdir()) / f"bookfleet-spark-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != LOG4J2_PROPERTIES:
        path.write_text(LOG4J2_PROPERTIES)
    return path


def installed_pyspark_first(path: list[str]) -> list[str]:
    """`path` with the zips of a pip-installed pyspark (SPARK_HOME = the package, as in our image and venv) moved
    to the end: the package's own modules, with their cached bytecode, are the same code (Spark puts the zips
    first, and zipimport compiles every module from source in each new process). Zips of any other Spark
    installation keep their place: the installed package might be another version."""

    def inside_installed_pyspark(entry: str) -> bool:
        parts = Path(entry).parts
        package = Path(*parts[:-3]) if len(parts) > 3 else None
        return (
            entry.endswith(".zip")
            and parts[-4:-1] == ("pyspark", "python", "lib")
            and package is not None
            and (package / "__init__.py").is_file()
        )

    moved = [entry for entry in path if inside_installed_pyspark(entry)]
    return [entry for entry in path if entry not in moved] + moved


def is_local(master: str | None) -> bool:
    """Whether `master` is one this process runs itself (None: whatever spark-submit was given)."""
    return master is not None and master.startswith("local")


def session_conf(master: str | None) -> dict[str, str]:
    """The settings a new session gets on `master`: loopback driver addresses only for a local master."""
    return {**SESSION_CONF, **(LOOPBACK_DRIVER_CONF if is_local(master) else {})}


def prepare_environment(master: str | None) -> None:
    """A local Spark binds the external interface unless told otherwise; workers must run this interpreter."""
    if is_local(master):
        os.environ.setdefault("SPARK_LOCAL_IP", LOCAL_IP)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def session(master: str | None = DEFAULT_MASTER, app_name: str = "bookfleet"):
    """The active SparkSession, or a new one on `master` (None: the master spark-submit was given).

    An active session is reused whatever its master, so tests and the standalone fleet pay the JVM start once.
    """
    prepare_environment(master)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    for key, value in session_conf(master).items():
        builder = builder.config(key, value)
    builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j2_config()}")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


WARM_UP_JOB_GROUP = "bookfleet-warm-up"


def warm_up(spark) -> None:
    """Run one trivial Python task per core on `spark`, so a repair after a loss does not pay the session's first
    job: class loading and JIT of Spark's scheduler path, the Python daemon's start and a worker fork per core
    (seconds of CPU on a 2-core machine, as much as the copying of a small repair). A session kept for many runs
    (the standalone runner's) pays it once at start, as BookKeeper's always-running replication workers do."""
    context = spark.sparkContext
    slots = max(1, context.defaultParallelism)
    context.setJobGroup(WARM_UP_JOB_GROUP, "warm-up: class loading, JIT, the Python daemon and its workers")
    try:
        context.parallelize(range(slots), slots).map(abs).collect()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
        context.setLocalProperty("spark.job.description", None)


def spark_submit_binary() -> str:
    """spark-submit from the pyspark wheel, so no separate Spark install is needed."""
    (package_dir,) = importlib.util.find_spec("pyspark").submodule_search_locations
    return str(Path(package_dir) / "bin" / "spark-submit")


DEFAULT_LOCK_WAIT_S = 600.0
"""How long a repair run waits, once its own work is done, for ledgers whose repair lock another repair holds (two
lost bookies' Jobs read the same markers): bounded, so a stuck holder cannot keep a Job alive for ever. Here, not in
the job, because the operator (no pyspark, no repair counters) sets it on its Jobs."""


DEFAULT_LOCAL_MODE_MAX_MB = 256.0
"""The largest repair plan (MB to copy) run in the driver alone, Spark `local[N]`, rather than on executor pods:
asking Kubernetes for executor pods and waiting for them to start and register costs 7 s on a quiet local cluster
and ~40 s on a loaded one before the first task (the zone loss's driver ran 66 s of repair with executors, 27 s in
local mode: docs/chaos.md, "Zone loss and zone partition"), while a driver copying with the executors' parallelism
restores 4-13 MB/s of 1 KiB entries and 50-150 MB/s of 64 KiB ones (`bench repair`): 256 MB is about what the
slowest rate copies while executors come up on a loaded cluster. Here, not in the job: the operator sets it on its
Jobs."""


def repair_master(given: str | None, planned_bytes: int, local_max_mb: float, local_cores: int) -> str | None:
    """The master a repair's session runs on (pure): `given` (None: spark-submit's), except that a plan of at most
    `local_max_mb` MB on a cluster master runs in the driver alone, `local[local_cores]`, with no executor pods to
    wait for. 0 MB keeps executors for every plan; a local master given stays as it is."""
    if is_local(given) or local_max_mb <= 0 or planned_bytes > local_max_mb * 1e6:
        return given
    return f"local[{max(1, local_cores)}]"


SPARK_VERSION = "4.3.0"
"""The Spark of the repair image (its pinned pyspark, constraints.txt; a test keeps the two equal). The operator
names it in SparkApplications without pyspark installed: its image has neither pyspark nor a JRE."""


def app_path(job: str, image: str | None) -> str:
    """The job's entry file: this checkout's module locally, `local://` in the image for cluster mode."""
    if image:
        return f"local://{IMAGE_APP_DIR}/{job}.py"
    return str(Path(__file__).parent / "replication" / f"{job}.py")


SUBMITTED_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
"""The JVM of a driver started by spark-submit (a repair Job's, the runner's) compiles with C1 only: it lives for one
run and passes little data (a task's plans in, its results out; Python workers copy the entries), so the optimising
compiler's CPU at start-up is never paid back. Measured: spark-submit, a local session and one job took 12.7-14.4 s
of CPU by default and 7.4-9.6 s with C1 only; on the local cluster the drivers start while everything else runs."""


def spark_submit_options(
    master: str,
    zk: str,
    ledgers: Iterable[int] = (),
    executors: int = 2,
    executor_memory: str = "1g",
    throttle_mb_s: float | None = None,
    image: str | None = None,
    job: str = "spark_repair",
    lock_wait_s: float | None = None,
    local_max_mb: float | None = None,
    local_cores: int | None = None,
) -> list[str]:
    """spark-submit's arguments for a repair (or audit) job: the operator's Job and the local runner both use them.
    Pure settings: the operator builds its Jobs from them where pyspark is not installed."""
    command = ["--master", master, "--name", f"bookfleet-{job.replace('_', '-')}"]
    conf = {
        "spark.ui.enabled": "false",
        "spark.executor.instances": str(executors),
        "spark.executor.memory": executor_memory,
        "spark.driver.extraJavaOptions": SUBMITTED_DRIVER_JAVA_OPTIONS,
    }
    if image:
        command += ["--deploy-mode", "cluster"]
        conf["spark.kubernetes.container.image"] = image
        conf["spark.kubernetes.pyspark.pythonVersion"] = "3"
    else:
        conf["spark.pyspark.python"] = sys.executable
        conf["spark.pyspark.driver.python"] = sys.executable
        conf["spark.driver.host"] = LOCAL_IP
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    command += [app_path(job, image), "--zk", zk]
    for ledger_id in ledgers:
        command += ["--ledger", str(ledger_id)]
    if throttle_mb_s:
        command += ["--throttle-mb-s", str(throttle_mb_s)]
    if lock_wait_s is not None:
        command += ["--lock-wait-s", str(lock_wait_s)]
    if local_max_mb is not None:
        command += ["--local-max-mb", str(local_max_mb), "--local-cores", str(local_cores or executors)]
    return command


def spark_submit_command(master: str, zk: str, ledgers: Iterable[int] = (), **options: Any) -> list[str]:
    """The full argv of a local run: the installed pyspark's spark-submit, then `spark_submit_options`."""
    return [spark_submit_binary(), *spark_submit_options(master, zk, ledgers, **options)]


def job_main(
    argv: list[str] | None,
    prog: str,
    description: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    check_arguments: Callable[[argparse.Namespace], str | None],
    run: Callable[[argparse.Namespace], object],
) -> int:
    """The spark-submit entry point of a job (repair, audit): flags, one summary printed, exit 1 on failures.
    The master comes from spark-submit unless --master is given. The driver ends with spark-submit's JVM, its parent:
    a run the standalone fleet started (`childprocess.popen`) ends whole when the fleet's parent dies."""
    childprocess.end_with_parent()
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser)
    parser.add_argument("--master", default=None, help="Spark master (default: the one spark-submit was given)")
    args = parser.parse_args(argv)
    if problem := check_arguments(args):
        parser.error(problem)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    summary = run(args)
    print(json.dumps(summary.to_dict()) if args.json else "\n".join(summary.lines()))
    return 1 if summary.failures else 0
