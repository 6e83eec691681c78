"""The Kubernetes operator (kopf) and its custom resources, in layers, each importing only those below it.

- `handlers` — the kopf registrations, the operator's main module; `caches` — which kinds the operator keeps, the
  sources each reconciler reads from them, whose loop a change wakes; `crdgen` — the CRDs, generated from the models.
- `reconcilers/` — one module per kind (`bookies`: a Bookie and its pod, and what happens when it dies; `clusters`;
  `ledgers`) and what they share (`actions`, `repairs`, `certificates`, `autoscaler`, `ledgerscan`, `teardown`).
- `runtime/` — what the reconcilers run on: the API client, their context, metrics, informers, wake-ups, the Ledger
  feed.
- `resources/` — the manifests built from the custom resources; `models` — the custom resources themselves.
"""
