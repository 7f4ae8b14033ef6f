//go:build tools

// Package tools pins crictl, which e2e/cluster.sh uses to stop and remove
// the node's pod sandboxes through the CRI on `down` (so the CNI plugins
// release their addresses and network namespaces). It is built by
// e2e/build-tools.sh; nothing imports this package.
package tools

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
