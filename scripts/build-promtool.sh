#!/usr/bin/env bash
# Build Prometheus' promtool (the chart's alert rule tests: `promtool check rules`, `promtool test rules`) from the Go
# module proxy into ~/.cache/bookfleet/promtool-<version>/, once per version pinned in hack/promtool/go.mod.
# Prints the binary's path on the last line of stdout; progress goes to stderr. Exit 3: no Go toolchain.
set -euo pipefail

source "$(dirname "$0")/go-module.sh"
build_pinned promtool github.com/prometheus/prometheus github.com/prometheus/prometheus/cmd/promtool 19
echo "$OUT/promtool"
