#!/usr/bin/env bash
# Build the bookfleet images from the repository's own Dockerfiles with buildah, on a Debian base made here with
# debootstrap (no registry needed), into ~/.cache/bookfleet/images/ (buildah's private storage). Each image is
# built once per content hash (Dockerfile, sources, pins, base); buildah's layer cache keeps a source-only change
# to the last layers. Elsewhere the same Dockerfiles build with docker from the public base (see docs/operating.md, Images).
# Usage: scripts/build-images.sh [bookie|operator|repair|pause|zookeeper|pulsar ...]   (default: bookie, operator, repair)
# `pause` is the pod sandbox image of the local cluster's real nodes: hack/pause built static, FROM scratch;
# `zookeeper` the local cluster's stand-in for the official image the chart names (tests/cluster/images/); `pulsar`
# Apache Pulsar's broker from the jars of scripts/build-pulsar.sh (`make cluster-pulsar` only: never by default).
# Prints one line per image, "<name> <reference>", on stdout; progress goes to stderr. With BOOKFLEET_IMAGE_ARCHIVES=1
# the line ends with the image's OCI archive (for `ctr images import`), written under the build lock: another
# worktree's build of the same image may remove this reference from buildah's storage right after.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${BOOKFLEET_IMAGE_DIR:-$HOME/.cache/bookfleet/images}"
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,ca-certificates
MIRROR=http://deb.debian.org/debian
for tool in buildah debootstrap; do
    command -v "$tool" >/dev/null 2>&1 || { echo "build-images: $tool is not installed" >&2; exit 3; }
done
[[ "$(id -u)" -eq 0 ]] || { echo "build-images: debootstrap and buildah's chroot builds need root" >&2; exit 3; }
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9  # one build at a time (two test workers may ask at once); the second then finds the images built

bh() { buildah --root "$OUT/storage" --runroot "$OUT/run" --storage-driver overlay "$@"; }
exists() { bh inspect --type image "$1" >/dev/null 2>&1; }
digest() { sha256sum | cut -c1-12; }
archive() {  # archive <name> <image>: " <path of its OCI archive>" (made if missing, older ones removed) if asked
    [[ "${BOOKFLEET_IMAGE_ARCHIVES:-}" == 1 ]] || return 0
    local path="$OUT/archives/$1-${2##*:}.tar"
    if [[ ! -f "$path" ]]; then
        mkdir -p "$OUT/archives"
        find "$OUT/archives" -name "$1-*" -delete
        bh push --quiet "$2" "oci-archive:$path.partial:$2" >&2
        mv "$path.partial" "$path"
    fi
    echo " $path"
}

BASE_HASH="$(echo "$SUITE $BASE_PACKAGES $MIRROR minbase slim" | digest)"
BASE="localhost/bookfleet/base:$SUITE-$BASE_HASH"
if ! exists "$BASE"; then
    started=$SECONDS
    echo "build-images: making the base $BASE with debootstrap ..." >&2
    work="$OUT/tmp"
    rm -rf "$work" && mkdir -p "$work/rootfs"
    nice -n 10 debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$work/rootfs" "$MIRROR" >&2
    # What a slim base leaves out: apt's caches and lists, documentation, manuals, translations.
    rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/cache/apt/*.bin "$work"/rootfs/var/lib/apt/lists/* \
        "$work"/rootfs/usr/share/{doc,man,info,locale}/*
    tar --numeric-owner -C "$work/rootfs" -cf "$work/rootfs.tar" .
    container="$(bh from scratch)"
    bh add "$container" "$work/rootfs.tar" / >/dev/null
    bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$container"
    bh commit --rm "$container" "$BASE" >/dev/null
    rm -rf "$work"
    bh images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/bookfleet/base:' | grep -vx "$BASE" \
        | xargs -r buildah --root "$OUT/storage" --runroot "$OUT/run" --storage-driver overlay rmi >/dev/null || true
    echo "build-images: base made in $((SECONDS - started)) s" >&2
fi

# pip in the build trusts what this machine trusts (a TLS-inspecting proxy's CA is in the system bundle only).
CA=/etc/ssl/certs/ca-certificates.crt
lend_ca=()
[[ -f "$CA" ]] && lend_ca=(--volume "$CA:/run/bookfleet-ca.crt:ro" --build-arg PIP_CERT=/run/bookfleet-ca.crt)

declare -A DOCKERFILE=([bookie]=bookie-image/Dockerfile [operator]=operator/Dockerfile [repair]=repair-image/Dockerfile
                       [zookeeper]=tests/cluster/images/zookeeper.Dockerfile)
# What each build context's COPY lines read (the product images: the package; the local ZooKeeper: its two scripts).
PRODUCT_INPUTS="pyproject.toml setup.py README.md constraints.txt bookfleet repair-image/entrypoint.sh"
declare -A INPUTS=([bookie]=$PRODUCT_INPUTS [operator]=$PRODUCT_INPUTS [repair]=$PRODUCT_INPUTS
                   [zookeeper]="tests/cluster/images/zookeeper-entrypoint.sh tests/cluster/images/zookeeper-bin")
names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(bookie operator repair)
cd "$ROOT"
for name in "${names[@]}"; do
    if [[ "$name" == pause ]]; then
        hash="$(cat hack/pause/main.go hack/pause/go.mod | digest)"
        image="localhost/bookfleet/pause:$hash"
        if ! exists "$image"; then
            work="$OUT/tmp-pause"
            rm -rf "$work" && mkdir -p "$work"
            (cd hack/pause && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/pause" .)
            container="$(bh from scratch)"
            bh copy "$container" "$work/pause" /pause >/dev/null
            bh config --entrypoint '["/pause"]' --user 65535:65535 "$container"
            bh commit --rm "$container" "$image" >/dev/null
            rm -rf "$work"
            echo "build-images: pause built" >&2
        fi
        echo "pause $image$(archive pause "$image")"
        continue
    fi
    context=.
    if [[ "$name" == pulsar ]]; then
        # Its context is the broker's jars (about 250 MB, outside the clone), staged as hard links beside the images
        # when it is built; its hash is the Dockerfile's and the jars' names (each carries its version).
        dockerfile=pulsar-image/Dockerfile
        lib="$(bash scripts/build-pulsar.sh | tail -n 1)/lib"
        hash="$( (echo "$BASE"; cat "$dockerfile" "$lib.version"; ls "$lib") | digest)"
        context="$OUT/tmp-pulsar"
    else
        dockerfile="${DOCKERFILE[$name]:?unknown image $name}"
        # What the build context sends (.dockerignore) and the Dockerfile: tracked and untracked, never ignored files.
        mapfile -t inputs < <(git ls-files -co --exclude-standard -- "$dockerfile" ${INPUTS[$name]} | sort)
        hash="$( (echo "$BASE"; sha256sum "${inputs[@]}") | digest)"
    fi
    image="localhost/bookfleet/$name:$hash"
    if exists "$image"; then
        echo "build-images: $image already built" >&2
    else
        started=$SECONDS
        echo "build-images: building $image ..." >&2
        if [[ "$name" == pulsar ]]; then
            rm -rf "$context" && mkdir -p "$context"
            cp -al "$lib" "$context/lib" 2>/dev/null || cp -a "$lib" "$context/lib"
        fi
        nice -n 10 buildah --root "$OUT/storage" --runroot "$OUT/run" --storage-driver overlay bud --quiet \
            --layers --isolation chroot --build-arg "BASE=$BASE" "${lend_ca[@]}" -f "$dockerfile" -t "$image" \
            "$context" >&2
        [[ "$context" == . ]] || rm -rf "$context"
        echo "build-images: $name built in $((SECONDS - started)) s" >&2
        # Older builds of this image go; the layer cache stays for the next source change.
        bh images --format '{{.Name}}:{{.Tag}}' | grep "^localhost/bookfleet/$name:" | grep -v ":$hash\$" \
            | xargs -r buildah --root "$OUT/storage" --runroot "$OUT/run" --storage-driver overlay rmi >/dev/null \
            || true
    fi
    echo "$name $image$(archive "$name" "$image")"
done
