#!/usr/bin/env bash
# Build kwok (simulated nodes and pod lifecycles on a real API server, for `bookfleet bench operator --scale`) from
# the Go module proxy into ~/.cache/bookfleet/kwok-<version>/, once per version pinned in hack/kwok/go.mod.
# Prints the binary's path on the last line of stdout (its stages.yaml beside it); progress goes to stderr. Exit 3: no Go toolchain.
set -euo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
MOD="$HERE/hack/kwok"
if ! command -v go >/dev/null 2>&1; then
    echo "build-kwok: no Go toolchain on PATH" >&2
    exit 3
fi
VERSION="$(cd "$MOD" && go list -m -f '{{.Version}}' sigs.k8s.io/kwok)"
OUT="${BOOKFLEET_KWOK_DIR:-$HOME/.cache/bookfleet/kwok-${VERSION#v}}"
mkdir -p "$OUT"
if [[ -x "$OUT/kwok" && "$(cat "$OUT/kwok.version" 2>/dev/null)" == "$VERSION" ]]; then
    echo "build-kwok: kwok $VERSION already in $OUT" >&2
else
    started=$SECONDS
    echo "build-kwok: building kwok $VERSION (nice -n 10; a cold build takes minutes) ..." >&2
    (cd "$MOD" && nice -n 10 go build -trimpath -ldflags "-s -w" -o "$OUT/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok)
    mv "$OUT/kwok.tmp" "$OUT/kwok"
    echo "$VERSION" > "$OUT/kwok.version"
    echo "build-kwok: kwok built in $((SECONDS - started)) s" >&2
fi
# kwok's own stages of the same version (nodes Ready with lease heartbeats; pods Ready, deleted), in one file for
# `kwok --config`. Not pod-complete: a repair Job's pod that "succeeds" at once without repairing anything would have
# the operator retry it for ever.
STAGES="$(cd "$MOD" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease pod/fast/pod-ready \
        pod/fast/pod-delete; do
    cat "$STAGES/$stage.yaml"
    echo "---"
done > "$OUT/stages.yaml"
echo "$OUT/kwok"
