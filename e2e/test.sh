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
# Debian packages are installed when missing (e2e/lib/apt.sh); jemalloc needs make.
source e2e/lib/apt.sh
need_make || exit 1
t_start=$SECONDS
# The node's Go tools and the images' static release binaries build in the
# background, at the lowest priority, while the Rust checks and tests run:
# on 2 cores those leave a core idle much of the time (test runs, linking),
# and the cold Go builds are the longest part
# of a run on a bare machine. Its own process group, so that an early exit
# stops it.
prebuild_pid=""
prebuild_log="$(mktemp)"
stop_prebuild() { if [ -n "$prebuild_pid" ]; then kill -TERM -- "-$prebuild_pid" 2>/dev/null || true; fi; }
trap 'stop_prebuild; rm -f "$prebuild_log"' EXIT
if [ "${REPRISE_E2E_API_ONLY:-0}" != 1 ]; then
  setsid bash -c 'nice -n 19 bash e2e/build-tools.sh >/dev/null && nice -n 19 bash e2e/build-tools.sh --docs-only >/dev/null && nice -n 19 bash e2e/images.sh --binaries' \
    >"$prebuild_log" 2>&1 </dev/null &
  prebuild_pid=$!
  echo "== background: e2e/build-tools.sh (the Go tools, then the docs tools) and e2e/images.sh --binaries (pid $prebuild_pid, nice 19)"
fi
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo deny (licences, bans, sources)"
bash e2e/deny.sh
# The fuzz targets' committed corpus is replayed by `cargo test` below
# (fuzz/checks). libFuzzer itself runs only when asked: its sanitizer build
# of the sidecar took 25 minutes of a cold CI run on 2 cores, a third of the
# time allowed (docs/src/development/fuzzing.md).
if [ "${REPRISE_FUZZ_SECONDS:-0}" != 0 ]; then
  echo "== fuzz smoke (${REPRISE_FUZZ_SECONDS} s per target)"
  # Fuzz builds are kept outside the clone so reruns on this machine reuse them.
  CARGO_TARGET_DIR="${REPRISE_FUZZ_TARGET_DIR:-$HOME/.cache/reprise-fuzz-target}" \
    bash fuzz/run.sh "${REPRISE_FUZZ_SECONDS}"
fi
echo "== grpcio for the gRPC interoperability tests"
REPRISE_GRPC_PYTHON="$(bash e2e/python-grpc.sh)"
export REPRISE_GRPC_PYTHON
# The transparent-mode tests (sidecar/tests/transparent) build network
# namespaces with `ip`, install rules with iptables/ip6tables (nft and
# legacy) and run Node's fetch as a client; the differential tests
# (sidecar/tests/differential.rs) compare the sidecar's HTTP/1 framing with
# nginx's and HAProxy's (under CI a missing one fails them). Debian's
# packages, installed when missing, as root (without root the transparent-mode
# tests skip and say so).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  PATH="$PATH:/usr/sbin:/sbin" command -v ip >/dev/null || need+=(iproute2)
  PATH="$PATH:/usr/sbin:/sbin" command -v iptables-legacy >/dev/null || need+=(iptables)
  [ -x /usr/bin/node ] || [ -x /usr/local/bin/node ] || need+=(nodejs)
  PATH="$PATH:/usr/sbin:/sbin" command -v nginx >/dev/null || need+=(nginx)
  PATH="$PATH:/usr/sbin:/sbin" command -v haproxy >/dev/null || need+=(haproxy)
  apt_install "the transparent-mode and differential tests" "${need[@]}" || exit 1
  export PATH="$PATH:/usr/sbin:/sbin"
fi
echo "== cargo test"
log="$(mktemp)"
trap 'stop_prebuild; rm -f "$log" "$prebuild_log"' EXIT

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
cleanup() {
  local rc=$?
  stop_prebuild
  bash e2e/cluster.sh down "$e2e_dir" >/dev/null 2>&1 || true
  rm -f "$log" "$prebuild_log"
  # The cluster's state (etcd, containerd's snapshots and images, logs: about
  # 300 MB) is kept after a failure for its logs and removed after a pass,
  # never while anything is still mounted beneath it.
  if [ "$rc" != 0 ]; then
    echo "the cluster's state and logs are kept in $e2e_dir" >&2
  elif command -v findmnt >/dev/null && ! findmnt -rn -o TARGET | grep -q "^$e2e_dir/"; then
    rm -rf --one-file-system "$e2e_dir"
  fi
}
trap cleanup EXIT
if [ -n "$prebuild_pid" ]; then
  echo "== e2e: waiting for the background builds ($((SECONDS - t_start)) s into the run)"
  t_wait=$SECONDS
  if ! wait "$prebuild_pid"; then
    prebuild_pid=""
    tail -n 40 "$prebuild_log" >&2
    echo "background build of the tools or the image binaries failed (log above)" >&2
    exit 1
  fi
  prebuild_pid=""
  grep -E 'built in|all tools cached|binaries built' "$prebuild_log" | sed 's/^/   /' || true
  echo "   waited $((SECONDS - t_wait)) s"
fi
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
# The binaries the end-to-end tests run (target/debug) were built by the
# workspace's cargo test above, for its integration tests. Every cargo call
# below selects --workspace too: with -p one package's features resolve
# differently (dev-dependencies unify only across the selection), which
# recompiled tokio, hyper and tonic each time (about 5 minutes of a run).
# HELM, PROMTOOL and the other tool paths (already built by `cluster.sh up`).
# shellcheck disable=SC1090
source "$(bash e2e/build-tools.sh --env-file ${REPRISE_E2E_API_ONLY:+--api-only})"
export HELM
# The OTLP-over-TLS tests need Jaeger, built now (JAEGER is set; a missing
# binary fails them): ignored by the workspace run above.
echo "== OTLP over TLS to Jaeger (telemetry/tests/otlp_tls.rs)"
cargo test --workspace --test otlp_tls --locked -- --ignored 2>&1 | tee -a "$log"
echo "== docs: the user guide built with mdBook, every link checked offline (docs/build.sh)"
bash docs/build.sh
echo "== chart: lint, render every documented combination, schema refusals, promtool on the alerts"
bash charts/test.sh
REPRISE_E2E_KUBECONFIG="$e2e_dir/kubeconfig" cargo test --workspace --test cluster --locked -- --ignored --test-threads=1 "${skip[@]}" 2>&1 | tee -a "$log"

echo "== e2e done, $((SECONDS - t_start)) s since the start of the run"
# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "total: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
