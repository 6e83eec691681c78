"""The images: each job's image holds what that job needs and nothing more, runs as uid 10001 under tini, answers
`bookfleet --version`; the operator writes repair Jobs without pyspark (it has none) and, from its own image,
launches one on a real kube-apiserver; the pins do not drift."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from kazoo.client import KazooClient
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from bookfleet import spark
from bookfleet.kube import resources
from bookfleet.kube.models import BookieCluster
from bookfleet.kube.runtime.api import BATCH, CORE, CUSTOM
from bookfleet.meta.metadata import MetadataStore, new_metadata
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.polling import wait_for
from bookfleet.zkserver import free_port
from tests.cluster.controlplane import ControlPlane
from tests.fixtures.apiserver import install_crds
from tests.fixtures.images import BUILD_TIMEOUT_S, BuiltImage

# One worker builds (or finds) the images; the first test using them waits for a cold build.
pytestmark = [pytest.mark.xdist_group("images"), pytest.mark.timeout(BUILD_TIMEOUT_S)]
ROOT = Path(__file__).resolve().parents[2]
SIZE_LIMIT_MB = {"bookie": 250, "operator": 250}
"""Uncompressed (bookie ~228 MB, operator ~219 MB)."""

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

import bookfleet.kube.handlers  # the operator's whole import graph: kopf, kubernetes
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
    defaults = BookieCluster.model_validate({"metadata": {"name": "demo"}, "spec": {"zookeeper": "zk:2181"}})
    repair_image = resources.repair_image(defaults)  # the operator's own version's
    driver, application = specs["driver"], specs["application"]
    assert driver["image"] == application["image"] == repair_image
    assert driver["command"][0] == "spark-submit"
    assert f"spark.kubernetes.container.image={repair_image}" in driver["command"]
    command = driver["command"]
    assert command[command.index("--ledger") + 1] == "7"
    assert float(command[command.index("--lock-wait-s") + 1]) > 0  # a driver waits for another repair's locks
    assert application["sparkVersion"] == spark.SPARK_VERSION
    assert specs["pyspark"] is False


def test_the_operator_builds_repair_jobs_where_pyspark_is_not_installed() -> None:
    """The operator image has no pyspark: writing a repair Job must not need it (it raised AttributeError there)."""
    result = subprocess.run(
        [sys.executable, "-c", HIDE_PYSPARK + REPAIR_SPECS], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    check_repair_specs(result.stdout)


def pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    requirements = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return {canonicalize_name(r.name): str(r.specifier).removeprefix("==") for r in requirements}


def test_the_pins_are_the_dev_venv() -> None:
    """constraints.txt pins the dev venv and every image (make setup installs with it); `make lock` rewrites it."""
    installed = {
        canonicalize_name(d.metadata["Name"]): d.version
        for d in importlib.metadata.distributions()
        if canonicalize_name(d.metadata["Name"]) not in {"pip", "setuptools", "wheel", "bookfleet"}
    }
    assert installed == pins(), "run `make lock` (or `make setup` after editing constraints.txt)"
    assert pins()["pyspark"] == spark.SPARK_VERSION, "the operator names the repair image's Spark in SparkApplications"


def test_each_image_answers_its_version_as_uid_10001_under_tini(built_images) -> None:
    version = importlib.metadata.version("bookfleet")
    for image in built_images.values():
        config = image.config()
        assert config["User"] == "10001" and config["Entrypoint"][:2] == ["/usr/bin/tini", "--"], config
        result = image.run(*config["Entrypoint"], "bookfleet", "--version")  # the repair one runs Spark's roles too
        assert result.returncode == 0 and result.stdout.split() == ["bookfleet", version], result.stderr
        assert image.run("id", "-u").stdout.strip() == "10001"


def test_each_image_holds_the_compiled_add_loops_and_no_compiler(built_images) -> None:
    """The package's C extensions (the bookie's and the client's add loops, bkwire's only implementation of them, and
    the entry log's append loop) are built in each image's build stage: the image imports them, and carries no
    compiler."""
    probe = (
        "import shutil; from bookfleet import _bookieadds, _clientadds, _entrylog, bkwire; "
        "print(bool(shutil.which('gcc')))"
    )
    for name, image in built_images.items():
        result = image.run("python3", "-c", probe)
        assert result.returncode == 0 and result.stdout.split() == ["False"], (name, result.stderr)


def test_only_the_repair_image_carries_a_jre_and_pyspark(built_images) -> None:
    probe = "import importlib.util as u, shutil; print(u.find_spec('pyspark') is not None, bool(shutil.which('java')))"
    results = {name: image.run("python3", "-c", probe) for name, image in built_images.items()}
    found = {name: result.stdout.split() for name, result in results.items()}
    expected = {"bookie": ["False", "False"], "operator": ["False", "False"], "repair": ["True", "True"]}
    assert found == expected, {name: (result.returncode, result.stderr) for name, result in results.items()}
    # buildah's container has no /etc/hosts line for its hostname (a pod has): Spark takes the address given instead.
    submit = built_images["repair"].run("env", "SPARK_LOCAL_IP=127.0.0.1", "spark-submit", "--version")
    assert submit.returncode == 0 and f"version {spark.SPARK_VERSION}" in submit.stderr, submit.stderr[-2000:]


def test_the_operator_image_builds_a_repair_job(built_images) -> None:
    result = built_images["operator"].run("python3", "-c", REPAIR_SPECS)
    assert result.returncode == 0, result.stderr
    check_repair_specs(result.stdout)


STARTS_FROM_BYTECODE = """
import importlib.util, json, os, struct, sys

import bookfleet.cli, bookfleet.kube.handlers, kopf  # what `bookfleet operator` imports when it starts


def compiled(source):
    '''Its bytecode is there and matches it (a timestamp pyc: flags 0, the source's mtime and size).'''
    try:
        with open(importlib.util.cache_from_source(source), "rb") as pyc:
            flags, mtime, size = struct.unpack("<4xIII", pyc.read(16))
    except OSError:
        return False
    stat = os.stat(source)
    return (flags, mtime, size) == (0, int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF)


sources = [m.__file__ for m in list(sys.modules.values()) if (getattr(m, "__file__", None) or "").endswith(".py")]
print(json.dumps({
    "venv": sum(source.startswith(sys.prefix) for source in sources),
    "compiled at each start": [source for source in sources if not compiled(source)],
    "build tools": [name for name in ("pip", "setuptools", "wheel") if importlib.util.find_spec(name)],
}))
"""


def test_the_operator_image_starts_from_bytecode_without_build_tools(built_images) -> None:
    """Its root filesystem is read-only, so the bytecode of the operator's imports must be in the image (else every
    start compiles them again: ~1 s of CPU); pip and setuptools stay in the build stage."""
    result = built_images["operator"].run("python3", "-c", STARTS_FROM_BYTECODE)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["venv"] > 300, found  # kopf, aiohttp, pydantic, kazoo, the kubernetes client's core, bookfleet
    assert found["compiled at each start"] == [] and found["build tools"] == [], found


def kubeconfig_for_a_container(api_server: ControlPlane, folder: Path, inside: str) -> Path:
    """The admin kubeconfig and its certificates in `folder`, readable by the image's uid 10001 where `folder` is
    mounted at `inside`."""
    folder.mkdir(mode=0o755)
    for name in ("ca.crt", "admin.crt", "admin.key"):
        (folder / name).write_bytes((api_server.pki.root / name).read_bytes())
        (folder / name).chmod(0o644)
    config = yaml.safe_load(api_server.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["certificate-authority"] = f"{inside}/ca.crt"
    config["users"][0]["user"] = {"client-certificate": f"{inside}/admin.crt", "client-key": f"{inside}/admin.key"}
    (folder / "kubeconfig").write_text(yaml.safe_dump(config))
    (folder / "kubeconfig").chmod(0o644)
    return folder


def test_the_operator_image_launches_a_repair_job_on_a_real_api_server(
    built_images: dict[str, BuiltImage], api_server: ControlPlane, zk_connect: str, zk: KazooClient, tmp_path: Path
) -> None:
    """The operator, run from its own image, sees a bookie lost (its pod and volumes gone), marks its ledger and
    launches the repair Job on a real kube-apiserver. In the image before spark-submit's options became pure
    settings, building the Job raised AttributeError (no pyspark there): the ledger was marked and no Job came."""
    admin, namespace = install_crds(api_server), "default"
    mounted = kubeconfig_for_a_container(api_server, tmp_path / "kube", "/run/kube")
    cluster = {
        "apiVersion": CUSTOM, "kind": "BookieCluster", "metadata": {"name": "bk", "namespace": namespace},
        "spec": {"replicas": 3, "zookeeper": zk_connect, "security": {"tls": "Disabled"},
                 "autoRecovery": {"lostBookieRecoveryDelaySeconds": 0}},
    }
    admin.create(cluster)
    operator = built_images["operator"]
    argv = ["bookfleet", "operator", "--standalone", "--namespace", namespace, "--kubeconfig", "/run/kube/kubeconfig",
            "--interval", "0.5"]
    log = tmp_path / "operator.log"
    with operator.start(*operator.config()["Entrypoint"], *argv, mounts={mounted: "/run/kube"}, output=log) as process:
        def bookie_with_pod() -> dict | None:
            assert process.poll() is None, log.read_text()[-4000:]
            bookie = admin.get(CUSTOM, "bookies", namespace, "bk-0")
            return bookie if (bookie or {}).get("status", {}).get("pod") else None

        lost_id = wait_for(bookie_with_pod, 300, "the operator in its image to record bk-0's pod")["spec"]["bookieId"]
        ledger_id = MetadataStore(zk).create(new_metadata([lost_id, "elsewhere:3181"], 2, 2))
        admin.delete(CORE, "pods", namespace, "bk-0", grace_period_seconds=0)
        for volume in ("journal", "ledgers"):
            admin.delete(CORE, "persistentvolumeclaims", namespace, f"bk-0-{volume}")

        def repair_job() -> dict | None:
            assert process.poll() is None, log.read_text()[-4000:]
            jobs = admin.list(BATCH, "jobs", namespace, resources.labels("bk", resources.REPAIR, "bk-0"))
            return jobs[0] if jobs else None

        job = wait_for(repair_job, 180, f"the repair Job of bk-0 (operator log: {log})")
    assert UnderReplication(zk).marker(ledger_id).missing_bookies == {lost_id}
    (driver,) = job["spec"]["template"]["spec"]["containers"]
    repair_image = resources.repair_image(BookieCluster.model_validate(cluster))
    assert driver["image"] == repair_image and driver["command"][0] == "spark-submit", driver


def test_image_sizes(built_images) -> None:
    sizes = {name: image.size_mb() for name, image in built_images.items()}
    print("image sizes (MB, uncompressed): " + json.dumps({name: round(mb) for name, mb in sizes.items()}))
    for name, limit in SIZE_LIMIT_MB.items():
        assert sizes[name] <= limit, f"{name} image is {sizes[name]:.0f} MB (target {limit} MB)"


def tini_of(port: int) -> int:
    """The pid of the container's tini running the bookie on `port` (its PID 1 in a pod)."""
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if argv[0] == b"/usr/bin/tini" and str(port).encode() in argv:
                return int(proc.name)
    return 0


def test_a_bookie_in_its_image_stops_cleanly_on_sigterm(built_images, zk_connect) -> None:
    """tini hands SIGTERM to the bookie, which unregisters, flushes and checkpoints, and exits 0 at once: a pod's
    stop does not wait out its grace period (as Python as PID 1 without a handler would)."""
    bookie = built_images["bookie"]
    port, http_port = free_port(), free_port()
    argv = ["--port", str(port), "--http-port", str(http_port), "--zk", zk_connect, "--id", "image-bookie"]
    storage = ["--journal-dir", "/data/journal", "--ledger-dir", "/data/ledgers", "--no-verify-ledgers"]
    with bookie.start(*bookie.config()["Entrypoint"], "bookfleet", "bookie", *argv, *storage) as process:
        ready = f"http://127.0.0.1:{http_port}/readyz"
        wait_for(lambda: process.poll() is not None or answers(ready), 300, "the bookie in its image to be ready")
        assert process.poll() is None, process.communicate()[0]
        stopping = time.monotonic()
        os.kill(wait_for(lambda: tini_of(port), 60, "the bookie's tini"), signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
        stopped_s = time.monotonic() - stopping
    print(f"bookie image: stopped {stopped_s:.1f} s after SIGTERM")
    assert process.returncode == 0, output
    assert "shutting down" in output


def answers(url: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as response:
        return response.status == 200
    return False
