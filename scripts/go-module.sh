# Sourced by the scripts that build one command of a Go module pinned in hack/<name>/go.mod (build-kwok.sh,
# build-promtool.sh): from the Go module proxy into ~/.cache/bookfleet/<name>-<version>/, once per version.
# build_pinned <name> <module> <package> <nice level>: sets MOD, VERSION, OUT and builds $OUT/<name>; progress goes to
# stderr; exit 3 without a Go toolchain. BOOKFLEET_<NAME>_DIR replaces the output directory.

build_pinned() {
    local name="$1" module="$2" package="$3" niceness="$4"
    MOD="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/hack/$name"
    if ! command -v go >/dev/null 2>&1; then
        echo "build-$name: no Go toolchain on PATH" >&2
        exit 3
    fi
    VERSION="$(cd "$MOD" && go list -m -f '{{.Version}}' "$module")"
    local override="BOOKFLEET_${name^^}_DIR"
    OUT="${!override:-$HOME/.cache/bookfleet/$name-${VERSION#v}}"
    mkdir -p "$OUT"
    if [[ -x "$OUT/$name" && "$(cat "$OUT/$name.version" 2>/dev/null)" == "$VERSION" ]]; then
        echo "build-$name: $name $VERSION already in $OUT" >&2
        return
    fi
    local started=$SECONDS
    echo "build-$name: building $name $VERSION (nice -n $niceness; a cold build takes minutes) ..." >&2
    (cd "$MOD" && nice -n "$niceness" go build -trimpath -ldflags "-s -w" -o "$OUT/$name.tmp" "$package")
    mv "$OUT/$name.tmp" "$OUT/$name"
    echo "$VERSION" > "$OUT/$name.version"
    echo "build-$name: $name built in $((SECONDS - started)) s" >&2
}
