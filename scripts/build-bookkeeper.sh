#!/usr/bin/env bash
# Fetch the pinned Apache BookKeeper jars (hack/bookkeeper-bench/pom.xml) with Maven into
# ~/.cache/bookfleet/bookkeeper-<version>/lib, once per version, and compile the Java side of
# `bookfleet bench bookkeeper` (hack/bookkeeper-bench/src) and the interop tests' probe (hack/bookkeeper-interop/src)
# into .../classes whenever their source changes.
# The reference stays outside the clone and outside the wheel. Prints the directory on the last line of stdout;
# progress goes to stderr.
set -euo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
BENCH="$HERE/hack/bookkeeper-bench"
SOURCES=("$BENCH"/src/*.java "$HERE"/hack/bookkeeper-interop/src/*.java)
for tool in mvn javac; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "build-bookkeeper: no $tool on PATH" >&2
        exit 3
    fi
done
VERSION="$(sed -n 's:.*<bookkeeper.version>\(.*\)</bookkeeper.version>.*:\1:p' "$BENCH/pom.xml")"
OUT="${BOOKFLEET_BOOKKEEPER_DIR:-$HOME/.cache/bookfleet/bookkeeper-$VERSION}"
mkdir -p "$OUT"
# One build at a time per directory: two at once (pytest workers, checkouts side by side) compiled into one temporary
# directory, and a partial set of classes was recorded under the full sources' checksum.
exec 9>"$OUT/.build.lock"
flock 9
bash "$HERE/scripts/fetch-jars.sh" "$BENCH/pom.xml" "$VERSION" "$OUT"

SOURCE_SUM="$(cat "${SOURCES[@]}" | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$OUT/classes.sha256" 2>/dev/null)" != "$SOURCE_SUM" ]]; then
    rm -rf "$OUT/classes.tmp" && mkdir -p "$OUT/classes.tmp"
    javac -nowarn -d "$OUT/classes.tmp" -cp "$OUT/lib/*" "${SOURCES[@]}" >&2
    rm -rf "$OUT/classes" && mv "$OUT/classes.tmp" "$OUT/classes"
    echo "$SOURCE_SUM" > "$OUT/classes.sha256"
    echo "build-bookkeeper: bench and probe compiled" >&2
fi
echo "$OUT"
