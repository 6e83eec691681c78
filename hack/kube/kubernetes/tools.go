//go:build tools

// Package kubebin pins the Kubernetes commands the cluster test tier builds: the control plane, and the kubelet
// and kube-proxy of a real node.
package kubebin

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
