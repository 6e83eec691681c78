"""`make cluster-demo`: the README walkthrough on the local cluster, narrated step by step, ending with `healthy:`."""

from __future__ import annotations

import sys
import time

from tests.cluster import walkthrough

ENTRIES = 100


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def main() -> int:
    say("building (once per version) and starting the local cluster: etcd, kube-apiserver, "
        "kube-controller-manager, kube-scheduler, three process nodes ...")
    with walkthrough.running_cluster() as cluster:
        say(f"cluster up; KUBECONFIG={cluster.kubeconfig}")
        say("helm install charts/bookfleet (with its ZooKeeper) into namespace bookfleet, which enforces the "
            "restricted Pod Security Standard; kubectl apply -f examples/; waiting for three Ready bookies ...")
        walkthrough.install(cluster)
        for pod in walkthrough.bookie_pods(cluster):
            say(f"bookie {pod['metadata']['name']} Running on {pod['spec']['nodeName']} at {pod['status']['podIP']}")
        say(f"writing {ENTRIES} entries to the example Ledger (E=3, Qw=3, Qa=2) from a client pod ...")
        closed = walkthrough.write_entries(cluster, ENTRIES)
        ledger_id = closed["ledgerId"]
        say("scaling to 4 bookies: the lost bookie's replicas need a bookie outside the ledger's ensemble")
        walkthrough.scale(cluster, 4)
        victim = closed["segments"][0]["bookies"][0].split(".")[0]
        say(f"ledger {ledger_id} closed at entry {closed['lastEntryId']}; deleting bookie pod {victim} and its PVCs")
        lost_at = time.monotonic()
        walkthrough.lose_bookie(cluster, victim, delay_seconds=5)
        say("waiting for the operator's repair Job and the Spark executor pods it starts ...")
        repair = walkthrough.watch_repair(cluster, say)
        if repair.outcome != "Complete":
            say(f"repair Job {repair.job} {repair.outcome}")
            return 1
        healthy = walkthrough.healthy_ledger(cluster)
        seconds = time.monotonic() - lost_at
        say(f"ledger {ledger_id} fully replicated again on {healthy['segments'][-1]['bookies']}; reading back ...")
        payloads = walkthrough.read_entries(cluster, ledger_id)
        if payloads != [f"{i:08d}" for i in range(ENTRIES)]:
            say(f"read back {len(payloads)} entries, not the {ENTRIES} written")
            return 1
        print(f"healthy: ledger {ledger_id}, {ENTRIES}/{ENTRIES} entries read back, repaired by Job {repair.job} "
              f"with executors {', '.join(repair.executors)}, {seconds:.0f} s from pod deletion to healthy",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
