#!/usr/bin/env bash
# The quick-start demo, in Kubernetes: starts a local control plane and Jaeger
# (e2e/cluster.sh; the first run builds them from their Go modules, about 20
# minutes on 2 cores), the controller, a Service whose three pods include one
# failing half its requests, a client pod with its sidecar; applies a
# RetryPolicy with kubectl, sends traffic, prints requests, retries, recovered
# and exhausted, and draws one request's trace read back from Jaeger.
# Ctrl-C (or the end) stops everything it started.
#
#   bash e2e/demo.sh               the Kubernetes demo
#   bash e2e/demo.sh --standalone  the sidecar alone, from a YAML file, no Kubernetes
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--standalone" ]]; then
  cargo build --release --quiet -p reprise-sidecar -p reprise-e2e
  exec target/release/reprise-demo
fi

for tool in go kubectl curl openssl; do
  command -v "$tool" >/dev/null || { echo "demo: $tool is required (see the README's quick start)" >&2; exit 1; }
done
echo "== building reprise-controller, reprise-sidecar and the demo"
cargo build --quiet --bins -p reprise-sidecar -p reprise-controller -p reprise-e2e

dir="$(mktemp -d /tmp/reprise-demo.XXXXXX)"
cleanup() {
  bash e2e/cluster.sh down "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== starting etcd, kube-apiserver, kube-controller-manager and Jaeger on 127.0.0.1 (log: $dir/up.log)"
if ! bash e2e/cluster.sh up --fresh "$dir" >"$dir/env" 2>"$dir/up.log"; then
  tail -20 "$dir/up.log" >&2
  exit 1
fi
# shellcheck disable=SC1091
source "$dir/env"
REPRISE_E2E_KUBECONFIG="$KUBECONFIG" target/debug/reprise-k8s-demo
