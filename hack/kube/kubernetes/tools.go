//go:build tools

// Package kubebin pins the Kubernetes control-plane commands the cluster test tier builds.
package kubebin

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
