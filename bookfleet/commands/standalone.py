"""`bookfleet standalone`: ZooKeeper and N bookies on this machine, until Ctrl-C, SIGTERM or SIGHUP."""

from __future__ import annotations

import time
from pathlib import Path

from bookfleet.commanderror import CommandError
from bookfleet.polling import interrupt_on_stop_signals, until_interrupted


def register(subparsers) -> None:
    parser = subparsers.add_parser("standalone", help="run ZooKeeper and N bookies locally until Ctrl-C")
    parser.add_argument("--bookies", type=int, default=3, help="number of bookies (default 3)")
    parser.add_argument("--data-dir", type=Path, default=Path("data/standalone"), help="where everything is kept")
    parser.add_argument("--zk", help="use this ZooKeeper (HOST:PORT[/chroot]) instead of an embedded one")
    parser.add_argument("--zk-port", type=int, help="port of the embedded ZooKeeper (default: any free port)")
    parser.add_argument(
        "--no-auto-recovery", action="store_true", help="run no auditor and no repair runner next to the bookies"
    )
    parser.add_argument(
        "--repair-mode", choices=("in-process", "spark-submit"), default="in-process",
        help="run the Spark repair job in this process (default) or through spark-submit",
    )
    parser.add_argument("--spark-master", default="local[2]", help="Spark master of the repair job (default local[2])")
    parser.add_argument("--metrics-port", type=int, help="serve the repair counters for Prometheus on this port")
    parser.add_argument(
        "--secure", action="store_true",
        help="mutual TLS on the bookies and ZooKeeper ACLs; certificates and credential under <data-dir>/tls",
    )
    parser.set_defaults(handler=handle, log_level_default="INFO")


def handle(args) -> int:
    from bookfleet.fleet import BookieStartError, StandaloneCluster
    from bookfleet.meta.zk import ZooKeeperUnreachable
    from bookfleet.zkserver import ZooKeeperStartError

    if args.bookies < 1:
        raise CommandError(f"--bookies must be at least 1, not {args.bookies}")
    interrupt_on_stop_signals()
    cluster = StandaloneCluster(args.data_dir, args.bookies, args.zk, args.zk_port, secure=args.secure)
    try:
        cluster.start()
    except (BookieStartError, ZooKeeperStartError, ZooKeeperUnreachable) as exc:
        raise CommandError(str(exc)) from None
    recovery = None
    try:
        if not args.no_auto_recovery:
            from bookfleet.replication.runner import AutoRecoveryRunner

            recovery = AutoRecoveryRunner(
                cluster.zk, metrics_port=args.metrics_port, mode=args.repair_mode, master=args.spark_master
            ).start()
        print(f"ZooKeeper: {cluster.zk}")
        for bookie in cluster.fleet.bookies:
            print(f"bookie {bookie.bookie_id} at {bookie.address} (http {bookie.http_port}), logs {bookie.log_path}")
        if cluster.security is not None:
            print("secure: mutual TLS and ZooKeeper ACLs on; a client needs:")
            for line in cluster.security.exports():
                print(f"  {line}")
        if not args.no_auto_recovery:
            print("auditor and repair runner on: a lost bookie's ledgers are re-replicated", flush=True)
        print("running; Ctrl-C stops", flush=True)
        while all(bookie.running for bookie in cluster.fleet.bookies):
            time.sleep(0.5)
        dead = [bookie for bookie in cluster.fleet.bookies if not bookie.running]
        if not args.no_auto_recovery:  # losing a bookie is what auto-recovery is for: keep serving
            print(f"bookie {dead[0].bookie_id} exited; auto-recovery re-replicates its ledgers", flush=True)
            until_interrupted()
        raise CommandError(f"bookie {dead[0].bookie_id} exited:\n{dead[0].log_tail()}")
    except KeyboardInterrupt:
        print("stopping", flush=True)
        return 0
    finally:
        if recovery is not None:
            recovery.stop()
        cluster.stop()
