"""Runs the porcupine history checker (hack/history-checker), built once per content hash by
scripts/build-history-checker.sh into ~/.cache/bookfleet/."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class CheckerUnavailable(RuntimeError):
    """No Go toolchain to build the checker with."""


@functools.cache
def checker_binary() -> Path:
    if not shutil.which("go"):
        raise CheckerUnavailable("the history checker needs a Go toolchain (hack/history-checker)")
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-history-checker.sh")], capture_output=True, text=True, check=True
    )
    return Path(built.stdout.strip().splitlines()[-1])


@dataclass
class Verdict:
    verdict: str
    """legal, illegal or unknown (the time limit ran out)."""
    figures: dict

    @property
    def legal(self) -> bool:
        return self.verdict == "legal"


def check(histories: list[Path], html_dir: Path, timeout_seconds: int = 600) -> Verdict:
    """The checker's verdict on the merged histories; the visualization of illegal partitions lands in html_dir."""
    run = subprocess.run(
        [str(checker_binary()), "-html-dir", str(html_dir), "-timeout", f"{timeout_seconds}s", *map(str, histories)],
        capture_output=True,
        text=True,
    )
    if run.returncode == 3 or not run.stdout.strip():
        raise RuntimeError(f"the history checker refused its input: {run.stderr.strip()}")
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    return Verdict(figures["verdict"], figures)
