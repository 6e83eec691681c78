"""The images a cluster runs: its spec's when set, else the operator's own version's.

The CRDs once defaulted `image` to a fixed tag, which every object then stored: an upgraded operator went on
starting bookies and repairs from the images of the release the object was created under. An empty field now means
"the image of the operator's version" (`<repository>:<bookfleet version>`), resolved when a pod is built and never
written into an object; the repositories come from `bookfleet operator --bookie-image/--repair-image` (the chart
passes its image.*.repository values).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from bookfleet import __version__
from bookfleet.kube.models import BookieCluster

BOOKIE_REPOSITORY_ENV = "BOOKFLEET_OPERATOR_BOOKIE_IMAGE"
REPAIR_REPOSITORY_ENV = "BOOKFLEET_OPERATOR_REPAIR_IMAGE"


@dataclass(frozen=True)
class OwnImages:
    """The bookie and repair images of one operator version."""

    bookie_repository: str = "bookfleet/bookie"
    repair_repository: str = "bookfleet/repair"
    version: str = __version__

    @classmethod
    def from_environment(cls) -> OwnImages:
        return cls(os.environ.get(BOOKIE_REPOSITORY_ENV) or cls.bookie_repository,
                   os.environ.get(REPAIR_REPOSITORY_ENV) or cls.repair_repository)

    @property
    def bookie(self) -> str:
        return f"{self.bookie_repository}:{self.version}"

    @property
    def repair(self) -> str:
        return f"{self.repair_repository}:{self.version}"


OWN_IMAGES = OwnImages.from_environment()
"""This process's: read once, as the operator's other settings are (`bookfleet operator` sets the variables)."""


def bookie_image(cluster: BookieCluster) -> str:
    return cluster.spec.image or OWN_IMAGES.bookie


def repair_image(cluster: BookieCluster) -> str:
    return cluster.spec.auto_recovery.repair.image or OWN_IMAGES.repair
