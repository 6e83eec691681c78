"""The shape every reconciler shares: decide() returns a `Decision` of plain values, `act` applies it in one place.

Each reconciler observes (Kubernetes and ZooKeeper into one frozen dataclass per kind), decides in pure code
(observed state and the time → a `Decision`: the actions in the order they must happen, and when to look again) and
acts here. Actions are values, so a decide() test compares them in milliseconds with no API server and no ZooKeeper.
An action that needs ZooKeeper or another resource is a small dataclass with the same `apply` shape, defined beside
the reconciler that decides it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from kubernetes.client.exceptions import ApiException

from bookfleet.kube.resources.names import LABEL_MANAGED_BY
from bookfleet.kube.runtime.api import FIELD_MANAGER
from bookfleet.kube.runtime.context import OperatorContext, patch_status

Sources = TypeVar("Sources")
Result = TypeVar("Result")


class Action(Protocol):
    """One change to the world; `body` is the object being reconciled (kept current by status patches)."""

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Ensure:
    """Create the object unless it exists (never overwrites: changes to existing objects are explicit patches)."""

    manifest: dict[str, Any]

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        ctx.api.ensure(self.manifest)


@dataclass(frozen=True)
class Apply:
    """Server-side apply of an object the operator owns whole (its Services, budgets, policies, repair account):
    created, brought up to date after an upgrade or a spec change, and drift undone, on every pass."""

    manifest: dict[str, Any]

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        ctx.api.apply(self.manifest)


@dataclass(frozen=True)
class ApplyShared:
    """Server-side apply of an object several owners share (a namespace's repair account, which each cluster naming
    it applies), then `claim` (resources.owner_claim) under the owner's own field manager unless the object names that
    owner already: every owner's reference stays, and the garbage collector deletes the object with the last one. A
    pass that finds it claimed makes one request, as Apply does. An object another tool says it manages (its
    app.kubernetes.io/managed-by label: the chart's repair account is Helm's) is never claimed: it goes with that
    tool's release, not with the clusters."""

    manifest: dict[str, Any]
    claim: dict[str, Any]

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        applied = ctx.api.apply(self.manifest)
        metadata = applied["metadata"]
        (owner,) = self.claim["metadata"]["ownerReferences"]
        others = (metadata.get("labels") or {}).get(LABEL_MANAGED_BY, FIELD_MANAGER) != FIELD_MANAGER
        if not others and all(ref.get("uid") != owner["uid"] for ref in metadata.get("ownerReferences") or []):
            ctx.api.apply(self.claim, manager=f"{FIELD_MANAGER}/{owner['uid']}")


@dataclass(frozen=True)
class Patch:
    """A JSON merge patch; `if_version`: only if the object is still that version (409 Conflict otherwise), for a
    change decided from a cached copy that must not be made twice (a drain's start time)."""

    api_version: str
    plural: str
    namespace: str | None
    name: str
    patch: dict[str, Any]
    if_version: str | None = None

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        patch = self.patch
        if self.if_version is not None:
            metadata = {**patch.get("metadata", {}), "resourceVersion": self.if_version}
            patch = {**patch, "metadata": metadata}
        ctx.api.patch(self.api_version, self.plural, self.namespace, self.name, patch)


@dataclass(frozen=True)
class Delete:
    api_version: str
    plural: str
    namespace: str | None
    name: str

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        ctx.api.delete(self.api_version, self.plural, self.namespace, self.name)


@dataclass(frozen=True)
class PatchStatus:
    """Patch the reconciled object's status with `changes`, only where they differ (no API call otherwise).

    `if_unchanged`: only if the object is still the version the pass observed (409 Conflict otherwise), for a pass
    that read it from a cache, which may not hold the last pass's own write yet."""

    plural: str
    changes: dict[str, Any] = field(default_factory=dict)
    if_unchanged: bool = False

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        patch_status(ctx, self.plural, body, self.changes, self.if_unchanged)


@dataclass(frozen=True)
class PostEvent:
    """A Kubernetes Event on the reconciled object, or on `involved` when the decision concerns another one."""

    reason: str
    message: str
    warning: bool = False
    involved: dict[str, Any] | None = None
    counted: bool = False
    """One of many alike (every Ledger a bookie loss touches): counted into one Event per reason on `involved` and
    window (kube.runtime.context.EventTally), not posted on the reconciled object."""

    def apply(self, ctx: OperatorContext, body: dict[str, Any]) -> None:
        if self.counted and self.involved is not None:
            ctx.events.add(self.involved, self.reason, body["metadata"]["name"], self.message, self.warning)
        else:
            ctx.api.post_event(self.involved or body, self.reason, self.message, warning=self.warning)


@dataclass(frozen=True)
class Decision:
    """What one pass decided (pure): the actions, in order, and when to look again sooner than the loop would."""

    actions: tuple[Action, ...] = ()
    recheck_at: dt.datetime | None = None
    """When the passing of time alone changes the decision (the end of a recovery delay): the next pass is due then,
    not at the next interval."""
    requeue: bool = False
    """It waits for something no watch reports (a bookie registering, a Secret appearing): pass it again after the
    loop's retry interval."""

    def recheck_in(self, moment: dt.datetime) -> float | None:
        """Seconds from `moment` (the time decide was given) until `recheck_at`; None when only a change, or the next
        interval, calls for a pass."""
        return None if self.recheck_at is None else max((self.recheck_at - moment).total_seconds(), 0.0)

    def due(self, moment: dt.datetime, retry: float | None) -> float | None:
        """Seconds from `moment` until the next pass: at `recheck_at`, or after the loop's `retry` interval when the
        decision asked to be requeued, whichever comes first; None when only a change calls for one."""
        due = self.recheck_in(moment)
        if self.requeue and retry is not None:
            due = retry if due is None else min(due, retry)
        return due


def again_on_conflict(one_pass: Callable[[Sources], Result], cached: Sources, live: Callable[[], Sources]) -> Result:
    """Run a pass on cached reads; when one of its conditional writes meets 409 Conflict (the cache did not hold the
    last write yet: the pass's own previous one, another replica's before a handover), run it once more on live
    reads, so nothing decided from a stale copy is written."""
    try:
        return one_pass(cached)
    except ApiException as exc:
        if exc.status != 409:
            raise
        return one_pass(live())


def act(ctx: OperatorContext, body: dict[str, Any], actions: Iterable[Action]) -> None:
    """Apply the decided actions in order; the first failure stops the pass (the next pass re-decides from scratch)."""
    for action in actions:
        action.apply(ctx, body)
