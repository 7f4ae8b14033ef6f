#!/usr/bin/env bash
# The quick-start demo, in Kubernetes: starts a local cluster with a real node
# (e2e/cluster.sh: control plane, kubelet, containerd, CNI, kube-proxy,
# CoreDNS; the first run builds them from their Go modules and installs the
# node's Debian packages), builds the images and loads them into the node
# (e2e/images.sh), then `helm install`s the chart with a Jaeger pod, runs a
# Service whose three pods include one failing half its requests and a client
# pod that gets the sidecar injected, applies a RetryPolicy with kubectl,
# sends traffic, prints requests, retries, recovered and exhausted, a
# recovered request's log line and its trace read back from Jaeger, then,
# once the leader has written status.traffic (at most once a minute),
# `kubectl get rp` and `kubectl reprise stat`.
# Ctrl-C (or the end) stops everything it started.
#
#   bash e2e/demo.sh               the Kubernetes demo (root: the node needs it)
#   bash e2e/demo.sh --standalone  the sidecar alone, from a YAML file, no Kubernetes
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--standalone" ]]; then
  cargo build --release --quiet -p reprise-sidecar -p reprise-e2e
  exec target/release/reprise-demo
fi

for tool in go kubectl curl openssl python3; do
  command -v "$tool" >/dev/null || { echo "demo: $tool is required (see the README's quick start)" >&2; exit 1; }
done
[[ $EUID -eq 0 ]] || { echo "demo: the node (bridge, iptables, containerd) needs root" >&2; exit 1; }
echo "== building the demo"
cargo build --quiet --bin reprise-k8s-demo -p reprise-e2e
# Its last step shows `kubectl reprise stat`.
cargo build --quiet --bin kubectl-reprise -p reprise-controller

dir="$(mktemp -d /tmp/reprise-demo.XXXXXX)"
cleanup() {
  bash e2e/cluster.sh down "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== starting the control plane, Jaeger and a node (kubelet, containerd, kube-proxy, CoreDNS, Prometheus)"
echo "   (the first run builds them from their Go modules: see $dir/up.log)"
if ! bash e2e/cluster.sh up --fresh "$dir" >"$dir/env" 2>"$dir/up.log"; then
  tail -20 "$dir/up.log" >&2
  exit 1
fi
echo "== building the images (release, static) and importing them into the node (log: $dir/images.log)"
if ! bash e2e/images.sh "$dir" >"$dir/images.log" 2>&1; then
  tail -20 "$dir/images.log" >&2
  exit 1
fi
# shellcheck disable=SC1091
source "$dir/env"
# shellcheck disable=SC1090
source "$(bash e2e/build-tools.sh --env-file 2>/dev/null)"
export HELM
PATH="$(dirname "$HELM"):$PATH" REPRISE_E2E_KUBECONFIG="$KUBECONFIG" target/debug/reprise-k8s-demo
