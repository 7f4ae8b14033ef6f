// Command coredns is CoreDNS with only the plugins the e2e node's cluster
// DNS uses (the kubernetes zone, cache, health/ready, logs), so it builds in
// a fraction of the time the full plugin set takes. e2e/build-tools.sh builds
// it; e2e/cluster.sh runs it on the node's bridge address.
package main

import (
	"github.com/coredns/coredns/coremain"

	// Plugins, registered by their init functions. The order they run in
	// is CoreDNS's own (core/dnsserver/zdirectives.go), not this list's.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
