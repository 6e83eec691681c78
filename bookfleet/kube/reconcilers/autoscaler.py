"""The disk autoscaler of a BookieCluster (spec.autoscaling), pure: the replicas its bookies' disk usage calls for.

One bookie more when a bookie's ledger volume is used past scaleUpDiskUsage (before it turns read-only at the bookie's
own threshold); one fewer when every bookie is under scaleDownDiskUsage and the others would hold the data under
scaleUpDiskUsage (so a removal never calls for an addition). A change is one bookie, decided only once the last one
has settled (every wanted bookie up, no drain under way) and its cooldown has passed: never two at once. Removing
one lowers spec.replicas and nothing else: the highest ordinal is then drained as any scale-down is (clusters.py),
its ledgers repaired elsewhere before its pod goes. minReplicas and maxReplicas are the spec's word: replicas outside
them are brought back at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from bookfleet.kube.models import Autoscaling

ANNOTATION_SCALED_AT = "bookfleet.io/autoscaled-at"
"""On the BookieCluster: when the autoscaler last changed its replicas (written with them, in one patch)."""
SCALED_UP, SCALED_DOWN = "ScaledUp", "ScaledDown"


@dataclass(frozen=True)
class Scale:
    replicas: int
    reason: str
    message: str


def decide_scale(policy: Autoscaling, replicas: int, usage: Mapping[str, float], settled: bool,
                 scaled_at: dt.datetime | None, moment: dt.datetime) -> Scale | None:
    """The replicas to set, or None. `usage`: each serving bookie's used fraction of its ledger volume, by name;
    `settled`: the last change is done (every wanted bookie up and registered, none being drained)."""
    if replicas < policy.min_replicas:
        return Scale(policy.min_replicas, SCALED_UP, f"replicas {replicas} is below autoscaling.minReplicas")
    if replicas > policy.max_replicas:
        return Scale(policy.max_replicas, SCALED_DOWN, f"replicas {replicas} is above autoscaling.maxReplicas")
    if not settled:
        return None
    if scaled_at is not None and (moment - scaled_at).total_seconds() < policy.cooldown_seconds:
        return None
    fullest = max(usage, key=lambda name: (usage[name], name))
    if usage[fullest] >= policy.scale_up_disk_usage and replicas < policy.max_replicas:
        return Scale(replicas + 1, SCALED_UP, f"{fullest} has used {usage[fullest]:.0%} of its ledger volume "
                     f"(scaleUpDiskUsage {policy.scale_up_disk_usage:.0%}): one bookie more")
    spread = sum(usage.values()) / (len(usage) - 1) if len(usage) > 1 else 1.0
    if replicas > policy.min_replicas and usage[fullest] < policy.scale_down_disk_usage \
            and spread < policy.scale_up_disk_usage:
        return Scale(replicas - 1, SCALED_DOWN, f"every bookie has used less than {policy.scale_down_disk_usage:.0%} "
                     f"of its ledger volume; the others would use {spread:.0%}: one bookie fewer, drained first")
    return None
