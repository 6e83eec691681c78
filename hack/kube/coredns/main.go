// Command coredns is CoreDNS with only what the local cluster's real node needs: cluster.local answered from the
// API server's Services and EndpointSlices (the kubernetes plugin), as kubeadm's and kind's clusters answer it. The
// module's own main links every plugin, cloud DNS providers included; this one links two.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

func init() {
	dnsserver.Directives = []string{"errors", "kubernetes"}
}

func main() {
	coremain.Run()
}
