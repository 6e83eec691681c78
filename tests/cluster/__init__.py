"""A local Kubernetes cluster without Docker: the real control plane built from Go modules, real kubelets on
containerd (a process kubelet where containerd cannot run)."""
