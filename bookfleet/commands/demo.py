"""`bookfleet demo` (what `make run` runs): watch a lost bookie's ledgers come back to full replication.

Starts the standalone fleet (embedded ZooKeeper, bookies, auditor, repair runner), writes ledgers, kills -9 the
bookie holding the most of them, and narrates the marking, the Spark repair and the verified healthy end state;
then keeps the fleet serving until Ctrl-C, SIGTERM or SIGHUP (or exits, with --exit-when-healthy).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from bookfleet.commanderror import CommandError
from bookfleet.polling import interrupt_on_stop_signals, until_interrupted, wait_for


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="kill a bookie and watch its ledgers be re-replicated")
    parser.add_argument("--bookies", type=int, default=4, help="bookies in the fleet (default 4)")
    parser.add_argument("--ledgers", type=int, default=20, help="ledgers to write (default 20)")
    parser.add_argument("--entries", type=int, default=50, help="entries per ledger (default 50)")
    parser.add_argument("--entry-size", type=int, default=1024, help="bytes per entry (default 1024)")
    parser.add_argument("--data-dir", type=Path, help="keep the fleet's data here (default: a temporary dir)")
    parser.add_argument("--exit-when-healthy", action="store_true", help="stop once every ledger is verified")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each phase (default 120)")
    parser.add_argument(
        "--secure", action="store_true",
        help="mutual TLS on the bookies and ZooKeeper ACLs; certificates and credential under <data-dir>/tls",
    )
    parser.set_defaults(handler=run)


def check_arguments(args) -> None:
    if args.bookies < 4:
        raise CommandError(f"--bookies must be at least 4 (3 for each ensemble and 1 to take over), not {args.bookies}")
    for name in ("ledgers", "entries", "entry_size"):
        if getattr(args, name) < 1:
            raise CommandError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")


def most_marked(under_replication, samples: int = 10) -> int:
    """The most markers seen over half a second: the auditor marks one ledger after another while the runner
    may already be clearing the first ones."""
    seen = 0
    for _ in range(samples):
        seen = max(seen, len(under_replication.ledger_ids()))
        time.sleep(0.05)
    return seen


def run(args) -> int:
    check_arguments(args)
    interrupt_on_stop_signals()
    logging.getLogger().setLevel(logging.WARNING)  # the narration below is the output
    with tempfile.TemporaryDirectory(prefix="bookfleet-demo-") as scratch:
        return Demo(args, args.data_dir or Path(scratch), Console(highlight=False)).play()


class Demo:
    def __init__(self, args, data_dir: Path, console: Console):
        self.args = args
        self.data_dir = data_dir
        self.console = console

    def step(self, text: str) -> None:
        self.console.print(f"\n[bold cyan]▶[/] {text}")

    def play(self) -> int:
        from bookfleet.fleet import BookieStartError, StandaloneCluster
        from bookfleet.zkserver import ZooKeeperStartError

        args, console = self.args, self.console
        console.print(Panel.fit(
            "[bold]bookfleet demo[/]: a bookie dies, the auditor marks its ledgers, Spark copies their replicas "
            "to the survivors, and every entry is checked byte for byte", border_style="cyan",
        ))
        self.step(f"Starting ZooKeeper and {args.bookies} bookies in {self.data_dir}")
        cluster = StandaloneCluster(self.data_dir, args.bookies, secure=args.secure)
        try:
            cluster.start()
        except (BookieStartError, ZooKeeperStartError) as exc:
            raise CommandError(str(exc)) from None
        try:
            return self.scenario(cluster)
        except KeyboardInterrupt:
            console.print("stopping")
            return 0
        finally:
            cluster.stop()

    def scenario(self, cluster) -> int:
        from bookfleet import spark as sparksettings
        from bookfleet.bench.repair import LedgerShape, fill_ledgers, verify_replicas
        from bookfleet.meta import zk as zkclient
        from bookfleet.meta.metadata import MetadataStore
        from bookfleet.meta.underreplication import UnderReplication
        from bookfleet.replication.runner import AutoRecoveryRunner

        args, console = self.args, self.console
        for bookie in cluster.fleet.bookies:
            console.print(f"  bookie [bold]{bookie.bookie_id}[/] at {bookie.address}")
        if cluster.security is not None:
            console.print("  secure: mutual TLS and ZooKeeper ACLs on; a client needs:")
            for line in cluster.security.exports():
                console.print(f"    {line}", markup=False, soft_wrap=True)
        # the JVM starts while ledgers are written, so the repair does not wait for it later
        warm = threading.Thread(target=sparksettings.session, name="spark-warmup", daemon=True)
        warm.start()

        shape = LedgerShape(ensemble_size=3, write_quorum=2, ack_quorum=2)
        self.step(f"Writing {args.ledgers} ledgers of {args.entries} x {args.entry_size} B "
                  f"(E={shape.ensemble_size}, Qw={shape.write_quorum}, Qa={shape.ack_quorum})")
        expected = asyncio.run(fill_ledgers(cluster.zk, args.ledgers, args.entries, args.entry_size, shape))
        zk = zkclient.connect(cluster.zk)
        recovery = None
        try:
            store = MetadataStore(zk)
            under_replication = UnderReplication(zk)
            under_replication.set_recovery_delay(0)
            self.show_ledgers(store, expected, "ensembles after writing")
            warm.join(args.timeout)

            progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[mb]:.2f} MB"), TimeElapsedColumn(), console=console,
            )
            task = progress.add_task("repairing ledgers", total=None, mb=0.0)

            def on_progress(done: int, total: int, copied: int) -> None:
                progress.update(task, completed=done, total=total, mb=copied / 1e6)

            recovery = AutoRecoveryRunner(cluster.zk, progress=on_progress, poll_interval=0.2).start()
            victim = max(cluster.fleet.bookies, key=lambda b: len(store.ledgers_on_bookie(b.bookie_id)))
            held = store.ledgers_on_bookie(victim.bookie_id)
            self.step(f"kill -9 bookie [bold red]{victim.bookie_id}[/] (it holds replicas of {len(held)} ledgers)")
            victim.kill9()
            started = time.monotonic()
            with console.status("waiting for ZooKeeper to expire its session and the auditor to mark its ledgers"):
                wait_for(under_replication.ledger_ids, args.timeout, "the marking")
                marked_at = time.monotonic() - started
                seen = most_marked(under_replication)
            console.print(f"  the auditor marked [bold]{seen}[/] of its {len(held)} ledgers under-replicated "
                          f"{marked_at:.1f}s after the kill")

            self.step("Spark repair job (local[2]) copies the lost replicas to the surviving bookies")
            with progress:
                wait_for(lambda: not under_replication.ledger_ids() and recovery.runner.summaries, args.timeout,
                         "the repair")
            for summary in recovery.runner.summaries:
                for line in summary.lines():
                    console.print(f"  {line}")
            console.print(f"  full replication {time.monotonic() - started:.1f}s after the kill")

            self.step("Verifying every replica on every bookie its segment names")
            problems = asyncio.run(verify_replicas(cluster.zk, expected))
            self.show_ledgers(store, expected, "ensembles after repair")
            if problems:
                for problem in problems[:20]:
                    console.print(f"  [red]{problem}[/]")
                raise CommandError(f"{len(problems)} replica problem(s) after repair")
            entries = sum(len(digests) for digests in expected.values())
            console.print(Panel.fit(
                f"[bold green]healthy[/]: {len(expected)} ledgers, {entries} entries, each on its "
                f"Qw={shape.write_quorum} bookies, byte-identical; {victim.bookie_id} is in no ensemble",
                border_style="green",
            ))
            if args.exit_when_healthy:
                return 0
            console.print(f"\nThe fleet keeps serving (ZooKeeper {cluster.zk}); Ctrl-C stops.")
            until_interrupted()
            return 0
        finally:
            if recovery is not None:
                recovery.stop()
            zk.stop()
            zk.close()

    def show_ledgers(self, store, expected: dict[int, list[bytes]], title: str, rows: int = 8) -> None:
        table = Table(title=title, title_justify="left", show_edge=False)
        for column in ("ledger", "entries", "ensemble"):
            table.add_column(column)
        for ledger_id in sorted(expected)[:rows]:
            metadata = store.read(ledger_id)[0]
            ensembles = " | ".join(", ".join(segment.bookies) for segment in metadata.segments)
            table.add_row(str(ledger_id), str(metadata.last_entry_id + 1), ensembles)
        if len(expected) > rows:
            table.add_row("…", "", f"{len(expected) - rows} more")
        self.console.print(table)
