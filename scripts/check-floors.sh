#!/usr/bin/env bash
# `make floors`: are the dependency floors in pyproject.toml true? Installs the lowest version every direct dependency
# allows (uv's --resolution lowest-direct; indirect ones resolve as usual) into a scratch virtualenv and runs the fast
# tests there: the ones that need no real cluster and exercise ZooKeeper, the bookie, the client, the CLI, the CRD
# models and the operator on the emulator, plus one Spark repair.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-.venv/bin/uv}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$UV" venv -q --python "$(command -v python3)" "$scratch/venv"
"$UV" pip install -q --python "$scratch/venv/bin/python" --resolution lowest-direct '.[dev]'
"$UV" pip list -q --python "$scratch/venv/bin/python" >&2
# A floor that another dependency overrides is never installed, so never tested: say which and stop.
"$scratch/venv/bin/python" - <<'PY'
import sys
import tomllib
from importlib.metadata import version

from packaging.requirements import Requirement
from packaging.version import Version

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
declared = project["dependencies"] + project["optional-dependencies"]["dev"]
unreached = []
for requirement in map(Requirement, declared):
    floors = [spec.version for spec in requirement.specifier if spec.operator == ">="]
    installed = version(requirement.name)
    if floors and Version(installed) != Version(floors[0]):
        unreached.append(f"{requirement.name}>={floors[0]} installs {installed}: raise the floor to what is tested")
print("\n".join(unreached) or "every floor is the version installed", file=sys.stderr)
sys.exit(1 if unreached else 0)
PY
"$scratch/venv/bin/pytest" -q -p no:cacheprovider -m "not spark and not kind and not chaos" \
    tests/bookie/test_wire.py tests/meta/test_metadata.py tests/meta/test_zookeeper.py tests/meta/test_underreplication.py \
    tests/bookie/test_bookie_protocol.py tests/commands/test_client_cli.py tests/commands/test_cli_status.py tests/kube/test_crds.py \
    tests/kube/test_resources.py tests/kube/test_operator_emulator.py tests/kube/test_operator.py
"$scratch/venv/bin/pytest" -q -p no:cacheprovider tests/replication/test_repair.py -k test_lost_bookie_of_50_ledgers_is_repaired
