#!/usr/bin/env bash
# Installs the system packages bookfleet needs (gcc and Python's headers, for the package's C extension that
# `pip install -e .` compiles; ZooKeeper; a headless JDK and Maven for the Java BookKeeper reference
# of `bookfleet bench bookkeeper`; debootstrap and buildah to build the images from their Dockerfiles; containerd, runc,
# the CNI plugins and iptables for the local cluster's real node, tests/cluster/realnode.py) when missing.
set -euo pipefail
need=()
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
[ -f "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] || need+=(python3-dev)
[ -f /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)
command -v mvn >/dev/null 2>&1 || need+=(maven)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v containerd >/dev/null 2>&1 || need+=(containerd)
command -v runc >/dev/null 2>&1 || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing ${need[*]} from apt"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
