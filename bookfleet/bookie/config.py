"""Bookie settings: one dataclass, filled from `bookfleet bookie` flags; storage tuning comes from StorageSettings
and the per-connection and server-wide limits from ServerLimits, whose fields become flags of the same names."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from bookfleet import eventloop
from bookfleet.bookie.admission import DEFAULT_CACHE_LEDGERS
from bookfleet.bookie.serving import ServerLimits
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
    disk_usage_recovery_limit: float | None = None
    """Past the threshold, recovery adds of the bookie's own ledgers still go in up to this usage (the reserve the
    threshold keeps for them); None: halfway between the threshold and a full disk."""
    disk_check_interval: float = 2.0
    gc_interval: float = 60.0
    gc_grace: float = 60.0
    zk_session_timeout: float = 6.0
    tls_dir: Path | None = None
    http_tls: bool = False
    verify_ledgers: bool = True
    admission_cache_ledgers: int = DEFAULT_CACHE_LEDGERS
    """Ledger ids admission remembers as existing (and as closed), least recently used forgotten first."""
    event_loop: str = "auto"
    storage: StorageSettings = field(default_factory=StorageSettings)
    limits: ServerLimits = field(default_factory=ServerLimits)

    @property
    def loop_choice(self) -> str:
        """The event loop to run on: `event_loop`, except that a bookie serving TLS runs on asyncio (uvloop 0.23's
        server-side start_tls fails the handshake with UNEXPECTED_MESSAGE)."""
        return "asyncio" if self.tls_dir is not None else self.event_loop

    def __post_init__(self) -> None:
        if not self.advertised_address:
            self.advertised_address = f"127.0.0.1:{self.port}"
        if not 0 < self.disk_usage_lwm <= self.disk_usage_threshold <= 1:
            raise ValueError(
                f"need 0 < --disk-usage-lwm ({self.disk_usage_lwm}) <= --disk-usage-threshold "
                f"({self.disk_usage_threshold}) <= 1"
            )
        if self.disk_usage_recovery_limit is None:
            self.disk_usage_recovery_limit = (self.disk_usage_threshold + 1) / 2
        if not self.disk_usage_threshold <= self.disk_usage_recovery_limit <= 1:
            raise ValueError(
                f"need --disk-usage-threshold ({self.disk_usage_threshold}) <= --disk-usage-recovery-limit "
                f"({self.disk_usage_recovery_limit}) <= 1"
            )
        if self.disk_quota is not None and self.disk_quota <= 0:
            raise ValueError(f"--disk-quota must be a positive number of bytes, not {self.disk_quota}")
        if self.port <= 0:
            raise ValueError(f"--port must be a TCP port, not {self.port}")
        if self.event_loop not in eventloop.CHOICES:
            raise ValueError(f"--event-loop must be one of {', '.join(eventloop.CHOICES)}, not {self.event_loop}")
        if self.http_tls and self.tls_dir is None:
            raise ValueError("--http-tls serves the bookie's certificate: it needs --tls-dir")


_STORAGE_PREFIX = "storage_"
_LIMITS_PREFIX = "limits_"
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(BookieConfig)}


def _tunable(parser, name: str, help: str, kind: type | None = None) -> None:
    """A flag whose default (and type) come from BookieConfig, so they are written down once."""
    default = _DEFAULTS[name]
    parser.add_argument("--" + name.replace("_", "-"), type=kind or type(default), default=default, help=help)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `bookfleet bookie` flags; storage tuning flags are generated from StorageSettings' fields."""
    parser.add_argument("--id", dest="bookie_id", help="stable bookie id, a name (default localhost:<port>)")
    parser.add_argument("--port", type=int, required=True, help="wire-protocol TCP port")
    parser.add_argument("--journal-dir", type=Path, required=True)
    parser.add_argument("--ledger-dir", type=Path, required=True)
    parser.add_argument("--zk", required=True, help="ZooKeeper connect string HOST:PORT[,...][/chroot]")
    _tunable(parser, "http_port", "port of /healthz /readyz /metrics (0: any free)")
    _tunable(parser, "listen_host", "interface to bind (0.0.0.0 in a pod)")
    _tunable(parser, "advertised_address", "HOST:PORT clients dial (default 127.0.0.1:<port>)")
    _tunable(parser, "zone", "failure zone, for zone-aware placement")
    _tunable(parser, "disk_quota", "bytes of ledger storage allowed (usage = used / quota)", int)
    _tunable(parser, "disk_usage_threshold", "turn read-only above this usage")
    _tunable(parser, "disk_usage_lwm", "turn writable again below this usage")
    _tunable(
        parser, "disk_usage_recovery_limit",
        "read-only past the threshold, still take recovery adds of its own ledgers up to this usage "
        "(default: halfway between the threshold and 1)", float,
    )
    _tunable(parser, "disk_check_interval", "seconds between disk checks")
    _tunable(parser, "gc_interval", "seconds between garbage collections")
    _tunable(parser, "gc_grace", "never collect a ledger this process has known for less (seconds)")
    _tunable(parser, "zk_session_timeout", "seconds after a crash until the registration vanishes")
    _tunable(parser, "admission_cache_ledgers", "ledger ids admission remembers (an LRU; a forgotten one is looked up)")
    parser.add_argument(
        "--tls-dir", type=Path, default=None,
        help="serve mutual TLS with ca.pem, cert.pem, key.pem from this directory (reloaded when they change)",
    )
    parser.add_argument(
        "--http-tls", action="store_true",
        help="serve /healthz /readyz /metrics over HTTPS with the --tls-dir certificate (probes then need HTTPS)",
    )
    parser.add_argument(
        "--event-loop", choices=eventloop.CHOICES, default=_DEFAULTS["event_loop"],
        help="auto (default): uvloop when installed, else asyncio; a bookie serving TLS always runs on asyncio",
    )
    parser.add_argument(
        "--no-verify-ledgers", dest="verify_ledgers", action="store_false",
        help="create any ledger id a client names, without checking ZooKeeper metadata (raw-protocol tests only)",
    )
    for title, settings, prefix in (
        ("storage tuning", StorageSettings, _STORAGE_PREFIX),
        ("connection limits", ServerLimits, _LIMITS_PREFIX),
    ):
        group = parser.add_argument_group(title)
        for setting in dataclasses.fields(settings):
            group.add_argument(
                f"--{setting.name.replace('_', '-')}",
                dest=prefix + setting.name,
                type=type(setting.default),
                default=setting.default,
                help=f"(default {setting.default})",
            )


def from_args(args: argparse.Namespace) -> BookieConfig:
    options = vars(args)
    storage, limits = (
        settings(**{f.name: options[prefix + f.name] for f in dataclasses.fields(settings)})
        for settings, prefix in ((StorageSettings, _STORAGE_PREFIX), (ServerLimits, _LIMITS_PREFIX))
    )
    own = {f.name for f in dataclasses.fields(BookieConfig)} - {"storage", "limits"}
    values = {name: options[name] for name in own if name in options}
    values["bookie_id"] = args.bookie_id or f"localhost:{args.port}"
    values["journal_dir"] = args.journal_dir.resolve()
    values["ledger_dir"] = args.ledger_dir.resolve()
    return BookieConfig(**values, storage=storage, limits=limits)
