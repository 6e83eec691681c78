#!/usr/bin/env bash
# Build kwok (simulated nodes and pod lifecycles on a real API server, for `bookfleet bench operator --scale`) from
# the Go module proxy into ~/.cache/bookfleet/kwok-<version>/, once per version pinned in hack/kwok/go.mod.
# Prints the binary's path on the last line of stdout (its stages.yaml beside it); progress goes to stderr. Exit 3: no Go toolchain.
set -euo pipefail

source "$(dirname "$0")/go-module.sh"
build_pinned kwok sigs.k8s.io/kwok sigs.k8s.io/kwok/cmd/kwok 10

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
