"""Spark's Python daemon for bookfleet's jobs (`spark.python.daemon.module`): pyspark.daemon with the task code
imported once, in the daemon, before it forks a worker per task slot.

Two start-up costs go away (each ~0.2-1.3 s of CPU per process on this machine kind): Spark puts its pyspark.zip
first on the workers' path, and zipimport compiles every pyspark module from source in each new daemon (no cached
bytecode in a zip); and pyspark's daemon imports the worker module, and each worker the job's code, after the fork,
so every worker paid for pyspark.worker, pydantic and the repair code again. Importing them here, where no thread
runs yet, lets every forked worker inherit them.
"""

from __future__ import annotations

import sys

from bookfleet.spark import installed_pyspark_first

sys.path[:] = installed_pyspark_first(sys.path)

import pyspark.worker  # noqa: E402, F401 - inherited by every forked worker
from pyspark.daemon import manager  # noqa: E402

import bookfleet.replication.spark_audit  # noqa: E402, F401 - the audit task's code, and the repair task's with it

if __name__ == "__main__":
    manager()
