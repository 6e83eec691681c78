#!/usr/bin/env bash
# The first process of a real node's PID and mount namespaces (tests/cluster/realnode.py starts it inside the node's
# network namespace): private mounts, then containerd, then - once realnode.py has imported the pause image - the
# kubelet, kube-proxy (the Services' iptables rules, in the node's namespace) and CoreDNS (the pods' nameserver). When
# it ends, the kernel ends every process of the namespace: shims and containers too.
# Usage: realnode.sh STATE BINARIES [kubelet arguments ...]
set -euo pipefail
state="$1" binaries="$2"
shift 2

# The kubelet sets these host sysctls (vm.overcommit_memory=1, kernel.panic=10, kernel.panic_on_oops=1): here it
# writes files of the node's instead.
for entry in vm/overcommit_memory kernel/panic kernel/panic_on_oops; do
    file="$state/sysctl/${entry//\//.}"
    cat "/proc/sys/$entry" > "$file"
    mount --bind "$file" "/proc/sys/$entry"
done
# containerd's shims use /run/containerd; iptables its lock in /run; the kubelet and libcni hard-code folders under
# /var/lib and /var/log: all private to the node, gone with its mount namespace.
mount -t tmpfs -o mode=0755 node-run /run
mount --bind "$state/varlog" /var/log
mkdir -p "$state/varlib"
mount -t tmpfs -o mode=0755 node-varlib "$state/varlib"
mkdir -p "$state/varlib/upper" "$state/varlib/work"
mount -t overlay -o "lowerdir=/var/lib,upperdir=$state/varlib/upper,workdir=$state/varlib/work" node-varlib /var/lib

children=()
stop() {
    kill -TERM "${children[@]}" 2>/dev/null || true
    wait || true
    exit 0
}
trap stop TERM INT

containerd --config "$state/containerd.toml" >"$state/logs/containerd.log" 2>&1 &
children+=($!)
until [[ -e "$state/start-kubelet" ]]; do
    kill -0 "${children[0]}" || exit 1
    sleep 0.2
done
"$binaries/kubelet" "$@" >"$state/logs/kubelet.log" 2>&1 &
children+=($!)
"$binaries/kube-proxy" --config "$state/kube-proxy.yaml" >"$state/logs/kube-proxy.log" 2>&1 &
children+=($!)
"$binaries/coredns" -conf "$state/Corefile" >"$state/logs/coredns.log" 2>&1 &
children+=($!)
wait -n "${children[@]}" || true
echo "realnode.sh: containerd, the kubelet, kube-proxy or CoreDNS ended; the node stops" >&2
stop
