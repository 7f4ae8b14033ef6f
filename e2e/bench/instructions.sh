#!/usr/bin/env bash
# User-space instructions per proxied request, counted by valgrind's callgrind,
# for Reprise, HAProxy, nginx and the bare-forwarder ceilings, with the ratio
# to nginx. Unlike req/s on a shared VM (which moves by 15% between rounds),
# the count varies by well under 1% from run to run, so it shows small changes.
#
#   bash e2e/bench/instructions.sh            # after run.sh has installed and built
#   REQUESTS=4000 bash e2e/bench/instructions.sh
#   H2C_REQUESTS=0 bash e2e/bench/instructions.sh   # skip the h2c rows
#   REPRISE_SIDECAR=/path/to/old/reprise-sidecar ONLY=reprise,reprise-h2c,nginx \
#     bash e2e/bench/instructions.sh                # another build (a before figure)
#
# Rows with a deadline that travels (issue 55): reprise+deadline (a rule's
# total deadline, which each attempt carries on in baggage) and
# reprise+baggage (each request comes with the application's baggage and a
# reprise-deadline entry half an hour ahead, which the sidecar reads and
# passes on unchanged).
#
# Method: each proxy runs under callgrind with one worker; h2load --h1 sends
# N and then 3N requests (one keep-alive connection, so the event loop's
# batching cannot vary between runs; Host: bench; the same
# configuration files as run.sh) through it to nginx serving a 128-byte body;
# (total(3N) - total(N)) / 2N leaves out start-up and shutdown. Envoy and
# Traefik are left out: under valgrind they take minutes to start.
# The h2c rows follow scenario 7's path: h2load with 4 connections x 64
# streams of h2c prior knowledge (Host: h2) through Reprise, HAProxy and the
# h2 bare forwarder (e2e/src/bin/bench-bare-forwarder-h2.rs) to
# HAProxy answering over h2c, N2 and 3 N2 requests (H2C_REQUESTS, 10,000 by
# default: with 256 streams in flight, fewer leave the count dominated by
# how the first batches happen to fall).
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${REPRISE_BENCH_CACHE:-$HOME/.cache/reprise-bench}"
CONF="$BENCH_DIR/configs"
N="${REQUESTS:-2000}"
N2="${H2C_REQUESTS:-10000}"
SIDECAR="${REPRISE_SIDECAR:-$CACHE/target/release/reprise-sidecar}"
WORK="$(mktemp -d /tmp/reprise-instructions.XXXXXX)"
chmod 755 "$WORK"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

for tool in valgrind h2load nginx haproxy curl; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run 'bash e2e/bench/run.sh --install-only' (as root for apt-get)" >&2; exit 1; }
done
[ -x "$SIDECAR" ] || { echo "missing $SIDECAR: run 'bash e2e/bench/run.sh --install-only'" >&2; exit 1; }
for bin in bench-bare-forwarder bench-bare-forwarder-h2; do
  [ -x "$CACHE/target/release/$bin" ] || { echo "missing $CACHE/target/release/$bin: run 'bash e2e/bench/run.sh --install-only'" >&2; exit 1; }
done

mkdir -p "$WORK/upstream" "$WORK/nginx"
nginx -p "$WORK/upstream/" -e stderr -c "$CONF/nginx-upstream.conf" 2>"$WORK/upstream.log" &
for _ in $(seq 100); do curl -fso /dev/null -H 'Host: bench' http://127.0.0.1:18080/ && break; sleep 0.1; done

# total_instructions PORT REQUESTS -- CMD...: runs CMD under callgrind, sends
# REQUESTS through PORT, stops it, prints the program's total instruction count.
total_instructions() {
  local port=$1 requests=$2 out="$WORK/callgrind.out"
  shift 3
  rm -f "$out"*
  valgrind --tool=callgrind --callgrind-out-file="$out" "$@" >/dev/null 2>"$WORK/valgrind.log" &
  local pid=$!
  local probe=(-H 'Host: bench')
  [ "${LOAD:-h1}" = h2c ] && probe=(--http2-prior-knowledge -H 'Host: h2')
  for _ in $(seq 300); do curl -fso /dev/null "${probe[@]}" "http://127.0.0.1:$port/" && break; sleep 0.2; done
  local extra=()
  [ -n "${BAGGAGE:-}" ] && extra=(-H "baggage: $BAGGAGE")
  if [ "${LOAD:-h1}" = h2c ]; then
    h2load -n "$requests" -c 4 -m 64 -t 1 -H ':authority: h2' "${extra[@]}" "http://127.0.0.1:$port/"
  else
    h2load --h1 -n "$requests" -c 1 -H ':authority: bench' "${extra[@]}" "http://127.0.0.1:$port/"
  fi | grep -q "$requests succeeded" || { echo "h2load through port $port failed" >&2; kill "$pid"; return 1; }
  kill -TERM "$pid"
  sleep 2
  kill -INT "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  awk '/^(summary|totals):/ {print $2; exit}' "$out"
}

# ONLY=reprise,reprise+cel measures just those systems (default: all).
per_request() {
  local name=$1 port=$2
  shift 2
  if [ -n "${ONLY:-}" ] && [[ ",$ONLY," != *",$name,"* ]]; then return 0; fi
  local small large n="$N"
  [ "${LOAD:-h1}" = h2c ] && n="$N2"
  small=$(total_instructions "$port" "$n" -- "$@")
  large=$(total_instructions "$port" "$((3 * n))" -- "$@")
  echo "$name $(( (large - small) / (2 * n) ))"
}

{
  TOKIO_WORKER_THREADS=1 REPRISE_LOG=warn per_request reprise 17001 \
    "$SIDECAR" --config "$CONF/reprise.yaml" \
    --listen 127.0.0.1:17001 --admin 127.0.0.1:17101
  # Reprise with its default per-request access log on (to /dev/null).
  sed 's/access_log: false/access_log: true/' "$CONF/reprise.yaml" >"$WORK/reprise-log.yaml"
  TOKIO_WORKER_THREADS=1 REPRISE_LOG=info per_request "reprise+log" 17011 \
    "$SIDECAR" --config "$WORK/reprise-log.yaml" \
    --listen 127.0.0.1:17011 --admin 127.0.0.1:17111
  # Reprise with a rule whose CEL condition runs on every request.
  cat "$CONF/reprise.yaml" - >"$WORK/reprise-cel.yaml" <<'YAML'
rules:
  - id: cel
    upstreams: [bench]
    match: { cel: "request.host == 'bench' && request.path.startsWith('/')" }
    attempts: 2
YAML
  TOKIO_WORKER_THREADS=1 REPRISE_LOG=warn per_request "reprise+cel" 17031 \
    "$SIDECAR" --config "$WORK/reprise-cel.yaml" \
    --listen 127.0.0.1:17031 --admin 127.0.0.1:17131
  # Reprise with a deadline that travels: a rule's total deadline, carried
  # on in each attempt's baggage.
  cat "$CONF/reprise.yaml" - >"$WORK/reprise-deadline.yaml" <<'YAML'
rules:
  - id: deadline
    upstreams: [bench]
    total_deadline_ms: 10000
YAML
  TOKIO_WORKER_THREADS=1 REPRISE_LOG=warn per_request "reprise+deadline" 17061 \
    "$SIDECAR" --config "$WORK/reprise-deadline.yaml" \
    --listen 127.0.0.1:17061 --admin 127.0.0.1:17161
  # Reprise receiving a deadline (and two entries of the application's)
  # that it passes on unchanged.
  BAGGAGE="userId=alice,tenant=t-7,reprise-deadline=$(( $(date +%s%3N) + 1800000 ))" \
    TOKIO_WORKER_THREADS=1 REPRISE_LOG=warn per_request "reprise+baggage" 17071 \
    "$SIDECAR" --config "$CONF/reprise.yaml" \
    --listen 127.0.0.1:17071 --admin 127.0.0.1:17171
  # Reprise with a rule every request matches, as a RetryPolicy resolves
  # (string path prefix), and the same rule as a Gateway API route's rule
  # resolves (whole-element path prefix): what a route costs per request
  # against a RetryPolicy.
  cat "$CONF/reprise.yaml" - >"$WORK/reprise-rule.yaml" <<'YAML'
rules:
  - id: policy
    upstreams: [bench]
    methods: [GET, HEAD]
    match: { path_prefix: / }
    statuses: [gateway]
    acknowledge_duplicate_risk: true
    attempts: 2
YAML
  TOKIO_WORKER_THREADS=1 REPRISE_LOG=warn per_request "reprise+rule" 17041 \
    "$SIDECAR" --config "$WORK/reprise-rule.yaml" \
    --listen 127.0.0.1:17041 --admin 127.0.0.1:17141
  sed 's/match: { path_prefix: \/ }/match: { path_segment_prefix: \/ }/' "$WORK/reprise-rule.yaml" >"$WORK/reprise-route.yaml"
  TOKIO_WORKER_THREADS=1 REPRISE_LOG=warn per_request "reprise+route" 17051 \
    "$SIDECAR" --config "$WORK/reprise-route.yaml" \
    --listen 127.0.0.1:17051 --admin 127.0.0.1:17151
  per_request haproxy 17003 haproxy -db -f "$CONF/haproxy.cfg"
  per_request nginx 17004 nginx -p "$WORK/nginx/" -e stderr -c "$CONF/nginx-proxy.conf" -g 'master_process off;'
  per_request bare-forwarder 17021 "$CACHE/target/release/bench-bare-forwarder" 127.0.0.1:17021 127.0.0.1:18080
  if [ "$N2" -gt 0 ]; then
    haproxy -db -f "$CONF/haproxy-upstream-h2.cfg" 2>"$WORK/upstream-h2.log" &
    for _ in $(seq 100); do curl -so /dev/null --http2-prior-knowledge -H 'Host: h2' http://127.0.0.1:18082/ && break; sleep 0.1; done
    LOAD=h2c TOKIO_WORKER_THREADS=1 REPRISE_LOG=warn per_request reprise-h2c 17001 \
      "$SIDECAR" --config "$CONF/reprise.yaml" \
      --listen 127.0.0.1:17001 --admin 127.0.0.1:17101
    LOAD=h2c per_request haproxy-h2c 17003 haproxy -db -f "$CONF/haproxy.cfg"
    LOAD=h2c per_request bare-forwarder-h2c 17022 "$CACHE/target/release/bench-bare-forwarder-h2" 127.0.0.1:17022 127.0.0.1:18082
  fi
} >"$WORK/results"

nginx_count=$(awk '$1 == "nginx" {print $2}' "$WORK/results")
nginx_count=${nginx_count:-20465}
echo "| system | user-space instructions / request | ÷ nginx |"
echo "|---|---|---|"
while read -r name count; do
  echo "| $name | $count | $(awk -v a="$count" -v b="$nginx_count" 'BEGIN {printf "%.2f×", a / b}') |"
done <"$WORK/results"
echo
echo "callgrind, $N and $((3 * N)) requests per system (h2load --h1 -c 1), difference ÷ $((2 * N)); the -h2c rows $N2 and $((3 * N2)) (h2load -c 4 -m 64, h2c both sides; their ratio to nginx's HTTP/1 count is only a scale)."
