#!/usr/bin/env bash
# Fetch Apache Pulsar's broker (hack/pulsar/pom.xml) and its whole dependency tree with Maven into
# ~/.cache/bookfleet/pulsar-<version>/lib, once per version, beside the BookKeeper reference (scripts/build-bookkeeper.sh).
# tests/pulsar runs the broker from these jars. Prints the directory on the last line of stdout; progress goes to stderr.
set -euo pipefail

POM="$(cd "$(dirname "$0")/.." && pwd)/hack/pulsar/pom.xml"
if ! command -v mvn >/dev/null 2>&1; then
    echo "build-pulsar: no mvn on PATH" >&2
    exit 3
fi
VERSION="$(sed -n 's:.*<pulsar.version>\(.*\)</pulsar.version>.*:\1:p' "$POM")"
OUT="${BOOKFLEET_PULSAR_DIR:-$HOME/.cache/bookfleet/pulsar-$VERSION}"
bash "$(dirname "$0")/fetch-jars.sh" "$POM" "$VERSION" "$OUT"
echo "$OUT"
