"""bench repair's accounting: CPU per process role across the whole process tree, from /proc."""

from __future__ import annotations

import os
import subprocess
import sys

from bookfleet.bench.repair import ProcessCpu, cpu_by_role, process_tree_cpu


def test_cpu_is_split_by_role_and_a_role_covers_its_descendants():
    me = os.getpid()
    before = {me: ProcessCpu(1, "python", 1.0), 10: ProcessCpu(me, "java", 2.0), 20: ProcessCpu(me, "python", 0.5)}
    after = {
        me: ProcessCpu(1, "python", 1.5),
        10: ProcessCpu(me, "java", 3.0),  # the Spark JVM
        11: ProcessCpu(10, "python", 0.25),  # its Python daemon, started meanwhile
        20: ProcessCpu(me, "python", 0.75),  # a bookie
        21: ProcessCpu(20, "python", 0.5),  # a child of the bookie
        30: ProcessCpu(me, "java", 4.0),  # ZooKeeper, started meanwhile
    }
    assert cpu_by_role(before, after, {20: "bookies", 30: "zookeeper"}) == {
        "driver": 0.5, "spark_jvm": 1.0, "spark_python": 0.25, "bookies": 0.75, "zookeeper": 4.0,
    }


def test_a_child_process_cpu_is_seen_in_the_tree():
    code = "sum(range(20_000_000)); print('done', flush=True); input()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"done\n"
        process = process_tree_cpu()[child.pid]
        assert process.parent == os.getpid() and process.seconds >= 0.05
    finally:
        child.communicate(b"\n")
