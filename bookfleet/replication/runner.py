"""Auto-recovery for the standalone fleet: an auditor candidate plus a runner that launches the Spark repair job.

The runner polls the marker tree (kazoo has no recursive watch, and listing four hex levels is cheap), and while
markers exist and replication is enabled it runs the repair job, one run at a time: in this process on a local
SparkSession (the JVM start and its first job are paid once, when the runner starts), or as a spark-submit
child. A run that repairs nothing (a young OPEN ledger in its grace period, a lock held elsewhere, a failing bookie)
backs off instead of spinning.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
from collections.abc import Callable

from kazoo.client import KazooClient

from bookfleet import childprocess
from bookfleet import spark as sparksettings
from bookfleet.meta import zk as zkclient
from bookfleet.meta.underreplication import UnderReplication
from bookfleet.replication.auditor import WEEK, Auditor
from bookfleet.replication.metricsserver import MetricsServer
from bookfleet.replication.spark_repair import DEFAULT_OPEN_GRACE_S, ProgressCallback, RepairSummary, run_repair

log = logging.getLogger(__name__)

IN_PROCESS = "in-process"
SPARK_SUBMIT = "spark-submit"
MODES = (IN_PROCESS, SPARK_SUBMIT)
MAX_BACKOFF = 30.0


class RepairRunner:
    """Runs the repair job whenever markers exist; `summaries` keeps every run's result."""

    def __init__(
        self,
        zk: KazooClient,
        zk_connect: str,
        mode: str = IN_PROCESS,
        master: str = sparksettings.DEFAULT_MASTER,
        throttle_mb_s: float | None = None,
        open_grace_s: float = DEFAULT_OPEN_GRACE_S,
        poll_interval: float = 1.0,
        on_summary: Callable[[RepairSummary], None] | None = None,
        progress: ProgressCallback | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"repair mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.under_replication = UnderReplication(zk)
        self.zk_connect = zk_connect
        self.mode = mode
        self.master = master
        self.throttle_mb_s = throttle_mb_s
        self.open_grace_s = open_grace_s
        self.poll_interval = poll_interval
        self.on_summary = on_summary
        self.progress = progress
        self.summaries: list[RepairSummary] = []
        self.checks = 0
        """How many times the runner looked at the switch and the markers (a liveness figure)."""
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> RepairRunner:
        self._thread = threading.Thread(target=self._loop, name="repair-runner", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Stop after the current run (a run is never cut short: it commits ledger by ledger anyway)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        if self.mode == IN_PROCESS:
            self._warm_up()
        backoff = self.poll_interval
        while not self._stopping.is_set():
            try:
                self.checks += 1
                if self.under_replication.is_disabled() or not self.under_replication.ledger_ids():
                    self._stopping.wait(self.poll_interval)
                    continue
                summary = self.run_once()
            except Exception:
                log.exception("repair runner: run failed; retrying in %.0fs", backoff)
                summary = None
            if summary is not None:
                self.summaries.append(summary)
                for line in summary.lines():
                    log.info("repair: %s", line)
                if self.on_summary:
                    self.on_summary(summary)
            progressed = summary is not None and summary.ledgers > 0
            backoff = self.poll_interval if progressed else min(MAX_BACKOFF, backoff * 2)
            self._stopping.wait(0 if progressed else backoff)

    def _warm_up(self) -> None:
        """Start the session and run its first job now, not when a bookie is lost (BookKeeper's replication workers
        are warm too). A failure here is only logged: the first run then starts the session and reports its error."""
        try:
            sparksettings.warm_up(sparksettings.session(self.master, app_name="bookfleet-repair"))
        except Exception:
            log.exception("repair runner: warming up the Spark session failed")

    def run_once(self) -> RepairSummary:
        if self.mode == IN_PROCESS:
            return run_repair(
                self.zk_connect, master=self.master, throttle_mb_s=self.throttle_mb_s,
                open_grace_s=self.open_grace_s, progress=self.progress,
            )
        submit = sparksettings.spark_submit_command(self.master, self.zk_connect, throttle_mb_s=self.throttle_mb_s)
        command = [*submit, "--json", "--open-grace-s", str(self.open_grace_s)]
        submitted = childprocess.popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout, stderr = submitted.communicate()
        lines = [line for line in stdout.splitlines() if line.startswith("{")]  # Spark may print too
        if not lines:
            raise RuntimeError(f"spark-submit exited with {submitted.returncode} and no summary: {stderr[-2000:]}")
        return RepairSummary.from_dict(json.loads(lines[-1]))


class AutoRecoveryRunner:
    """What `bookfleet standalone` adds to its bookies: an auditor candidate and a repair runner, one session.

    With `metrics_port`, the repair counters (entries, bytes, ledgers, DATA_LOSS entries) of in-process runs are
    served for Prometheus at http://127.0.0.1:<port>/metrics.
    """

    def __init__(
        self, zk_connect: str, check_interval: float = WEEK, metrics_port: int | None = None, **runner_options
    ):
        self.zk_connect = zk_connect
        self.check_interval = check_interval
        self.metrics_port = metrics_port
        self.runner_options = runner_options
        self.zk: KazooClient | None = None
        self.auditor: Auditor | None = None
        self.runner: RepairRunner | None = None
        self.metrics_server: MetricsServer | None = None

    def start(self) -> AutoRecoveryRunner:
        if self.metrics_port is not None:
            self.metrics_server = MetricsServer(self.metrics_port, "127.0.0.1")
        self.zk = zkclient.connect(self.zk_connect)
        self.auditor = Auditor(self.zk, check_interval=self.check_interval).start()
        self.runner = RepairRunner(self.zk, self.zk_connect, **self.runner_options).start()
        return self

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()
        if self.auditor is not None:
            self.auditor.stop()
        if self.zk is not None:
            self.zk.stop()
            self.zk.close()
        if self.metrics_server is not None:
            self.metrics_server.close()

    def __enter__(self) -> AutoRecoveryRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
