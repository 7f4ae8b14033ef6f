//go:build tools

// Package tools pins the etcd server used by the e2e tests. It is built by
// e2e/build-tools.sh; nothing imports this package.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
