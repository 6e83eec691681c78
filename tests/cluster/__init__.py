"""A local Kubernetes cluster without Docker: the real control plane built from Go modules, a process kubelet."""
