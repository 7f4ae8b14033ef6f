#!/usr/bin/env bash
# The test command: formatting, lints, every unit and integration test, then
# the end-to-end tests against a real local control plane (e2e/cluster.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "cargo is required (https://rustup.rs); this machine kind ships it" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo deny (licences, bans, sources)"
bash e2e/deny.sh
if [ "${REPRISE_FUZZ_SECONDS:-15}" != 0 ]; then
  echo "== fuzz smoke (${REPRISE_FUZZ_SECONDS:-15} s per target)"
  # Fuzz builds are kept outside the clone so reruns on this machine reuse them.
  CARGO_TARGET_DIR="${REPRISE_FUZZ_TARGET_DIR:-$HOME/.cache/reprise-fuzz-target}" \
    bash fuzz/run.sh "${REPRISE_FUZZ_SECONDS:-15}"
fi
echo "== cargo test"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

cargo test --workspace --locked 2>&1 | tee "$log"

# End to end: a real etcd, kube-apiserver, kube-controller-manager and Jaeger
# and a real node (containerd, runc, CNI, kubelet, kube-proxy, kube-scheduler,
# CoreDNS, Prometheus), built from their Go modules or installed from Debian's
# packages (cached under ~/.cache/reprise-tools; a bare machine builds them
# first: figures in e2e/tools/README.md). REPRISE_E2E_API_ONLY=1 skips the
# node (and the tests that need it).
if ! command -v kubectl >/dev/null; then
  echo "kubectl is required for the end-to-end tests (apt-get install kubectl, or build k8s.io/kubernetes/cmd/kubectl from e2e/tools)" >&2
  exit 1
fi
up_args=(--fresh)
skip=()
[ "${REPRISE_E2E_API_ONLY:-0}" = 1 ] || unset REPRISE_E2E_API_ONLY
if [ "${REPRISE_E2E_API_ONLY:-0}" = 1 ]; then
  up_args+=(--api-only)
  skip=(--skip node::)
fi
e2e_dir="$(mktemp -d /tmp/reprise-e2e-test.XXXXXX)"
cleanup() { bash e2e/cluster.sh down "$e2e_dir" >/dev/null 2>&1 || true; rm -f "$log"; }
trap cleanup EXIT
echo "== e2e: local cluster (${up_args[*]})"
t_up=$SECONDS
bash e2e/cluster.sh up "${up_args[@]}" "$e2e_dir" >"$e2e_dir.env"
echo "   cluster up in $((SECONDS - t_up)) s"
# KUBECONFIG, JAEGER_QUERY, OTEL_EXPORTER_OTLP_ENDPOINT of this cluster, and
# with the node REPRISE_E2E_NODE, PROMETHEUS_URL, CONTAINERD_ADDRESS.
# shellcheck disable=SC1090
source "$e2e_dir.env"
rm -f "$e2e_dir.env"
if [ "${REPRISE_E2E_API_ONLY:-0}" != 1 ]; then
  echo "== e2e: images (release, static), imported into the node"
  t_img=$SECONDS
  bash e2e/images.sh "$e2e_dir"
  echo "   images in $((SECONDS - t_img)) s"
fi
echo "== e2e: tests"
cargo build --workspace --bins --locked
# HELM and the other tool paths (already built by `cluster.sh up`).
# shellcheck disable=SC1090
source "$(bash e2e/build-tools.sh --env-file ${REPRISE_E2E_API_ONLY:+--api-only})"
export HELM
echo "== chart: lint, render every documented combination, schema refusals"
bash charts/test.sh
REPRISE_E2E_KUBECONFIG="$e2e_dir/kubeconfig" cargo test -p reprise-e2e --test cluster --locked -- --ignored --test-threads=1 "${skip[@]}" 2>&1 | tee -a "$log"

# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "total: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
