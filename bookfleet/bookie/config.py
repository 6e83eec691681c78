"""Bookie settings: one dataclass, filled from `bookfleet bookie` flags; storage tuning comes from StorageSettings."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from bookfleet.bookie.storage import StorageSettings


@dataclass
class BookieConfig:
    bookie_id: str
    port: int
    journal_dir: Path
    ledger_dir: Path
    zk: str
    http_port: int = 0
    listen_host: str = "127.0.0.1"
    advertised_address: str = ""
    zone: str = ""
    disk_quota: int | None = None
    disk_usage_threshold: float = 0.95
    disk_usage_lwm: float = 0.90
    disk_check_interval: float = 2.0
    gc_interval: float = 60.0
    gc_grace: float = 60.0
    zk_session_timeout: float = 6.0
    max_in_flight: int = 2000
    storage: StorageSettings = field(default_factory=StorageSettings)

    def __post_init__(self) -> None:
        if not self.advertised_address:
            self.advertised_address = f"127.0.0.1:{self.port}"
        if not 0 < self.disk_usage_lwm <= self.disk_usage_threshold <= 1:
            raise ValueError(
                f"need 0 < --disk-usage-lwm ({self.disk_usage_lwm}) <= --disk-usage-threshold "
                f"({self.disk_usage_threshold}) <= 1"
            )
        if self.disk_quota is not None and self.disk_quota <= 0:
            raise ValueError(f"--disk-quota must be a positive number of bytes, not {self.disk_quota}")
        if self.port <= 0:
            raise ValueError(f"--port must be a TCP port, not {self.port}")


_STORAGE_PREFIX = "storage_"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `bookfleet bookie` flags; storage tuning flags are generated from StorageSettings' fields."""
    parser.add_argument("--id", dest="bookie_id", help="stable bookie id, a name (default localhost:<port>)")
    parser.add_argument("--port", type=int, required=True, help="wire-protocol TCP port")
    parser.add_argument("--http-port", type=int, default=0, help="port of /healthz /readyz /metrics (0: any free)")
    parser.add_argument("--listen-host", default="127.0.0.1", help="interface to bind (0.0.0.0 in a pod)")
    parser.add_argument("--advertised-address", default="", help="HOST:PORT clients dial (default 127.0.0.1:<port>)")
    parser.add_argument("--journal-dir", type=Path, required=True)
    parser.add_argument("--ledger-dir", type=Path, required=True)
    parser.add_argument("--zk", required=True, help="ZooKeeper connect string HOST:PORT[,...][/chroot]")
    parser.add_argument("--zone", default="", help="failure zone, for zone-aware placement")
    parser.add_argument("--disk-quota", type=int, help="bytes of ledger storage allowed (usage = used / quota)")
    parser.add_argument("--disk-usage-threshold", type=float, default=0.95, help="turn read-only above this usage")
    parser.add_argument("--disk-usage-lwm", type=float, default=0.90, help="turn writable again below this usage")
    parser.add_argument("--disk-check-interval", type=float, default=2.0, help="seconds between disk checks")
    parser.add_argument("--gc-interval", type=float, default=60.0, help="seconds between garbage collections")
    parser.add_argument("--gc-grace", type=float, default=60.0, help="never collect a ledger seen for less than this")
    parser.add_argument("--zk-session-timeout", type=float, default=6.0, help="seconds; a dead bookie vanishes after")
    parser.add_argument("--max-in-flight", type=int, default=2000, help="requests per connection before reading pauses")
    tuning = parser.add_argument_group("storage tuning")
    for setting in dataclasses.fields(StorageSettings):
        default = getattr(StorageSettings(), setting.name)
        tuning.add_argument(
            f"--{setting.name.replace('_', '-')}",
            dest=_STORAGE_PREFIX + setting.name,
            type=type(default),
            default=default,
            help=f"(default {default})",
        )


def from_args(args: argparse.Namespace) -> BookieConfig:
    options = vars(args)
    storage = StorageSettings(
        **{name: options[_STORAGE_PREFIX + name] for name in (f.name for f in dataclasses.fields(StorageSettings))}
    )
    own = {f.name for f in dataclasses.fields(BookieConfig)} - {"storage"}
    values = {name: options[name] for name in own if name in options}
    values["bookie_id"] = args.bookie_id or f"localhost:{args.port}"
    values["journal_dir"] = args.journal_dir.resolve()
    values["ledger_dir"] = args.ledger_dir.resolve()
    return BookieConfig(**values, storage=storage)
