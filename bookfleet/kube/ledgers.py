"""Ledger resources <-> ZooKeeper: create (or adopt) the ledger, then mirror its metadata and health in status.

Creation is restart-safe: the id is reserved first and written to status, then the metadata is created under that
id; a run interrupted in between finds the id in status and only finishes the creation.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable, Iterable

from kazoo.client import KazooClient
from pydantic import ValidationError

from bookfleet.client.placement import NotEnoughBookies, choose_ensemble
from bookfleet.kube import repairs
from bookfleet.kube.api import CORE, CUSTOM
from bookfleet.kube.context import OperatorContext, conditions_with, patch_status, timestamp
from bookfleet.kube.models import (
    DATA_LOSS,
    VALID,
    BookieCluster,
    ConditionStatus,
    Ledger,
    ledger_problems,
    validity_condition,
)
from bookfleet.meta.metadata import LedgerMetadata, MetadataError, MetadataStore, NoSuchLedgerError, new_metadata
from bookfleet.meta.registry import BookieRegistry
from bookfleet.meta.underreplication import Marker, UnderReplication

CREATED = "Created"


def password(ctx: OperatorContext, ledger: Ledger) -> bytes:
    ref = ledger.spec.password_secret_ref
    if ref is None:
        return b""
    secret = ctx.api.get(CORE, "secrets", ledger.metadata.namespace, ref.name)
    if secret is None or ref.key not in (secret.get("data") or {}):
        raise LookupError(f"secret {ref.name!r} with key {ref.key!r} not found")
    return base64.b64decode(secret["data"][ref.key])


def _report(ctx: OperatorContext, body: dict, type_: str, ok: bool, reason: str, message: str) -> None:
    patch_status(ctx, "ledgers", body, {"conditions": conditions_with(body.get("status") or {}, type_, ok, reason,
                                                                      message)})


def sync(ctx: OperatorContext, body: dict, repairs_of: Callable[[repairs.LedgerKey], Iterable[dict]]) -> None:
    """One level-based pass over a Ledger (called by a timer); `repairs_of` looks up the repair Jobs covering a
    ledger in the operator's index."""
    meta = body["metadata"]
    try:
        ledger = Ledger.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        _report(ctx, body, VALID, False, "InvalidSpec", problems)
        return
    cluster_body = ctx.api.get(CUSTOM, "bookieclusters", meta["namespace"], ledger.spec.cluster)
    cluster = None if cluster_body is None else BookieCluster.model_validate(cluster_body)
    validity = validity_condition(ledger_problems(ledger.spec, None if cluster is None else cluster.spec))
    if cluster is None or validity.status != ConditionStatus.TRUE:
        _report(ctx, body, validity.type, False, validity.reason, validity.message)
        return
    zk = ctx.zk(cluster.spec.zookeeper)
    store = MetadataStore(zk)
    ledger_id = ledger.status.ledger_id
    if ledger_id is None:
        ledger_id = ledger.spec.ledger_id if ledger.spec.ledger_id is not None else store.new_ledger_id()
        ctx.api.patch_status("ledgers", meta["namespace"], meta["name"], {"ledgerId": ledger_id})
    try:
        metadata, _ = store.read(ledger_id)
    except NoSuchLedgerError:
        if ledger.spec.ledger_id is not None:
            _report(ctx, body, VALID, False, "NoSuchLedger", f"ledger {ledger_id} does not exist in ZooKeeper")
            return
        if not create(ctx, body, ledger, zk, ledger_id):
            return
        metadata, _ = store.read(ledger_id)
    _report(ctx, body, validity.type, True, validity.reason, validity.message)
    ur = UnderReplication(zk)
    loss = ur.data_loss(ledger_id)
    repair = repair_status(repairs_of((meta["namespace"], cluster.metadata.name, ledger_id)))
    patch_status(ctx, "ledgers", body, decide_status(ledger_id, metadata, ur.marker(ledger_id), repair))
    if loss is not None:
        _report(ctx, body, DATA_LOSS, True, "EntriesLost", f"no replica holds entries {list(loss.entries)[:20]}")
    else:
        _report(ctx, body, DATA_LOSS, False, "AllEntriesReplicated", "")


def decide_status(ledger_id: int, metadata: LedgerMetadata, marker: Marker | None, repair: dict | None) -> dict:
    """The Ledger's status from its metadata, its under-replication marker and its latest repair (pure)."""
    return {
        "ledgerId": ledger_id,
        "state": metadata.state.value,
        "lastEntryId": metadata.last_entry_id,
        "length": metadata.length,
        "segments": [{"firstEntryId": s.first_entry_id, "bookies": list(s.bookies)} for s in metadata.segments],
        "underReplicated": None if marker is None else {
            "missingBookies": sorted(marker.missing_bookies),
            "since": timestamp(dt.datetime.fromtimestamp(marker.ctime / 1000, dt.UTC)),
        },
        "repair": repair,
    }


def create(ctx: OperatorContext, body: dict, ledger: Ledger, zk: KazooClient, ledger_id: int) -> bool:
    """Create the ledger's metadata under the reserved id; False (with a condition saying why) if it cannot yet."""
    spec = ledger.spec
    try:
        ensemble = choose_ensemble(BookieRegistry(zk).writable(), spec.ensemble_size, spec.write_quorum,
                                   zones=spec.zones)
        metadata = new_metadata(ensemble, spec.write_quorum, spec.ack_quorum, spec.digest_type,
                                password(ctx, ledger))
        MetadataStore(zk).create(metadata, ledger_id)
    except (NotEnoughBookies, LookupError) as exc:
        _report(ctx, body, CREATED, False, type(exc).__name__, str(exc))
        return False
    except MetadataError:
        pass  # created by an earlier run that stopped before reporting it
    _report(ctx, body, CREATED, True, "Created", f"ledger {ledger_id} on {', '.join(ensemble)}")
    return True


def repair_status(covering: Iterable[dict]) -> dict | None:
    """The latest of the repair Jobs covering a ledger (from the operator's index), as the Ledger's status shows it."""
    attempts = sorted(covering, key=repairs.attempt_order)
    if not attempts:
        return None
    job = attempts[-1]
    finished = repairs.finished_at(job)
    return {
        "job": job["metadata"]["name"],
        "state": repairs.job_state(job).value,
        "started": job["metadata"].get("creationTimestamp"),
        "finished": timestamp(finished) if finished else None,
        "attempts": len(attempts),
    }
