"""Kubernetes manifests built from the custom resources: plain functions, models in, dicts out, no API calls.

One module per concern: `images` (a cluster's images: its spec's, else the operator's version's), `names` (names,
labels, annotations, owner references, TLS mounts, quantities), `pods`
(Pod Security and the spec's pod overrides, shared by every pod), `workload` (the bookie workload: Bookies, Pods,
claims, Service, disruption budget, NetworkPolicies), `repairjob` (the Spark repair: Job or SparkApplication,
executor template, the driver's account). Callers name them as `resources.NAME`, whichever module defines it.
"""

from bookfleet.kube.resources.images import *  # noqa: F403
from bookfleet.kube.resources.names import *  # noqa: F403
from bookfleet.kube.resources.pods import *  # noqa: F403
from bookfleet.kube.resources.repairjob import *  # noqa: F403
from bookfleet.kube.resources.workload import *  # noqa: F403
