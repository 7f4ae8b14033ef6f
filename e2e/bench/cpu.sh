#!/usr/bin/env bash
# Proxy CPU time per request for sidecar builds side by side, with nginx as
# the peer: the A/B behind a change whose effect is smaller than run.sh's
# round-to-round spread (scenario 1 moves 2-3% between rounds here).
#
#   bash e2e/bench/cpu.sh BINARY...           # after run.sh --install-only
#   ROUNDS=8 REQUESTS=200000 bash e2e/bench/cpu.sh old/reprise-sidecar new/reprise-sidecar
#
# Method: each system runs alone on CPU 0 (one worker, the benchmark's
# configuration files), h2load --h1 and the nginx upstream on CPU 1, all at
# nice -20 as in run.sh. Per round and system: 20,000 requests to warm up,
# then REQUESTS requests over 50 keep-alive connections; the CPU the proxy's
# main thread spent meanwhile (/proc/PID/schedstat, nanoseconds: user and
# kernel) divided by the requests. The order of the systems is reversed every
# other round, so no build always runs first. Prints each round, then the
# median per system, its ratio to nginx's and to the first build's, and in
# how many rounds it used no more CPU than each of them in the same round.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONF="$BENCH_DIR/configs"
N="${REQUESTS:-200000}"
ROUNDS="${ROUNDS:-6}"
(($#)) || { sed -n '2,8p' "$0" >&2; exit 2; }
for tool in h2load nginx curl; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run 'bash e2e/bench/run.sh --install-only'" >&2; exit 1; }
done
for bin in "$@"; do
  [ -x "$bin" ] || { echo "not an executable: $bin" >&2; exit 1; }
done
WORK="$(mktemp -d /tmp/reprise-cpu.XXXXXX)"
chmod 755 "$WORK"
mkdir -p "$WORK/upstream" "$WORK/nginx"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

nice -n -20 taskset -c 1 nginx -p "$WORK/upstream/" -e stderr -c "$CONF/nginx-upstream.conf" 2>"$WORK/upstream.log" &
for _ in $(seq 100); do curl -fso /dev/null -H 'Host: bench' http://127.0.0.1:18080/ && break; sleep 0.1; done

# measure LABEL PORT CMD...: prints "LABEL ns-per-request req/s".
measure() {
  local label=$1 port=$2
  shift 2
  nice -n -20 taskset -c 0 "$@" >"$WORK/$label.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do curl -fso /dev/null -H 'Host: bench' "http://127.0.0.1:$port/" && break; sleep 0.1; done
  nice -n -20 taskset -c 1 h2load --h1 -n 20000 -c 50 -H ':authority: bench' "http://127.0.0.1:$port/" >/dev/null || true
  local before after out
  before=$(awk '{print $1}' "/proc/$pid/schedstat")
  out=$(nice -n -20 taskset -c 1 h2load --h1 -n "$N" -c 50 -H ':authority: bench' "http://127.0.0.1:$port/") || true
  after=$(awk '{print $1}' "/proc/$pid/schedstat")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  grep -q "$N succeeded" <<<"$out" || { echo "h2load through $label failed" >&2; return 1; }
  echo "$label $(( (after - before) / N )) $(awk '/^finished in/ {print $4}' <<<"$out")"
}

systems=()
for i in $(seq "$#"); do systems+=("reprise-$i"); done
systems+=(nginx)
run_system() {
  local name=$1
  if [ "$name" = nginx ]; then
    measure nginx 17004 nginx -p "$WORK/nginx/" -e stderr -c "$CONF/nginx-proxy.conf" -g 'master_process off;'
  else
    local bin=${BINS[${name#reprise-}]}
    TOKIO_WORKER_THREADS=1 REPRISE_LOG=warn measure "$name" 17001 "$bin" \
      --config "$CONF/reprise.yaml" --listen 127.0.0.1:17001 --admin 127.0.0.1:17101
  fi
}
BINS=("" "$@")
for i in $(seq "$#"); do echo "reprise-$i = ${BINS[$i]}"; done
echo "round system ns/request req/s"
for r in $(seq "$ROUNDS"); do
  order=("${systems[@]}")
  if ((r % 2 == 0)); then
    order=()
    for ((i = ${#systems[@]} - 1; i >= 0; i--)); do order+=("${systems[$i]}"); done
  fi
  for s in "${order[@]}"; do
    row=$(run_system "$s") || exit 1
    echo "$r $row"
  done
done | tee "$WORK/rounds"
python3 - "$WORK/rounds" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l[0].isdigit()]
by = {}
for r, name, ns, _ in rows:
    by.setdefault(name, {})[r] = int(ns)
nginx, first = by.get("nginx", {}), by.get("reprise-1", {})
print("\n| system | CPU ns / request, median | ÷ nginx | rounds at most nginx's | ÷ reprise-1 | rounds at most reprise-1's |")
print("|---|---|---|---|---|---|")
for name, rounds in by.items():
    med = statistics.median(rounds.values())
    cells = []
    for peer in (nginx, first):
        cells.append(f"{med / statistics.median(peer.values()):.3f}×")
        cells.append(f"{sum(1 for r, v in rounds.items() if v <= peer[r])}/{len(rounds)}")
    print(f"| {name} | {med:,.0f} | " + " | ".join(cells) + " |")
PY
