//go:build tools

// Package etcdbin pins the etcd server the cluster test tier builds.
package etcdbin

import _ "go.etcd.io/etcd/server/v3"
