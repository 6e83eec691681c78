"""`bookfleet operator`: the Kubernetes operator (kopf) for BookieClusters, Bookies and Ledgers.

The module is not called `operator`: that would shadow the standard library's module of that name.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import random

from bookfleet.commanderror import CommandError


def register(subparsers) -> None:
    parser = subparsers.add_parser("operator", help="run the Kubernetes operator")
    parser.add_argument("--namespace", action="append", dest="namespaces", metavar="NS",
                        help="watch only this namespace, by name (repeatable; default: the whole cluster)")
    parser.add_argument("--zk", help="ZooKeeper connect string to use instead of each cluster's own")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument("--standalone", action="store_true", help="no peering with other operator instances")
    peering.add_argument("--peering", metavar="NAME",
                         help="KopfPeering object shared by the replicas: only the highest priority one acts")
    parser.add_argument("--priority", type=int,
                        help="this replica's peering priority (default: random, so two replicas never tie; kopf "
                             "pauses every replica of a tied top priority)")
    parser.add_argument("--peering-lifetime", type=int, default=60, metavar="SECONDS",
                        help="how long a replica's last peering heartbeat keeps it the leader: a leader killed -9 is "
                             "taken over this long after its last heartbeat (default 60, kopf's own)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: the pod's service account)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between reconciliations (default 10)")
    parser.add_argument("--api-qps", type=float, default=50.0,
                        help="API requests a second the operator makes at most, sustained (default 50; a 429 answer "
                             "is waited out and retried either way)")
    parser.add_argument("--api-burst", type=int, default=100,
                        help="API requests the operator may make at once above --api-qps (default 100)")
    parser.add_argument("--liveness", metavar="URL", help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve the operator's Prometheus metrics on this port at /metrics (default: not served; "
                             "the chart uses 9090)")
    parser.add_argument("--bookie-image", metavar="REPOSITORY", default="bookfleet/bookie",
                        help="repository of the bookie image of clusters that name none: <REPOSITORY>:<this "
                             "operator's version> (default bookfleet/bookie)")
    parser.add_argument("--repair-image", metavar="REPOSITORY", default="bookfleet/repair",
                        help="repository of the repair image of clusters that name none: <REPOSITORY>:<this "
                             "operator's version> (default bookfleet/repair)")
    parser.add_argument("--apply-crds", action="store_true",
                        help="server-side apply this operator's CRDs at start (field manager bookfleet; needs "
                             "patch on them, and create for one not installed yet), unless a newer operator applied "
                             "them")
    parser.set_defaults(handler=run, log_level_default="INFO")


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise CommandError(f"--interval must be positive, got {args.interval}")
    if args.kubeconfig and not os.path.exists(args.kubeconfig):
        raise CommandError(f"--kubeconfig {args.kubeconfig} does not exist")
    if args.priority is not None and not args.peering:
        raise CommandError("--priority needs --peering NAME")
    if args.peering_lifetime < 1:
        raise CommandError(f"--peering-lifetime must be at least 1 second, got {args.peering_lifetime}")
    if args.api_qps <= 0 or args.api_burst < 1:
        raise CommandError(f"--api-qps must be positive and --api-burst at least 1, got {args.api_qps:g} and "
                           f"{args.api_burst}")
    if args.metrics_port is not None and not 0 < args.metrics_port < 65536:
        raise CommandError(f"--metrics-port must be between 1 and 65535, got {args.metrics_port}")
    os.environ["BOOKFLEET_OPERATOR_INTERVAL"] = str(args.interval)
    os.environ["BOOKFLEET_KUBECONFIG"] = args.kubeconfig or ""
    os.environ["BOOKFLEET_OPERATOR_ZK"] = args.zk or ""
    os.environ["BOOKFLEET_OPERATOR_API_QPS"] = str(args.api_qps)
    os.environ["BOOKFLEET_OPERATOR_API_BURST"] = str(args.api_burst)
    os.environ["BOOKFLEET_OPERATOR_NAMESPACES"] = ",".join(args.namespaces or ())
    os.environ["BOOKFLEET_OPERATOR_BOOKIE_IMAGE"] = args.bookie_image
    os.environ["BOOKFLEET_OPERATOR_REPAIR_IMAGE"] = args.repair_image
    os.environ["BOOKFLEET_OPERATOR_APPLY_CRDS"] = "1" if args.apply_crds else ""
    import kopf

    from bookfleet.kube.runtime import metrics  # the operator extra's packages: imported only when the operator runs

    importlib.import_module("bookfleet.kube.handlers")  # registers the handlers with the settings above
    if args.metrics_port is not None:
        metrics.serve(args.metrics_port)
    peering = {}
    if args.peering:
        priority = args.priority if args.priority is not None else random.SystemRandom().randrange(1, 2**31)
        peering = {"peering_name": args.peering, "priority": priority}
    settings = kopf.OperatorSettings()
    # Named namespaces need no scan of all namespaces (which would need cluster-wide `list namespaces`); the CRDs
    # are installed before the operator starts, so kopf's watch for new ones is not needed either.
    settings.scanning.disabled = bool(args.namespaces)
    settings.peering.lifetime = args.peering_lifetime
    asyncio.run(kopf.operator(
        standalone=args.standalone, clusterwide=not args.namespaces, namespaces=args.namespaces or (),
        liveness_endpoint=args.liveness, settings=settings, **peering,
    ))
    return 0
