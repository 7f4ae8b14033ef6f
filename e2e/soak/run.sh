#!/usr/bin/env bash
# The soak test: mixed GET/POST/PUT traffic at a fixed rate through the real
# reprise-sidecar (release build) for SECONDS (default 600), in front of three
# loopback endpoints whose faults change over time (503s; a listener closed and
# reopened; resets, mid-body aborts and stalls), with two config rewrites, one
# SIGHUP and one restart (SIGTERM, drain, start again) along the way. Prints a
# summary table and exits non-zero if a POST reached an endpoint twice, a
# request failed in a way the retry policy does not explain, a request was lost
# to the restart, or the sidecar's RSS grew more than 20% (open fds by more
# than 20) after warm-up. Everything listens on 127.0.0.1.
#
#   bash e2e/soak/run.sh          # 600 s at 200 req/s
#   bash e2e/soak/run.sh 120      # a short run
#   SOAK_RATE=100 bash e2e/soak/run.sh 300
#
# The summary is also written to e2e/soak/results/; the sidecar's logs and
# stderr stay in a temporary directory (printed at the start), removed after a
# passing run unless SOAK_KEEP=1.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-600}"
rate="${SOAK_RATE:-200}"
target="${CARGO_TARGET_DIR:-$PWD/target}"

echo "== building reprise-sidecar and reprise-soak (release)"
cargo build --release --quiet -p reprise-sidecar -p reprise-e2e

out="$(mktemp -d /tmp/reprise-soak.XXXXXX)"
mkdir -p e2e/soak/results
summary="e2e/soak/results/$(date -u +%Y-%m-%d-%H%M)-${secs}s.txt"
set +e
"$target/release/reprise-soak" --duration "$secs" --rate "$rate" --out "$out" --summary "$summary"
rc=$?
set -e
if [[ -s "$summary" ]]; then
  echo "== summary written to $summary"
fi
if [[ $rc -eq 0 && "${SOAK_KEEP:-0}" != "1" ]]; then
  rm -rf "$out"
else
  echo "== sidecar logs kept in $out"
fi
exit $rc
