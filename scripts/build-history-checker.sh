#!/usr/bin/env bash
# Build the chaos harness's history checker (hack/history-checker: porcupine, pinned in its go.mod/go.sum) into
# ~/.cache/bookfleet/history-checker-<content hash>/, once per content of its sources.
# Prints the binary's path on the last line of stdout; progress goes to stderr.
set -euo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
SRC="$HERE/hack/history-checker"
if ! command -v go >/dev/null 2>&1; then
    echo "build-history-checker: no Go toolchain on PATH" >&2
    exit 3
fi
HASH="$(cd "$SRC" && cat go.mod go.sum $(ls *.go | grep -v '_test\.go$' | sort) | sha256sum | cut -c1-16)"
OUT="${BOOKFLEET_HISTORY_CHECKER_DIR:-$HOME/.cache/bookfleet/history-checker-$HASH}"
if [[ ! -x "$OUT/history-checker" ]]; then
    echo "build-history-checker: building $HASH ..." >&2
    mkdir -p "$OUT"
    (cd "$SRC" && go build -trimpath -ldflags "-s -w" -o "$OUT/history-checker.tmp" .)
    mv "$OUT/history-checker.tmp" "$OUT/history-checker"
fi
echo "$OUT/history-checker"
