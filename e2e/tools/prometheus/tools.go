//go:build tools

// Package tools pins the Prometheus server used by the e2e tests and the
// promtool that charts/test.sh checks the chart's alerts with. Both are
// built by e2e/build-tools.sh (with the build tags remove_all_sd and
// enable_kubernetes_sd: Kubernetes service discovery only); nothing imports
// this package.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
