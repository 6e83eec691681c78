"""Apache BookKeeper 4.17.2's own per-bookie client (BookieClientImpl, its DigestManager's CRC32C entries) against
one bookfleet bookie, over protocol V2 and V3: hack/bookkeeper-interop's probe, built with the jars by
scripts/build-bookkeeper.sh (cached). No ZooKeeper records are involved: only the wire."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from bookfleet.bench.bookkeeper import built_reference

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("java", "javac", "mvn")), reason="no JDK (java, javac, mvn) on PATH"
)

COMMON_STEPS = ["add", "read", "read-last", "fence", "add-after-fence", "recovery-add"]
PROTOCOL_STEPS = {
    "v2": ["batch-read"],
    "v3": ["read-lac", "write-lac", "force-ledger", "bookie-info", "long-poll"],
}


@pytest.fixture(scope="module")
def probe_classpath() -> str:
    reference = built_reference()
    return f"{reference / 'classes'}:{reference / 'lib' / '*'}"


@pytest.mark.parametrize("protocol", ["v2", "v3"])
def test_bookkeeper_client_adds_reads_fences_and_recovers(bookie_fleet, probe_classpath, protocol):
    (bookie,) = bookie_fleet.start(1)
    probe = subprocess.run(
        ["java", "-cp", probe_classpath, "BookieClientProbe", "127.0.0.1", str(bookie.port), protocol, "31"],
        capture_output=True, text=True, timeout=300,
    )
    steps = {line.split()[1]: line for line in probe.stdout.splitlines() if line.startswith("ok ")}
    assert probe.returncode == 0, probe.stdout + probe.stderr[-3000:]
    assert sorted(steps) == sorted(COMMON_STEPS + PROTOCOL_STEPS[protocol]), probe.stdout
    assert steps["read-last"] == "ok read-last lac=8"  # entry 9, the last stored, carries LAC 8
    assert steps["fence"] == ("ok fence lac=8")
    assert bookie.running and "Traceback" not in bookie.log_path.read_text()
