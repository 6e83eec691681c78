#!/usr/bin/env bash
# Build the local control plane (kube-apiserver, kube-controller-manager, kube-scheduler, etcd, helm) from the
# Go module proxy into ~/.cache/bookfleet/kube-<version>/, once per version: the wrapper modules under hack/kube/
# pin every version, and a binary is rebuilt only when its pinned version changes. `build-kube.sh kubelet kube-proxy
# coredns` adds what a real node (containerd) needs: its kubelet and kube-proxy from the same pinned k8s.io/kubernetes,
# and the cluster's DNS, CoreDNS with only its kubernetes plugin (hack/kube/coredns).
# Prints the binary directory on the last line of stdout; progress goes to stderr.
set -euo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
MODS="$HERE/hack/kube"
if ! command -v go >/dev/null 2>&1; then
    echo "build-kube: no Go toolchain on PATH" >&2
    exit 3
fi

pinned() {  # pinned <module dir> <module path> -> version from that wrapper's go.mod
    (cd "$MODS/$1" && go list -m -f '{{.Version}}' "$2")
}

KUBE_VERSION="$(pinned kubernetes k8s.io/kubernetes)"
ETCD_VERSION="$(pinned etcd go.etcd.io/etcd/server/v3)"
HELM_VERSION="$(pinned helm helm.sh/helm/v3)"
OUT="${BOOKFLEET_KUBE_DIR:-$HOME/.cache/bookfleet/kube-${KUBE_VERSION#v}}"
mkdir -p "$OUT"

build() {  # build <module dir> <version> <ldflags> <package> <binary>
    local dir="$1" version="$2" ldflags="$3" package="$4" name="$5"
    if [[ -x "$OUT/$name" && "$(cat "$OUT/$name.version" 2>/dev/null)" == "$version" ]]; then
        echo "build-kube: $name $version already in $OUT" >&2
        return
    fi
    local started=$SECONDS
    echo "build-kube: building $name $version (nice -n 10; a cold build takes many minutes) ..." >&2
    (cd "$MODS/$dir" && nice -n 10 go build -trimpath -ldflags "-s -w $ldflags" -o "$OUT/$name.tmp" "$package")
    mv "$OUT/$name.tmp" "$OUT/$name"
    echo "$version" > "$OUT/$name.version"
    echo "build-kube: $name built in $((SECONDS - started)) s" >&2
}

MINOR="$(echo "$KUBE_VERSION" | cut -d. -f2)"
KUBE_LDFLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    KUBE_LDFLAGS+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$MINOR"
    KUBE_LDFLAGS+=" -X $pkg.gitTreeState=clean"
done
commands=() coredns=""
for name in "$@"; do
    if [[ "$name" == coredns ]]; then coredns=1; else commands+=("$name"); fi
done
for name in kube-apiserver kube-controller-manager kube-scheduler "${commands[@]}"; do
    build kubernetes "$KUBE_VERSION" "$KUBE_LDFLAGS" "k8s.io/kubernetes/cmd/$name" "$name"
done
if [[ -n "$coredns" ]]; then
    build coredns "$(pinned coredns github.com/coredns/coredns)" "" . coredns
fi
build etcd "$ETCD_VERSION" "" go.etcd.io/etcd/server/v3 etcd
build helm "$HELM_VERSION" "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" helm.sh/helm/v3/cmd/helm helm
echo "$OUT"
