"""Where a ledger's replicas go: one rule for new ensembles, the writer's ensemble change, repair and the operator.

Zone-aware placement keeps every write quorum (Qw cyclically consecutive ensemble positions) in at least two zones
whenever the candidates allow it, so losing one zone never loses an entry.
"""

from __future__ import annotations

import enum
import random
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence

from bookfleet.client.writeset import write_set
from bookfleet.meta.registry import BookieInfo


class PlacementPolicy(enum.StrEnum):
    RANDOM = "random"
    ZONE_AWARE = "zone-aware"


class NotEnoughBookies(Exception):
    def __init__(self, needed: int, available: Iterable[str], what: str = "writable bookies"):
        names = sorted(available)
        super().__init__(f"need {needed} {what}, {len(names)} available: {', '.join(names) or 'none'}")
        self.needed = needed
        self.available = names


def choose_ensemble(
    candidates: Sequence[BookieInfo],
    ensemble_size: int,
    write_quorum: int,
    policy: PlacementPolicy | str = PlacementPolicy.ZONE_AWARE,
    exclude: Collection[str] = (),
    rng: random.Random | None = None,
    zones: Collection[str] = (),
) -> list[str]:
    """`ensemble_size` distinct bookie ids, ordered so that write quorums span zones (zone-aware); only bookies in
    `zones` when any are given (a Ledger's spec.zones)."""
    rng = rng or random.Random()
    pool = _unique((info for info in candidates if not zones or info.zone in zones), exclude)
    if len(pool) < ensemble_size:
        raise NotEnoughBookies(ensemble_size, pool, f"writable bookies in zones {', '.join(zones)}" if zones
                               else "writable bookies")
    if PlacementPolicy(policy) == PlacementPolicy.RANDOM:
        return rng.sample(sorted(pool), ensemble_size)
    by_zone: dict[str, list[str]] = defaultdict(list)
    for bookie_id, zone in sorted(pool.items()):
        by_zone[zone].append(bookie_id)
    for members in by_zone.values():
        rng.shuffle(members)
    zones = list(by_zone)
    rng.shuffle(zones)
    picked: list[tuple[str, str]] = []  # (zone, bookie): round-robin over zones balances the counts
    while len(picked) < ensemble_size:
        for zone in zones:
            if by_zone[zone] and len(picked) < ensemble_size:
                picked.append((zone, by_zone[zone].pop()))
    return _arrange(picked, write_quorum, rng)


def choose_replacement(
    candidates: Sequence[BookieInfo],
    ensemble: Sequence[str],
    index: int,
    write_quorum: int,
    policy: PlacementPolicy | str = PlacementPolicy.ZONE_AWARE,
    exclude: Collection[str] = (),
    rng: random.Random | None = None,
) -> str:
    """A bookie to take ensemble position `index`: not already in the ensemble nor excluded and, zone-aware,
    keeping each write quorum through `index` in two zones when any candidate can."""
    rng = rng or random.Random()
    pool = _unique(candidates, {*exclude, *ensemble})
    if not pool:
        raise NotEnoughBookies(1, pool, "writable bookie outside the ensemble")
    choices = sorted(pool)
    if PlacementPolicy(policy) == PlacementPolicy.ZONE_AWARE:
        zones = {info.bookie_id: info.zone for info in candidates}
        forbidden = _zones_that_would_collapse(ensemble, index, write_quorum, zones)
        choices = [b for b in choices if pool[b] not in forbidden] or choices
        counts = defaultdict(int)
        for position, bookie in enumerate(ensemble):
            if position != index and bookie in zones:
                counts[zones[bookie]] += 1
        fewest = min(counts[pool[b]] for b in choices)
        choices = [b for b in choices if counts[pool[b]] == fewest]
    return rng.choice(choices)


def quorum_zone_violations(ensemble_zones: Sequence[str], write_quorum: int) -> int:
    """How many write quorums of an ensemble lie in a single zone (0 is the goal when zones allow it)."""
    size = len(ensemble_zones)
    if write_quorum < 2 or len(set(ensemble_zones)) < 2:
        return 0
    return sum(len({ensemble_zones[i] for i in write_set(start, size, write_quorum)}) < 2 for start in range(size))


def write_sets_sharing_a_zone(ensemble_zones: Sequence[str], write_quorum: int) -> int:
    """How many write sets hold two replicas in one zone (one zone outage takes two of their copies): allowed after
    repairs on the zones a lost zone left, and said in the Ledger's status. Unknown zones ("") count as distinct."""
    size = len(ensemble_zones)

    def shares(start: int) -> bool:
        known = [ensemble_zones[i] for i in write_set(start, size, write_quorum) if ensemble_zones[i]]
        return len(set(known)) < len(known)

    return sum(map(shares, range(size)))


def _unique(candidates: Iterable[BookieInfo], exclude: Collection[str]) -> dict[str, str]:
    """bookie id -> zone, without the excluded ids."""
    return {info.bookie_id: info.zone for info in candidates if info.bookie_id not in exclude}


def _arrange(picked: list[tuple[str, str]], write_quorum: int, rng: random.Random, tries: int = 200) -> list[str]:
    """The spread order, or when a zone holds more than half the ensemble, the best of a few shuffles."""
    best = _spread(picked)
    zone_of = dict((bookie, zone) for zone, bookie in picked)
    fewest = quorum_zone_violations([zone_of[b] for b in best], write_quorum)
    for _ in range(tries if fewest else 0):
        candidate = [bookie for _, bookie in rng.sample(picked, len(picked))]
        violations = quorum_zone_violations([zone_of[b] for b in candidate], write_quorum)
        if violations < fewest:
            best, fewest = candidate, violations
    return best


def _spread(picked: list[tuple[str, str]]) -> list[str]:
    """Order picked bookies so that neighbours differ in zone: grouped by zone (largest first), then laid on even
    positions and after that on odd ones; that separates any zone holding at most half the ensemble."""
    counts: dict[str, int] = defaultdict(int)
    for zone, _ in picked:
        counts[zone] += 1
    grouped = sorted(picked, key=lambda item: (-counts[item[0]], item[0]))
    size = len(grouped)
    order = [*range(0, size, 2), *range(1, size, 2)]
    ensemble: list[tuple[str, str]] = [("", "")] * size
    for item, position in zip(grouped, order, strict=True):
        ensemble[position] = item
    return [bookie for _, bookie in ensemble]


def _zones_that_would_collapse(
    ensemble: Sequence[str], index: int, write_quorum: int, zones: dict[str, str]
) -> set[str]:
    """Zones a replacement at `index` must avoid: those that would leave some quorum through `index` in one zone."""
    size = len(ensemble)
    forbidden = set()
    for offset in range(write_quorum):
        start = (index - offset) % size
        others = {zones.get(ensemble[p]) for p in write_set(start, size, write_quorum) if p != index}
        if write_quorum >= 2 and len(others) == 1 and None not in others:
            forbidden |= others
    return forbidden
