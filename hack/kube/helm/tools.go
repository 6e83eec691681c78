//go:build tools

// Package helmbin pins the helm command the cluster test tier builds.
package helmbin

import _ "helm.sh/helm/v3/cmd/helm"
