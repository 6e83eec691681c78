"""`bookfleet delete-cluster NAME`: delete a BookieCluster, its Bookies and its Ledgers, and wait until they are gone,
never for ever (the Helm chart's pre-delete hook; see bookfleet.kube.reconcilers.teardown)."""

from __future__ import annotations

import argparse
import os

from bookfleet.commanderror import CommandError


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "delete-cluster",
        help="delete a BookieCluster, its Bookies and its Ledgers (kopf finalizers of older operators released)",
    )
    parser.add_argument("name", help="the BookieCluster")
    parser.add_argument("--namespace", default="default", help="its namespace (default: default)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for the cluster and its Bookies to go (default 120)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: the pod's service account)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.timeout < 0:
        raise CommandError(f"--timeout must not be negative, got {args.timeout}")
    if args.kubeconfig and not os.path.exists(args.kubeconfig):
        raise CommandError(f"--kubeconfig {args.kubeconfig} does not exist")
    from bookfleet.kube.reconcilers import teardown
    from bookfleet.kube.runtime import api

    api.load_config(args.kubeconfig)
    outcome = teardown.delete_cluster(api.KubeApi(), args.namespace, args.name, args.timeout)
    if outcome is teardown.Teardown.HELD:
        raise CommandError(f"BookieCluster {args.name} or a Bookie of it is still there after {args.timeout:g}s: "
                           "a finalizer that is not the operator's holds it (kubectl get -o yaml shows which)")
    print(f"BookieCluster {args.name} does not exist" if outcome is teardown.Teardown.ABSENT
          else f"BookieCluster {args.name}, its Bookies and its Ledgers deleted")
    return 0
