"""What a failed cluster run keeps for reading: its logs, not its volumes and images (GBs a run)."""

from __future__ import annotations

from pathlib import Path

from tests.cluster import walkthrough

KEPT = ("logs/kube-apiserver.log", "kubeconfig", "pki/ca.crt", "pods/uid-1/bookie.log", "nodes/node-a/logs/kubelet.log",
        "nodes/node-a/kubelet.yaml", "nodes/node-a/pod-logs/bookfleet_demo-0_uid-2/bookie/0.log")
DROPPED = ("etcd/member/snap/db", "volumes/pvc-1/entrylog-1.log", "pods/uid-1/volumes/scratch/fill",
           "nodes/node-a/containerd/root/io.containerd.content.v1.content/blobs/sha256/layer",
           "nodes/node-a/kubelet/pods/uid-2/volumes/kubernetes.io~empty-dir/scratch/fill")


def test_a_kept_cluster_state_keeps_its_logs_and_configs_and_drops_volumes_images_and_etcd(tmp_path: Path):
    for name in KEPT + DROPPED:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    walkthrough.drop_bulk(tmp_path)
    assert sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*") if path.is_file()) == sorted(KEPT)
