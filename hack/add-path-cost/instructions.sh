#!/bin/bash
# Instructions per entry of the add path (callgrind, so the figure does not move with the machine's load): two runs of
# loopback.py (or flush.py), 10,000 and 30,000 entries, and the difference over 20,000 (start-up divides out).
# Usage: hack/add-path-cost/instructions.sh [--client-only | --flush] [--bookies 3]  (from the repository root; nice it
# on a busy box)
# --client-only: the client's own instructions (loopback.py's canned bookies run in processes callgrind does not follow).
# --flush: instructions per entry of one memtable flush (flush.py) instead.
set -euo pipefail
python=${PYTHON:-.venv/bin/python}
script=hack/add-path-cost/loopback.py
if [ "${1:-}" = --flush ]; then script=hack/add-path-cost/flush.py; shift; fi
count() {
    PYTHONPATH=. valgrind --tool=callgrind --callgrind-out-file=/dev/null "$python" "$script" "$@" \
        2>&1 | awk '/Collected/ {print $4}'
}
small=$(count 10000 "$@")
large=$(count 30000 "$@")
echo "instructions per entry, $(basename "$script" .py)${*:+ $*}: $(( (large - small) / 20000 ))"
