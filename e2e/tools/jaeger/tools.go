//go:build tools

// Package tools pins the Jaeger v2 binary (cmd/jaeger) used by the e2e tests.
// It is built by e2e/build-tools.sh; nothing imports this package.
package tools

import (
	_ "github.com/jaegertracing/jaeger/cmd/jaeger"
)
