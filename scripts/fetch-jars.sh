#!/usr/bin/env bash
# fetch-jars.sh POM VERSION OUT: copy the dependency tree of POM (a pom that only lists dependencies) with Maven into
# OUT/lib, unless OUT/lib.version already says VERSION. Shared by build-bookkeeper.sh and build-pulsar.sh; progress
# goes to stderr.
set -euo pipefail
POM="$1" VERSION="$2" OUT="$3"
mkdir -p "$OUT"
# One fetch at a time per directory (checkouts side by side); its own lock file, as a caller may hold one on the
# directory for what it builds beside the jars.
exec 8>"$OUT/.fetch.lock"
flock 8
if [[ "$(cat "$OUT/lib.version" 2>/dev/null)" != "$VERSION" ]]; then
    started=$SECONDS
    echo "fetching the jars of $(basename "$(dirname "$POM")") $VERSION with Maven (once per version) ..." >&2
    rm -rf "$OUT/lib.tmp"
    mvn -q -B -f "$POM" dependency:copy-dependencies -DoutputDirectory="$OUT/lib.tmp" >&2
    rm -rf "$OUT/lib" && mv "$OUT/lib.tmp" "$OUT/lib"
    echo "$VERSION" > "$OUT/lib.version"
    echo "jars fetched in $((SECONDS - started)) s" >&2
fi
