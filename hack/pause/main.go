// The pod sandbox's pause process for the local cluster's real nodes: holds the pod's namespaces and exits on
// SIGTERM or SIGINT (PID 1 gets no default signal handlers). Built static, into a FROM-scratch image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
