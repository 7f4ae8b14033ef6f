//go:build tools

// Package tools pins the Helm v3 CLI used by the e2e tests. It is built by
// e2e/build-tools.sh; nothing imports this package.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
