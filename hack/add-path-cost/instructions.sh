#!/bin/bash
# Instructions per add of the add path (callgrind, so the figure does not move with the machine's load): two runs of
# loopback.py, 10,000 and 30,000 adds, and the difference over 20,000 (start-up divides out).
# Usage: hack/add-path-cost/instructions.sh [--client-only]    (run from the repository root, under nice on a busy box)
set -euo pipefail
python=${PYTHON:-.venv/bin/python}
count() {
    PYTHONPATH=. valgrind --tool=callgrind --callgrind-out-file=/dev/null "$python" hack/add-path-cost/loopback.py "$@" \
        2>&1 | awk '/Collected/ {print $4}'
}
small=$(count 10000 "$@")
large=$(count 30000 "$@")
echo "instructions per add${1:+ ($1)}: $(( (large - small) / 20000 ))"
