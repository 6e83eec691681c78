"""`bookfleet delete-cluster NAME`: delete a BookieCluster and wait until it and its Bookies are gone, never for
ever (the Helm chart's pre-delete hook; see bookfleet.kube.teardown)."""

from __future__ import annotations

import argparse
import os

from bookfleet.commanderror import CommandError


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "delete-cluster",
        help="delete a BookieCluster and its Ledgers; if no operator releases them in time, release them here",
    )
    parser.add_argument("name", help="the BookieCluster")
    parser.add_argument("--namespace", default="default", help="its namespace (default: default)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for the operator before removing its finalizers (default 120)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: the pod's service account)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.timeout < 0:
        raise CommandError(f"--timeout must not be negative, got {args.timeout}")
    if args.kubeconfig and not os.path.exists(args.kubeconfig):
        raise CommandError(f"--kubeconfig {args.kubeconfig} does not exist")
    from bookfleet.kube import api, teardown

    api.load_config(args.kubeconfig)
    outcome = teardown.delete_cluster(api.KubeApi(), args.namespace, args.name, args.timeout)
    print({
        teardown.Teardown.ABSENT: f"BookieCluster {args.name} does not exist",
        teardown.Teardown.DELETED: f"BookieCluster {args.name}, its Bookies and its Ledgers deleted by the operator",
        teardown.Teardown.FORCED: f"no operator released BookieCluster {args.name} within {args.timeout:g}s: its "
                                 "finalizers were removed and it was deleted here",
    }[outcome])
    return 0
