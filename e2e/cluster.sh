#!/usr/bin/env bash
# A throwaway Kubernetes cluster for the e2e tests and the demo: a control
# plane and Jaeger on 127.0.0.1 and, by default, one real node beside them.
# Everything runs as plain processes from the binaries e2e/build-tools.sh
# builds and caches, or from Debian's packages (installed when missing).
#
#   control plane  etcd, kube-apiserver, kube-controller-manager, Jaeger v2 (in-memory)
#   node           containerd + runc + CNI (bridge, host-local, loopback, portmap),
#                  kubelet, kube-proxy (iptables), kube-scheduler, CoreDNS (cluster DNS),
#                  apiserver-proxy (socat: the API server on the bridge, for pods),
#                  Prometheus (scrapes the controller and the sidecars)
#
# Usage:
#   e2e/cluster.sh up [--fresh] [--api-only] [DIR]   start what is not running, wait until
#                                       healthy, print the env lines (idempotent)
#   e2e/cluster.sh down [DIR]           stop what `up` started; remove the node's pods,
#                                       bridge, routes, netns, iptables chains, mounts
#   e2e/cluster.sh env [--plain] [DIR]  print the env lines
#   e2e/cluster.sh status [DIR]         which components are up (exit 0 iff all are)
#   e2e/cluster.sh import [DIR] ARCHIVE...   load OCI or Docker image archives into the
#                                       node's containerd (like `kind load image-archive`)
#   e2e/cluster/selftest.sh [DIR]       check tokens, TokenReview, EndpointSlices
#   e2e/images.sh [DIR]                 build the images the node runs and import them
#
# DIR defaults to ${REPRISE_E2E_DIR:-/tmp/reprise-e2e}. It holds pki/ (CA,
# serving and client certs, service-account keys), kubeconfig (admin,
# system:masters, certs embedded), etcd/ (data), jaeger.yaml, cluster.env (the
# mode and ports in use), logs/<name>.log, pids/<name>.pid and node/:
# containerd's root, state, socket and config, runc's state, the CNI
# configuration and IPAM data, the kubelet's root dir and pod logs, CoreDNS's
# Corefile, Prometheus's config and data. `down` keeps everything but the pid
# files and the node's pods, so a later `up` resumes the same cluster (same
# etcd data, same certs); `up --fresh` (only when nothing runs) wipes all but
# logs/ first. The mode (node or --api-only) is fixed while anything runs.
#
# Env lines (stdout; progress goes to stderr), as `export NAME=value` so that
# `eval "$(e2e/cluster.sh env)"` works; `env --plain` drops the `export `:
#   KUBECONFIG, JAEGER_QUERY (Jaeger query HTTP API base URL),
#   OTEL_EXPORTER_OTLP_ENDPOINT (OTLP/gRPC), REPRISE_E2E_OTLP_HTTP_ENDPOINT,
#   REPRISE_E2E_DIR, REPRISE_E2E_MODE (node | api-only); with a node also
#   REPRISE_E2E_NODE (its name), PROMETHEUS_URL, CONTAINERD_ADDRESS
#
# Ports (127.0.0.1 only unless said; read when `up` starts a cluster, then kept
# in DIR/cluster.env while any component runs):
#   REPRISE_E2E_ETCD_PORT=23790          etcd client      REPRISE_E2E_ETCD_PEER_PORT=23800
#   REPRISE_E2E_APISERVER_PORT=26443     kube-apiserver (and on the bridge address, for pods)
#   REPRISE_E2E_KCM_PORT=20257 (healthz) REPRISE_E2E_SCHEDULER_PORT=20259 (healthz)
#   REPRISE_E2E_OTLP_GRPC_PORT=24317     REPRISE_E2E_OTLP_HTTP_PORT=24318
#   REPRISE_E2E_JAEGER_QUERY_PORT=26686  REPRISE_E2E_JAEGER_GRPC_PORT=26685 (query gRPC)
#   REPRISE_E2E_KUBELET_PORT=20250 (on the bridge address; its healthz 20248 on 127.0.0.1)
#   REPRISE_E2E_PROXY_HEALTH_PORT=20256, REPRISE_E2E_PROXY_METRICS_PORT=20249 (kube-proxy)
#   REPRISE_E2E_DNS_HEALTH_PORT=20180    CoreDNS /health (/ready on the next port)
#   REPRISE_E2E_PROMETHEUS_PORT=29090
# The node's network (only on this machine):
#   REPRISE_E2E_BRIDGE=reprise0          the bridge; its address is the pods' gateway,
#                                        the node IP and the cluster DNS server (port 53)
#   REPRISE_E2E_POD_CIDR=10.244.0.0/24   pods (host-local IPAM; gateway = first address)
#   service CIDR 10.96.0.0/16            (the API server's; `kubernetes` is 10.96.0.1)
#   blackhole routes for 10.244.0.0/16 and 10.96.0.0/16 beneath the bridge's own,
#   forwarding enabled on the bridge only, and an iptables FORWARD chain
#   REPRISE-E2E-FORWARD that drops whatever would leave the bridge for another
#   interface: no pod or Service address can route off the machine, no pod
#   reaches anything but the node. CoreDNS serves only cluster.local (no
#   forwarding), and containerd's registries all point at 127.0.0.1:9 (images
#   are imported, never pulled).
# Other knobs: REPRISE_E2E_TIMEOUT (seconds per component start-up, default 120),
# KUBECTL (path; default: kubectl on PATH), REPRISE_E2E_KCM_CONTROLLERS,
# REPRISE_E2E_NODE_NAME (default reprise-node).
#
# The node needs root (network namespaces, bridge, iptables, cgroups, mounts)
# and the Debian packages containerd, runc, containernetworking-plugins,
# iptables, conntrack and socat: `up` installs the missing ones with apt-get.
# The kubelet runs pods under the cgroup /reprise-e2e with the cgroupfs driver
# (cgroup v1 or v2); it sets six kernel sysctls (vm.overcommit_memory,
# vm.panic_on_oom, kernel.panic, kernel.panic_on_oops, kernel.keys.root_max*)
# that `down` puts back. containerd 1.6 keeps its shim sockets in
# /run/containerd/s and the CRI its network namespaces in /run/netns, and the
# kubelet links container logs from /var/log/containers; `down` removes the
# pods first, which removes the first two, then the links.
#
# Alongside the node, `up` creates Node `local`, a stand-in for the API-only
# tests (pods as objects, containers as local processes on 127.1.x.y): status
# Ready, no kubelet, and in node mode a NoSchedule taint so that nothing is
# scheduled there. Give such Pods spec.nodeName: local (the endpointslice
# controller skips Pods whose nodeName names no Node); a test sets their
# status itself (kubectl patch pod P --subresource=status ...: phase,
# podIP/podIPs, condition Ready=True). In a new namespace wait for the
# `default` ServiceAccount (Pod admission needs it).
# Caveats of Node `local`, all from its missing kubelet or apiserver validation:
#   - A Pod with spec.nodeName: local is deleted gracefully and waits for a
#     kubelet forever (Terminating): delete it with --grace-period=0 --force (or
#     set its status.phase to Succeeded/Failed first). Namespaces holding such
#     Pods do not finish deleting until their Pods are force-deleted.
#   - The apiserver rejects loopback (127.0.0.0/8) addresses in IPv4/IPv6
#     EndpointSlices and Endpoints (hard-coded validation), so a Pod with a
#     127.x podIP never reaches an EndpointSlice (the controller reports
#     FailedToUpdateEndpointSlices); see e2e/cluster/selftest.sh.
#   - The apiserver caches successful token authentications for 10 s, so a
#     Pod-bound token still passes TokenReview up to 10 s after its Pod goes.
#   - In --api-only mode the `kubernetes` Service has no endpoints
#     (--endpoint-reconciler-type=none: its only address would be 127.0.0.1).
#     With the node it has the bridge address, so in-cluster clients work.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; }

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# apt_install: the node's Debian packages, installed when missing.
source "$E2E_DIR/lib/apt.sh"
CONTROL_PLANE=(etcd kube-apiserver kube-controller-manager jaeger)
# Start order; `down` stops them in reverse.
NODE_COMPONENTS=(containerd apiserver-proxy coredns kube-scheduler kubelet kube-proxy prometheus)
TIMEOUT="${REPRISE_E2E_TIMEOUT:-120}"

log() { printf '[cluster %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

# --- Arguments ----------------------------------------------------------------
CMD="${1:-}"
[[ -n "$CMD" ]] || {
  usage
  exit 2
}
shift
FRESH=0 PLAIN=0 WANT_MODE=node
while (($#)); do
  case "$1" in
    --fresh) [[ "$CMD" == up ]] || die "--fresh is an option of 'up'"; FRESH=1 ;;
    --api-only) [[ "$CMD" == up ]] || die "--api-only is an option of 'up'"; WANT_MODE=api-only ;;
    --plain) [[ "$CMD" == env ]] || die "--plain is an option of 'env'"; PLAIN=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
  shift
done
ARCHIVES=()
if [[ "$CMD" == import ]]; then
  # import [DIR] ARCHIVE...: DIR is the first argument when it is a directory.
  if (($# >= 1)) && [[ -d "$1" ]]; then
    DIR_ARG="$1"
    shift
  else
    DIR_ARG=""
  fi
  (($#)) || die "import: no archive given (e2e/cluster.sh import [DIR] ARCHIVE...)"
  ARCHIVES=("$@")
  set -- ${DIR_ARG:+"$DIR_ARG"}
fi
(($# <= 1)) || die "too many arguments: $*"
DIR="${1:-${REPRISE_E2E_DIR:-/tmp/reprise-e2e}}"
[[ -n "$DIR" ]] || die "empty DIR"
[[ "$CMD" != up ]] || mkdir -p "$DIR"
if [[ -d "$DIR" ]]; then DIR="$(cd "$DIR" && pwd)"; else DIR="$(realpath -m "$DIR")"; fi
[[ "$DIR" != / ]] || die "DIR may not be /"

PKI="$DIR/pki"
LOGS="$DIR/logs"
PIDS="$DIR/pids"
STATE="$DIR/cluster.env"
KUBECONFIG_FILE="$DIR/kubeconfig"
NODE_DIR="$DIR/node"
CTRD_DIR="$NODE_DIR/containerd"
CTRD_SOCK="$CTRD_DIR/containerd.sock"
CGROUP_ROOT=/reprise-e2e
MODE=""

# --- Processes ------------------------------------------------------------------
# alive PID: the process exists and is not a zombie.
alive() {
  local pid="$1" stat
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [[ "${stat:0:1}" != Z ]]
}

# recorded_pid NAME: the pid in DIR/pids/NAME.pid, if that process is alive and
# is the NAME binary started for this DIR (guards against pid reuse).
recorded_pid() {
  local name="$1" pid cmdline
  pid="$(cat "$PIDS/$name.pid" 2>/dev/null)" || return 1
  alive "$pid" || return 1
  cmdline="$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
  [[ "$(head -n1 <<<"$cmdline")" == */"$name" ]] || return 1
  [[ "$cmdline" == *"$DIR/"* ]] || return 1
  printf '%s\n' "$pid"
}

# port_in_use PORT [ADDR]: something accepts TCP connections on ADDR:PORT.
port_in_use() {
  (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null
}

# start NAME BINARY ARGS...: runs it detached (own session, stdin closed), output
# appended to DIR/logs/NAME.log, pid in DIR/pids/NAME.pid.
start() {
  local name="$1" bin="$2"
  shift 2
  local logf="$LOGS/$name.log"
  printf '\n==== %s starting: %s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$bin" "$*" >>"$logf"
  # 8>&-: the child must not inherit (and so keep holding) DIR/.lock.
  if command -v setsid >/dev/null 2>&1; then
    setsid "$bin" "$@" </dev/null >>"$logf" 2>&1 8>&- &
  else
    nohup "$bin" "$@" </dev/null >>"$logf" 2>&1 8>&- &
  fi
  local pid=$!
  printf '%s\n' "$pid" >"$PIDS/$name.pid"
  log "$name: started (pid $pid, log $logf)"
}

# start_as NAME BINARY ARGS...: like start, with argv[0] = DIR/node/NAME, so
# that recorded_pid recognises a binary whose name and arguments do not
# mention DIR (socat).
start_as() {
  local name="$1" bin="$2"
  shift 2
  start "$name" /bin/bash -c 'exec -a "$0" "$@"' "$NODE_DIR/$name" "$bin" "$@"
}

# fail_component NAME MESSAGE: dies pointing at the log, with its last lines.
fail_component() {
  local name="$1" msg="$2" logf="$LOGS/$1.log"
  {
    printf '[cluster] ---- last 25 lines of %s ----\n' "$logf"
    tail -n 25 "$logf" 2>/dev/null | sed 's/^/    /'
    printf '[cluster] ----\n'
  } >&2
  die "$name: $msg; see $logf (e2e/cluster.sh down $DIR stops the rest)"
}

# wait_healthy NAME CHECK_FN: polls CHECK_FN until it succeeds, the process
# dies, or TIMEOUT seconds pass.
wait_healthy() {
  local name="$1" check="$2" start=$SECONDS pid
  pid="$(cat "$PIDS/$name.pid" 2>/dev/null || true)"
  while true; do
    if "$check"; then
      log "$name: healthy after $((SECONDS - start))s"
      return 0
    fi
    if ! alive "$pid"; then
      local rc=0
      wait "$pid" 2>/dev/null || rc=$?
      if ((rc == 127)); then
        fail_component "$name" "is no longer running"
      fi
      fail_component "$name" "exited during start-up (exit status $rc)"
    fi
    if ((SECONDS - start >= TIMEOUT)); then
      fail_component "$name" "not healthy after ${TIMEOUT}s (REPRISE_E2E_TIMEOUT)"
    fi
    sleep 0.5
  done
}

# stop_component NAME: TERM, then KILL after 10 s; removes the pid file.
stop_component() {
  local name="$1" pid
  [[ -f "$PIDS/$name.pid" ]] || return 1
  if ! pid="$(recorded_pid "$name")"; then
    log "$name: not running (stale pid file removed)"
    rm -f "$PIDS/$name.pid"
    return 1
  fi
  log "$name: stopping pid $pid"
  kill -TERM "$pid" 2>/dev/null || true
  local start=$SECONDS
  while alive "$pid" && ((SECONDS - start < 10)); do sleep 0.2; done
  if alive "$pid"; then
    log "$name: still running after 10s; sending KILL"
    kill -KILL "$pid" 2>/dev/null || true
    start=$SECONDS
    while alive "$pid" && ((SECONDS - start < 5)); do sleep 0.2; done
    alive "$pid" && die "$name: pid $pid survived KILL"
  fi
  rm -f "$PIDS/$name.pid"
  return 0
}

# --- Ports / state ----------------------------------------------------------------
load_ports_from_env() {
  ETCD_PORT="${REPRISE_E2E_ETCD_PORT:-23790}"
  ETCD_PEER_PORT="${REPRISE_E2E_ETCD_PEER_PORT:-23800}"
  APISERVER_PORT="${REPRISE_E2E_APISERVER_PORT:-26443}"
  KCM_PORT="${REPRISE_E2E_KCM_PORT:-20257}"
  OTLP_GRPC_PORT="${REPRISE_E2E_OTLP_GRPC_PORT:-24317}"
  OTLP_HTTP_PORT="${REPRISE_E2E_OTLP_HTTP_PORT:-24318}"
  JAEGER_QUERY_PORT="${REPRISE_E2E_JAEGER_QUERY_PORT:-26686}"
  JAEGER_GRPC_PORT="${REPRISE_E2E_JAEGER_GRPC_PORT:-26685}"
  SCHEDULER_PORT="${REPRISE_E2E_SCHEDULER_PORT:-20259}"
  KUBELET_PORT="${REPRISE_E2E_KUBELET_PORT:-20250}"
  KUBELET_HEALTHZ_PORT="${REPRISE_E2E_KUBELET_HEALTHZ_PORT:-20248}"
  PROXY_HEALTH_PORT="${REPRISE_E2E_PROXY_HEALTH_PORT:-20256}"
  PROXY_METRICS_PORT="${REPRISE_E2E_PROXY_METRICS_PORT:-20249}"
  DNS_HEALTH_PORT="${REPRISE_E2E_DNS_HEALTH_PORT:-20180}"
  PROMETHEUS_PORT="${REPRISE_E2E_PROMETHEUS_PORT:-29090}"
  local p
  for p in ETCD_PORT ETCD_PEER_PORT APISERVER_PORT KCM_PORT OTLP_GRPC_PORT OTLP_HTTP_PORT \
    JAEGER_QUERY_PORT JAEGER_GRPC_PORT SCHEDULER_PORT KUBELET_PORT KUBELET_HEALTHZ_PORT \
    PROXY_HEALTH_PORT PROXY_METRICS_PORT DNS_HEALTH_PORT PROMETHEUS_PORT; do
    [[ "${!p}" =~ ^[0-9]+$ ]] && ((${!p} > 0 && ${!p} < 65535)) || die "REPRISE_E2E_$p=${!p} is not a port"
  done
  BRIDGE="${REPRISE_E2E_BRIDGE:-reprise0}"
  POD_CIDR="${REPRISE_E2E_POD_CIDR:-10.244.0.0/24}"
  NODE_NAME="${REPRISE_E2E_NODE_NAME:-reprise-node}"
  [[ "$BRIDGE" =~ ^[a-z][a-z0-9]{0,14}$ ]] || die "REPRISE_E2E_BRIDGE=$BRIDGE is not an interface name"
  [[ "$POD_CIDR" =~ ^10\.244\.([0-9]{1,3})\.0/24$ ]] ||
    die "REPRISE_E2E_POD_CIDR=$POD_CIDR: must be a /24 inside 10.244.0.0/16 (the blackholed range)"
  [[ "$NODE_NAME" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "REPRISE_E2E_NODE_NAME=$NODE_NAME is not a DNS label"
}

# Derived from the state: the bridge (gateway, node, DNS) address.
derive() {
  NODE_IP="${POD_CIDR%.0/24}.1"
  SERVICE_CIDR=10.96.0.0/16
}

load_state() {
  [[ -f "$STATE" ]] || return 1
  # shellcheck disable=SC1090
  source "$STATE"
  MODE="${MODE:-api-only}"
  BRIDGE="${BRIDGE:-reprise0}" POD_CIDR="${POD_CIDR:-10.244.0.0/24}" NODE_NAME="${NODE_NAME:-reprise-node}"
  derive
}

save_state() {
  cat >"$STATE.tmp" <<EOF
# Written by e2e/cluster.sh up; the mode and ports of the cluster in this directory.
MODE=$MODE
ETCD_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
APISERVER_PORT=$APISERVER_PORT
KCM_PORT=$KCM_PORT
OTLP_GRPC_PORT=$OTLP_GRPC_PORT
OTLP_HTTP_PORT=$OTLP_HTTP_PORT
JAEGER_QUERY_PORT=$JAEGER_QUERY_PORT
JAEGER_GRPC_PORT=$JAEGER_GRPC_PORT
SCHEDULER_PORT=$SCHEDULER_PORT
KUBELET_PORT=$KUBELET_PORT
KUBELET_HEALTHZ_PORT=$KUBELET_HEALTHZ_PORT
PROXY_HEALTH_PORT=$PROXY_HEALTH_PORT
PROXY_METRICS_PORT=$PROXY_METRICS_PORT
DNS_HEALTH_PORT=$DNS_HEALTH_PORT
PROMETHEUS_PORT=$PROMETHEUS_PORT
BRIDGE=$BRIDGE
POD_CIDR=$POD_CIDR
NODE_NAME=$NODE_NAME
EOF
  mv -f "$STATE.tmp" "$STATE"
}

components() {
  printf '%s\n' "${CONTROL_PLANE[@]}"
  if [[ "$MODE" == node ]]; then printf '%s\n' "${NODE_COMPONENTS[@]}"; fi
}

any_running() {
  local c
  for c in "${CONTROL_PLANE[@]}" "${NODE_COMPONENTS[@]}"; do
    if recorded_pid "$c" >/dev/null; then return 0; fi
  done
  return 1
}

print_env() {
  local prefix="export "
  ((PLAIN)) && prefix=""
  printf '%sKUBECONFIG=%q\n' "$prefix" "$KUBECONFIG_FILE"
  printf '%sJAEGER_QUERY=http://127.0.0.1:%s\n' "$prefix" "$JAEGER_QUERY_PORT"
  printf '%sOTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:%s\n' "$prefix" "$OTLP_GRPC_PORT"
  printf '%sREPRISE_E2E_OTLP_HTTP_ENDPOINT=http://127.0.0.1:%s\n' "$prefix" "$OTLP_HTTP_PORT"
  printf '%sREPRISE_E2E_DIR=%q\n' "$prefix" "$DIR"
  printf '%sREPRISE_E2E_MODE=%s\n' "$prefix" "$MODE"
  if [[ "$MODE" == node ]]; then
    printf '%sREPRISE_E2E_NODE=%s\n' "$prefix" "$NODE_NAME"
    printf '%sPROMETHEUS_URL=http://127.0.0.1:%s\n' "$prefix" "$PROMETHEUS_PORT"
    printf '%sCONTAINERD_ADDRESS=%q\n' "$prefix" "$CTRD_SOCK"
  fi
}

# --- Health checks ------------------------------------------------------------------
need_curl() { command -v curl >/dev/null 2>&1 || die "curl is required (apt-get install curl)"; }

check_etcd() {
  curl --noproxy '*' -fsS -m 2 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'
}
check_kube-apiserver() {
  [[ "$(curl --noproxy '*' -fsS -m 3 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://127.0.0.1:$APISERVER_PORT/readyz" 2>/dev/null)" == ok ]]
}
check_kube-controller-manager() {
  [[ "$(curl --noproxy '*' -fsS -m 2 --cacert "$PKI/ca.crt" "https://127.0.0.1:$KCM_PORT/healthz" 2>/dev/null)" == ok ]]
}
check_jaeger() {
  curl --noproxy '*' -fsS -m 2 "http://127.0.0.1:$JAEGER_QUERY_PORT/api/services" 2>/dev/null | grep -q '"data"'
}
check_containerd() {
  [[ -S "$CTRD_SOCK" ]] && ctr --address "$CTRD_SOCK" version >/dev/null 2>&1
}
check_apiserver-proxy() {
  [[ "$(curl --noproxy '*' -fsS -m 3 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    --resolve "kubernetes.default.svc:$APISERVER_PORT:$NODE_IP" \
    "https://kubernetes.default.svc:$APISERVER_PORT/readyz" 2>/dev/null)" == ok ]]
}
check_coredns() {
  curl --noproxy '*' -fsS -m 2 "http://127.0.0.1:$((DNS_HEALTH_PORT + 1))/ready" >/dev/null 2>&1
}
check_kube-scheduler() {
  [[ "$(curl --noproxy '*' -fsS -m 2 -k "https://127.0.0.1:$SCHEDULER_PORT/healthz" 2>/dev/null)" == ok ]]
}
check_kubelet() {
  [[ "$(curl --noproxy '*' -fsS -m 2 "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz" 2>/dev/null)" == ok ]] &&
    [[ "$(kc get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}
check_kube-proxy() {
  curl --noproxy '*' -fsS -m 2 "http://127.0.0.1:$PROXY_HEALTH_PORT/healthz" >/dev/null 2>&1 &&
    iptables -w 5 -t nat -S KUBE-SERVICES 2>/dev/null | grep -q 'default/kubernetes:https'
}
check_prometheus() {
  curl --noproxy '*' -fsS -m 2 "http://127.0.0.1:$PROMETHEUS_PORT/-/ready" >/dev/null 2>&1
}

# --- Files ----------------------------------------------------------------------------
gen_pki() {
  local want=(ca.crt ca.key serving.crt serving.key admin.crt admin.key sa.key sa.pub
    kubelet.crt kubelet.key kubelet-serving.crt kubelet-serving.key kube-proxy.crt kube-proxy.key
    kube-scheduler.crt kube-scheduler.key) f missing=0
  for f in "${want[@]}"; do [[ -s "$PKI/$f" ]] || missing=1; done
  # The serving certificate must name the bridge address the pods reach it on.
  if ((missing == 0)) && ! openssl x509 -in "$PKI/serving.crt" -noout -ext subjectAltName 2>/dev/null |
    grep -q "IP Address:$NODE_IP\b"; then
    missing=1
  fi
  ((missing)) || return 0
  any_running && die "$PKI is incomplete or outdated but components run; run e2e/cluster.sh down $DIR, then up --fresh"
  command -v openssl >/dev/null 2>&1 || die "openssl is required (apt-get install openssl)"
  log "generating CA, serving/client certs and service-account keys in $PKI"
  local tmp="$DIR/.pki.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  (
    set -e
    cd "$tmp"
    exec 2>openssl.log
    openssl req -x509 -new -nodes -newkey rsa:2048 -sha256 -days 3650 \
      -keyout ca.key -out ca.crt -subj "/CN=reprise-e2e-ca" \
      -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
      -addext "subjectKeyIdentifier=hash"
    # signed NAME SUBJECT EXTFILE-LINES...
    signed() {
      local name="$1" subj="$2"
      shift 2
      printf '%s\n' "$@" >"$name.ext"
      openssl req -new -nodes -newkey rsa:2048 -keyout "$name.key" -out "$name.csr" -subj "$subj"
      openssl x509 -req -sha256 -days 3650 -in "$name.csr" -CA ca.crt -CAkey ca.key \
        -set_serial "0x$(openssl rand -hex 16)" -extfile "$name.ext" -out "$name.crt"
      rm -f "$name.csr" "$name.ext"
    }
    client() {
      signed "$1" "$2" "basicConstraints=critical,CA:FALSE" \
        "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=clientAuth"
    }
    signed serving "/CN=kube-apiserver" \
      "basicConstraints=critical,CA:FALSE" \
      "keyUsage=critical,digitalSignature,keyEncipherment" \
      "extendedKeyUsage=serverAuth" \
      "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc.cluster.local,IP:10.96.0.1,IP:$NODE_IP"
    client admin "/O=system:masters/CN=reprise-e2e-admin"
    client kubelet "/O=system:nodes/CN=system:node:$NODE_NAME"
    client kube-proxy "/CN=system:kube-proxy"
    client kube-scheduler "/CN=system:kube-scheduler"
    signed kubelet-serving "/CN=$NODE_NAME" \
      "basicConstraints=critical,CA:FALSE" \
      "keyUsage=critical,digitalSignature,keyEncipherment" \
      "extendedKeyUsage=serverAuth" \
      "subjectAltName=IP:$NODE_IP,DNS:$NODE_NAME"
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key
    openssl pkey -in sa.key -pubout -out sa.pub
    chmod 600 ./*.key
  ) || {
    cat "$tmp/openssl.log" >&2 2>/dev/null || true
    rm -rf "$tmp"
    die "openssl failed"
  }
  rm -f "$tmp/openssl.log"
  rm -rf "$PKI" "$KUBECONFIG_FILE" "$DIR"/*.kubeconfig
  mv "$tmp" "$PKI"
}

# write_kubeconfig FILE USER: a kubeconfig for 127.0.0.1 with USER's cert (pki/USER.crt).
write_kubeconfig() {
  local file="$1" user="$2"
  local b64=(base64 -w0)
  base64 -w0 </dev/null >/dev/null 2>&1 || b64=(base64)
  cat >"$file.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: reprise-e2e
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $("${b64[@]}" <"$PKI/ca.crt" | tr -d '\n')
users:
- name: reprise-e2e-$user
  user:
    client-certificate-data: $("${b64[@]}" <"$PKI/$user.crt" | tr -d '\n')
    client-key-data: $("${b64[@]}" <"$PKI/$user.key" | tr -d '\n')
contexts:
- name: reprise-e2e
  context:
    cluster: reprise-e2e
    user: reprise-e2e-$user
    namespace: default
current-context: reprise-e2e
EOF
  chmod 600 "$file.tmp"
  mv -f "$file.tmp" "$file"
}

write_kubeconfigs() {
  [[ -s "$KUBECONFIG_FILE" ]] && grep -q "127.0.0.1:$APISERVER_PORT\$" "$KUBECONFIG_FILE" ||
    write_kubeconfig "$KUBECONFIG_FILE" admin
  [[ "$MODE" == node ]] || return 0
  local u
  for u in kubelet kube-proxy kube-scheduler; do
    [[ -s "$DIR/$u.kubeconfig" ]] && grep -q "127.0.0.1:$APISERVER_PORT\$" "$DIR/$u.kubeconfig" ||
      write_kubeconfig "$DIR/$u.kubeconfig" "$u"
  done
}

write_jaeger_config() {
  cat >"$DIR/jaeger.yaml.tmp" <<EOF
# Written by e2e/cluster.sh: Jaeger v2, OTLP in, in-memory storage, query API.
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info

extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memstore
    # On by default: Jaeger would trace itself to localhost:4317.
    enable_tracing: false
    http:
      endpoint: 127.0.0.1:$JAEGER_QUERY_PORT
    grpc:
      endpoint: 127.0.0.1:$JAEGER_GRPC_PORT

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:$OTLP_GRPC_PORT
      http:
        endpoint: 127.0.0.1:$OTLP_HTTP_PORT

processors:
  batch:
    timeout: 100ms

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
EOF
  mv -f "$DIR/jaeger.yaml.tmp" "$DIR/jaeger.yaml"
}

# write_if_changed FILE: stdin to FILE, only when the content differs.
write_if_changed() {
  local f="$1" tmp="$1.tmp.$$"
  cat >"$tmp"
  if cmp -s "$tmp" "$f"; then rm -f "$tmp"; else mv -f "$tmp" "$f"; fi
}

write_node_config() {
  mkdir -p "$CTRD_DIR"/{root,state,opt} "$CTRD_DIR/certs.d/_default" "$NODE_DIR"/{runc,cni/net.d,cni/ipam,kubelet,pod-logs,coredns,prometheus/data}
  chmod 700 "$NODE_DIR/kubelet"
  # No registry is reachable from this machine, and no pull may leave it:
  # every registry host resolves to a closed local port. Images come from
  # e2e/images.sh / e2e/cluster.sh import.
  local reg
  for reg in _default docker.io ghcr.io registry.k8s.io quay.io gcr.io; do
    mkdir -p "$CTRD_DIR/certs.d/$reg"
    printf 'server = "http://127.0.0.1:9"\n\n[host."http://127.0.0.1:9"]\n  capabilities = ["pull", "resolve"]\n' |
      write_if_changed "$CTRD_DIR/certs.d/$reg/hosts.toml"
  done
  write_if_changed "$CTRD_DIR/config.toml" <<EOF
# Written by e2e/cluster.sh: containerd for the e2e node; all state under $NODE_DIR.
version = 2
root = "$CTRD_DIR/root"
state = "$CTRD_DIR/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "$CTRD_SOCK"

[ttrpc]
  address = "$CTRD_SOCK.ttrpc"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$CTRD_DIR/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "reprise.local/pause:dev"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # Never ask for an oom_score_adj below containerd's own: lowering it needs
  # CAP_SYS_RESOURCE, which sandboxed CI machines may not grant even to root
  # (runc then fails with "can't get final child's PID from pipe").
  restrict_oom_score_adj = true
  max_container_log_line_size = 16384
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = false
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$NODE_DIR/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$NODE_DIR/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$CTRD_DIR/certs.d"
EOF
  write_if_changed "$NODE_DIR/cni/net.d/10-reprise.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "reprise-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$POD_CIDR", "gateway": "$NODE_IP" }]],
        "routes": [{ "dst": "0.0.0.0/0" }],
        "dataDir": "$NODE_DIR/cni/ipam"
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
  # Pods with dnsPolicy Default get no nameserver: nothing resolves off the node.
  printf '# e2e node: no upstream DNS (pods use the cluster DNS at %s)\n' "$NODE_IP" |
    write_if_changed "$NODE_DIR/resolv.conf"
  write_if_changed "$NODE_DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous: { enabled: false }
  webhook: { enabled: true }
  x509: { clientCAFile: $PKI/ca.crt }
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$CTRD_SOCK
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
cgroupsPerQOS: true
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
resolvConf: $NODE_DIR/resolv.conf
podLogsDir: $NODE_DIR/pod-logs
failSwapOn: false
protectKernelDefaults: false
# Never garbage-collect the imported images; never evict for disk on a busy CI disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
maxPods: 60
serializeImagePulls: false
syncFrequency: 10s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
shutdownGracePeriod: 0s
logging:
  format: text
EOF
  write_if_changed "$NODE_DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: $DIR/kube-proxy.kubeconfig
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$PROXY_HEALTH_PORT
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
# Leave the machine's conntrack settings and route_localnet alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
  syncPeriod: 30s
  minSyncPeriod: 0s
nodePortAddresses: [$NODE_IP/32]
EOF
  write_if_changed "$NODE_DIR/kube-scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $DIR/kube-scheduler.kubeconfig
leaderElection:
  leaderElect: false
EOF
  write_if_changed "$NODE_DIR/coredns/Corefile" <<EOF
# Written by e2e/cluster.sh: cluster DNS on the bridge address, cluster.local
# only, no forwarding (a name outside the cluster gets an error, never a query
# off the machine).
.:53 {
    bind $NODE_IP
    errors
    health 127.0.0.1:$DNS_HEALTH_PORT
    ready 127.0.0.1:$((DNS_HEALTH_PORT + 1))
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $KUBECONFIG_FILE reprise-e2e
        pods insecure
        ttl 5
    }
    cache 5
}
EOF
  write_if_changed "$NODE_DIR/prometheus/prometheus.yml" <<EOF
# Written by e2e/cluster.sh: Prometheus scraping the Reprise controller (its
# "metrics" port) and every injected sidecar (its "reprise-health" port,
# /metrics) of any namespace, found through the API server.
global:
  scrape_interval: 2s
  scrape_timeout: 1s
  evaluation_interval: 2s
scrape_configs:
  - job_name: reprise-controller
    kubernetes_sd_configs:
      - role: pod
        kubeconfig_file: $KUBECONFIG_FILE
    relabel_configs:
      - source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_name, __meta_kubernetes_pod_label_app_kubernetes_io_component, __meta_kubernetes_pod_container_port_name]
        regex: reprise;controller;metrics
        action: keep
      - source_labels: [__meta_kubernetes_pod_phase]
        regex: Running
        action: keep
      - { source_labels: [__meta_kubernetes_namespace], target_label: namespace }
      - { source_labels: [__meta_kubernetes_pod_name], target_label: pod }
  - job_name: reprise-sidecar
    kubernetes_sd_configs:
      - role: pod
        kubeconfig_file: $KUBECONFIG_FILE
    relabel_configs:
      - source_labels: [__meta_kubernetes_pod_container_port_name]
        regex: reprise-health
        action: keep
      - source_labels: [__meta_kubernetes_pod_phase]
        regex: Running
        action: keep
      - { source_labels: [__meta_kubernetes_namespace], target_label: namespace }
      - { source_labels: [__meta_kubernetes_pod_name], target_label: pod }
EOF
}

# --- Tools -------------------------------------------------------------------------------
find_kubectl() {
  if [[ -n "${KUBECTL:-}" ]]; then
    [[ -x "$KUBECTL" ]] || die "KUBECTL=$KUBECTL is not executable"
    return 0
  fi
  if KUBECTL="$(command -v kubectl 2>/dev/null)"; then return 0; fi
  local cached
  cached="$(ls -1 "${REPRISE_TOOLS_DIR:-$HOME/.cache/reprise-tools}"/kubectl-*/kubectl 2>/dev/null | tail -n1 || true)"
  if [[ -n "$cached" && -x "$cached" ]]; then
    KUBECTL="$cached"
    return 0
  fi
  local dest="${REPRISE_TOOLS_DIR:-$HOME/.cache/reprise-tools}/kubectl-v1.32/kubectl"
  die "kubectl (v1.32) not found: not on PATH, \$KUBECTL unset. Install it (e.g. the kubectl
  package from pkgs.k8s.io), or build it from the pinned Kubernetes module (several minutes
  on 2 cores), which this script then finds by itself:
    (cd $E2E_DIR/tools && GOWORK=off CGO_ENABLED=0 GOFLAGS='-mod=readonly -buildvcs=false' \\
       go build -trimpath -o $dest k8s.io/kubernetes/cmd/kubectl)"
}

load_tools() {
  local envfile args=(--env-file)
  [[ "$MODE" == node ]] || args+=(--api-only)
  envfile="$("$E2E_DIR/build-tools.sh" "${args[@]}")" || die "e2e/build-tools.sh failed"
  # shellcheck disable=SC1090
  source "$envfile"
  local v vars=(KUBE_APISERVER KUBE_CONTROLLER_MANAGER ETCD JAEGER)
  [[ "$MODE" != node ]] || vars+=(KUBELET KUBE_PROXY KUBE_SCHEDULER COREDNS PROMETHEUS CRICTL)
  for v in "${vars[@]}"; do
    [[ -x "${!v:-}" ]] || die "$v=${!v:-} from $envfile is not executable"
  done
}

# The node's Debian packages: installed when missing (CI starts from a bare machine).
CNI_BIN_DIR=""
node_packages() {
  local -A need=([containerd]=containerd [runc]=runc [iptables]=iptables [ip6tables]=iptables
    [conntrack]=conntrack [socat]=socat [ip]=iproute2 [findmnt]=util-linux)
  local cmd pkgs=()
  for cmd in "${!need[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" >/dev/null 2>&1 ||
      pkgs+=("${need[$cmd]}")
  done
  [[ -x /usr/lib/cni/bridge || -x /opt/cni/bin/bridge ]] || pkgs+=(containernetworking-plugins)
  if ((${#pkgs[@]})); then
    mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
    apt_install "the node, first run on this machine" "${pkgs[@]}" || die "the node needs ${pkgs[*]} (Debian packages)"
  fi
  export PATH="$PATH:/usr/sbin:/sbin"
  local d
  for d in /usr/lib/cni /opt/cni/bin; do
    if [[ -x "$d/bridge" && -x "$d/host-local" && -x "$d/loopback" && -x "$d/portmap" ]]; then
      CNI_BIN_DIR="$d"
      break
    fi
  done
  [[ -n "$CNI_BIN_DIR" ]] || die "CNI plugins bridge, host-local, loopback, portmap not found in /usr/lib/cni or /opt/cni/bin"
}

# cached_tool NAME: the newest cached build of NAME, without building anything.
cached_tool() {
  ls -1d "${REPRISE_TOOLS_DIR:-$HOME/.cache/reprise-tools}/$1"-*/"$1" 2>/dev/null | sort -V | tail -n1 || true
}

kc() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" --request-timeout=20s "$@"; }

# --- The node's network ---------------------------------------------------------------------
# Which addresses exist only here: the bridge's /24 and, beneath it, blackholes
# for 10.244.0.0/16 and the Service range, so that nothing addressed to a pod
# or a Service can take the default route off the machine.
BLACKHOLE_METRIC=4242
NET_MARK="$NODE_DIR/network.up"

sysctl_get() { cat "/proc/sys/${1//.//}" 2>/dev/null; }
sysctl_set() { printf '%s\n' "$2" >"/proc/sys/${1//.//}"; }

# Kernel settings the kubelet changes at start (protectKernelDefaults: false);
# saved once before the first kubelet start, restored by `down`.
KUBELET_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

net_up() {
  [[ $EUID -eq 0 ]] || die "the node needs root (bridge, iptables, cgroups, mounts); run as root or use --api-only"
  if ip link show "$BRIDGE" >/dev/null 2>&1 && [[ ! -f "$NET_MARK" ]]; then
    die "interface $BRIDGE exists but was not created for $DIR (another cluster?); set REPRISE_E2E_BRIDGE or remove it"
  fi
  if [[ ! -f "$NET_MARK" ]]; then
    # Refuse to share the machine with another kube-proxy or CNI: `down`
    # removes every KUBE-* and CNI-* chain.
    if iptables -w 5 -S 2>/dev/null | grep -qE '^-N (KUBE|CNI)-' ||
      iptables -w 5 -t nat -S 2>/dev/null | grep -qE '^-N (KUBE|CNI)-'; then
      die "iptables already has KUBE-*/CNI-* chains (another Kubernetes node on this machine?); e2e/cluster.sh down the other cluster first"
    fi
    {
      echo "# Written by e2e/cluster.sh up: what the node changed, restored by down."
      local k
      for k in "${KUBELET_SYSCTLS[@]}" net.bridge.bridge-nf-call-iptables; do
        printf 'SAVED_%s=%s\n' "$(tr '.-' '__' <<<"$k")" "$(sysctl_get "$k")"
      done
    } >"$NET_MARK.tmp"
    mv -f "$NET_MARK.tmp" "$NET_MARK"
  fi
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    log "network: bridge $BRIDGE $NODE_IP/24, blackholes 10.244.0.0/16 and $SERVICE_CIDR"
    ip link add "$BRIDGE" type bridge
  fi
  ip addr show dev "$BRIDGE" | grep -q "inet $NODE_IP/24" || ip addr add "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # Bridged pod traffic passes iptables (kube-proxy's Service rules).
  [[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]] ||
    die "/proc/sys/net/bridge/bridge-nf-call-iptables is missing: the kernel lacks br_netfilter (no modprobe here)"
  sysctl_set net.bridge.bridge-nf-call-iptables 1
  # Routed (Service) traffic between pods: forwarding on the bridge only.
  sysctl_set "net.ipv4.conf.$BRIDGE.forwarding" 1
  ip route replace "$SERVICE_CIDR" dev "$BRIDGE" proto static
  ip route replace blackhole 10.244.0.0/16 metric "$BLACKHOLE_METRIC"
  ip route replace blackhole "$POD_CIDR" metric "$BLACKHOLE_METRIC"
  ip route replace blackhole "$SERVICE_CIDR" metric "$BLACKHOLE_METRIC"
  # Nothing enters or leaves the bridge through another interface.
  iptables -w 5 -N REPRISE-E2E-FORWARD 2>/dev/null || iptables -w 5 -F REPRISE-E2E-FORWARD
  iptables -w 5 -A REPRISE-E2E-FORWARD -i "$BRIDGE" -o "$BRIDGE" -j RETURN
  iptables -w 5 -A REPRISE-E2E-FORWARD -i "$BRIDGE" -j DROP
  iptables -w 5 -A REPRISE-E2E-FORWARD -o "$BRIDGE" -j DROP
  iptables -w 5 -C FORWARD -j REPRISE-E2E-FORWARD 2>/dev/null || iptables -w 5 -I FORWARD 1 -j REPRISE-E2E-FORWARD
  # The kubelet's cgroup root, in every hierarchy.
  local h
  for h in /sys/fs/cgroup /sys/fs/cgroup/*; do
    [[ -d "$h" && -e "$h/cgroup.procs" ]] || continue
    mkdir -p "$h$CGROUP_ROOT"
    if [[ -e "$h/cpuset.cpus" && ! -s "$h$CGROUP_ROOT/cpuset.cpus" ]]; then
      cat "$h/cpuset.cpus" >"$h$CGROUP_ROOT/cpuset.cpus" 2>/dev/null || true
      cat "$h/cpuset.mems" >"$h$CGROUP_ROOT/cpuset.mems" 2>/dev/null || true
    fi
  done
  # cgroup v2: the controllers the kubelet needs, delegated to the root.
  if [[ -e /sys/fs/cgroup/cgroup.subtree_control ]]; then
    local c
    for c in cpu cpuset memory pids; do
      echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
      echo "+$c" >"/sys/fs/cgroup$CGROUP_ROOT/cgroup.subtree_control" 2>/dev/null || true
    done
  fi
}

# ipt_cleanup IPTABLES: deletes the node's chains (KUBE-*, CNI-*, REPRISE-E2E-*)
# from every table, and the rules in built-in chains that jump to them.
ipt_cleanup() {
  local ipt="$1"
  command -v "$ipt" >/dev/null 2>&1 || return 0
  local table
  for table in filter nat mangle raw; do
    "$ipt" -w 5 -t "$table" -S >/dev/null 2>&1 || continue
    python3 - "$ipt" "$table" <<'PY'
import shlex, subprocess, sys
ipt, table = sys.argv[1:3]
rules = subprocess.run([ipt, "-w", "5", "-t", table, "-S"], capture_output=True, text=True).stdout.splitlines()
ours = lambda c: c.startswith(("KUBE-", "CNI-", "REPRISE-E2E-"))
chains = [l.split()[1] for l in rules if l.startswith("-N ") and ours(l.split()[1])]
for line in rules:
    if not line.startswith("-A "):
        continue
    words = shlex.split(line)
    chain = words[1]
    if ours(chain):
        continue
    if "-j" in words and ours(words[words.index("-j") + 1]) or "-g" in words and ours(words[words.index("-g") + 1]):
        subprocess.run([ipt, "-w", "5", "-t", table, "-D"] + words[1:], check=False)
for c in chains:
    subprocess.run([ipt, "-w", "5", "-t", table, "-F", c], check=False)
for c in chains:
    subprocess.run([ipt, "-w", "5", "-t", table, "-X", c], check=False, stderr=subprocess.DEVNULL)
PY
  done
}

net_down() {
  [[ -f "$NET_MARK" ]] || return 0
  [[ $EUID -eq 0 ]] || die "removing the node's network needs root"
  log "network: removing bridge $BRIDGE, routes, iptables chains; restoring sysctls"
  if [[ -x "${KUBE_PROXY:-}" ]]; then
    "$KUBE_PROXY" --cleanup --v=0 >>"$LOGS/kube-proxy.log" 2>&1 || true
  fi
  ipt_cleanup iptables
  ipt_cleanup ip6tables
  ip link del "$BRIDGE" 2>/dev/null || true
  ip route del "$SERVICE_CIDR" dev "$BRIDGE" 2>/dev/null || true
  local r
  for r in 10.244.0.0/16 "$POD_CIDR" "$SERVICE_CIDR"; do
    ip route del blackhole "$r" metric "$BLACKHOLE_METRIC" 2>/dev/null || true
  done
  # shellcheck disable=SC1090
  source "$NET_MARK"
  local k v
  for k in "${KUBELET_SYSCTLS[@]}" net.bridge.bridge-nf-call-iptables; do
    v="SAVED_$(tr '.-' '__' <<<"$k")"
    [[ -z "${!v:-}" ]] || sysctl_set "$k" "${!v}" 2>/dev/null || log "warning: could not restore $k=${!v}"
  done
  # The cgroups the kubelet and runc made (empty once the pods are gone).
  local h
  for h in /sys/fs/cgroup /sys/fs/cgroup/*; do
    [[ -d "$h$CGROUP_ROOT" ]] || continue
    find "$h$CGROUP_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [[ ! -d "$h$CGROUP_ROOT" ]] || log "warning: $h$CGROUP_ROOT is not empty; left in place"
  done
  rm -f "$NET_MARK"
}

# remove_pods: stops and removes every pod sandbox through the CRI (the CNI
# plugins release the addresses, containerd removes the network namespaces,
# the shims exit), then unmounts what the kubelet left under DIR.
remove_pods() {
  if [[ -S "$CTRD_SOCK" ]] && check_containerd; then
    if [[ -x "${CRICTL:-}" ]]; then
      local ids n
      ids="$("$CRICTL" --runtime-endpoint "unix://$CTRD_SOCK" --timeout 30s pods -q 2>/dev/null || true)"
      n="$(grep -c . <<<"$ids" || true)"
      if ((n > 0)); then
        log "node: stopping and removing $n pod sandbox(es)"
        # shellcheck disable=SC2086
        "$CRICTL" --runtime-endpoint "unix://$CTRD_SOCK" --timeout 60s stopp $ids >/dev/null 2>&1 || true
        # shellcheck disable=SC2086
        "$CRICTL" --runtime-endpoint "unix://$CTRD_SOCK" --timeout 60s rmp -f $ids >/dev/null 2>&1 || true
      fi
    fi
    # Anything the CRI does not know (ctr run ...): kill its task.
    local t
    for t in $(ctr --address "$CTRD_SOCK" -n k8s.io tasks ls -q 2>/dev/null || true); do
      ctr --address "$CTRD_SOCK" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
      ctr --address "$CTRD_SOCK" -n k8s.io tasks delete -f "$t" >/dev/null 2>&1 || true
    done
  fi
  unmount_under "$DIR"
  # The kubelet's links to container logs (it keeps them in a fixed place).
  local l
  for l in /var/log/containers/*.log; do
    [[ -L "$l" && "$(readlink "$l")" == "$NODE_DIR/"* ]] && rm -f "$l"
  done
  return 0
}

# unmount_under DIR: unmounts every mount point below DIR, deepest first.
unmount_under() {
  command -v findmnt >/dev/null 2>&1 || return 0
  local m
  findmnt -rn -o TARGET | awk -v d="$1/" 'index($0, d) == 1' | sort -r | while read -r m; do
    m="$(printf '%b' "$m")"
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "warning: could not unmount $m"
  done
}

# --- Components ------------------------------------------------------------------------------
# ensure NAME: leaves a healthy NAME running, starting it if needed.
ensure() {
  local name="$1" pid port
  if pid="$(recorded_pid "$name")"; then
    log "$name: already running (pid $pid)"
    wait_healthy "$name" "check_$name"
    return 0
  fi
  rm -f "$PIDS/$name.pid"
  case "$name" in
    etcd)
      for port in "$ETCD_PORT" "$ETCD_PEER_PORT"; do
        port_in_use "$port" && die "etcd: 127.0.0.1:$port is in use by another process (set REPRISE_E2E_ETCD_PORT/REPRISE_E2E_ETCD_PEER_PORT)"
      done
      mkdir -p "$DIR/etcd"
      chmod 700 "$DIR/etcd"
      start etcd "$ETCD" \
        --name=reprise-e2e \
        --data-dir="$DIR/etcd" \
        --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
        --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster="reprise-e2e=http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster-state=new \
        --unsafe-no-fsync \
        --log-level=warn
      ;;
    kube-apiserver)
      port_in_use "$APISERVER_PORT" &&
        die "kube-apiserver: 127.0.0.1:$APISERVER_PORT is in use by another process (set REPRISE_E2E_APISERVER_PORT)"
      local mode_args=()
      if [[ "$MODE" == node ]]; then
        # The `kubernetes` Service's endpoint is the bridge address, where
        # apiserver-proxy forwards to 127.0.0.1; logs/exec reach the kubelet
        # on the same address.
        mode_args=(
          --advertise-address="$NODE_IP"
          --endpoint-reconciler-type=lease
          --kubelet-client-certificate="$PKI/admin.crt"
          --kubelet-client-key="$PKI/admin.key"
          --kubelet-certificate-authority="$PKI/ca.crt"
          --kubelet-preferred-address-types=InternalIP
        )
      else
        # The `kubernetes` Service would get 127.0.0.1 as its endpoint, which
        # Endpoints validation rejects (loopback).
        mode_args=(--advertise-address=127.0.0.1 --endpoint-reconciler-type=none)
      fi
      start kube-apiserver "$KUBE_APISERVER" \
        --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
        --bind-address=127.0.0.1 \
        "${mode_args[@]}" \
        --secure-port="$APISERVER_PORT" \
        --tls-cert-file="$PKI/serving.crt" \
        --tls-private-key-file="$PKI/serving.key" \
        --client-ca-file="$PKI/ca.crt" \
        --service-account-issuer=https://kubernetes.default.svc \
        --service-account-key-file="$PKI/sa.pub" \
        --service-account-signing-key-file="$PKI/sa.key" \
        --api-audiences=https://kubernetes.default.svc,reprise \
        --authorization-mode=Node,RBAC \
        --enable-admission-plugins=MutatingAdmissionWebhook,ValidatingAdmissionWebhook \
        --service-cluster-ip-range="${SERVICE_CIDR:-10.96.0.0/16}" \
        --allow-privileged=true \
        --cert-dir="$DIR/apiserver-certs" \
        --profiling=false \
        --v=1
      ;;
    kube-controller-manager)
      port_in_use "$KCM_PORT" &&
        die "kube-controller-manager: 127.0.0.1:$KCM_PORT is in use by another process (set REPRISE_E2E_KCM_PORT)"
      local controllers=endpointslice-controller,endpoints-controller,serviceaccount-controller,serviceaccount-token-controller,namespace-controller,garbage-collector-controller,root-ca-certificate-publisher-controller,clusterrole-aggregation-controller
      # With a node, the workload controllers too (no node-lifecycle controller:
      # it would mark Node `local` unreachable and evict its pods).
      [[ "$MODE" != node ]] ||
        controllers+=,deployment-controller,replicaset-controller,statefulset-controller,daemonset-controller,job-controller,disruption-controller,pod-garbage-collector-controller,ttl-after-finished-controller
      # No --authentication/authorization-kubeconfig: its /healthz is always
      # allowed anyway, and with them it keeps failing to read the (absent)
      # requestheader CA from kube-system/extension-apiserver-authentication.
      start kube-controller-manager "$KUBE_CONTROLLER_MANAGER" \
        --kubeconfig="$KUBECONFIG_FILE" \
        --controllers="${REPRISE_E2E_KCM_CONTROLLERS:-$controllers}" \
        --service-account-private-key-file="$PKI/sa.key" \
        --root-ca-file="$PKI/ca.crt" \
        --use-service-account-credentials=false \
        --leader-elect=false \
        --bind-address=127.0.0.1 \
        --secure-port="$KCM_PORT" \
        --tls-cert-file="$PKI/serving.crt" \
        --tls-private-key-file="$PKI/serving.key" \
        --profiling=false \
        --v=1
      ;;
    jaeger)
      for port in "$OTLP_GRPC_PORT" "$OTLP_HTTP_PORT" "$JAEGER_QUERY_PORT" "$JAEGER_GRPC_PORT"; do
        port_in_use "$port" && die "jaeger: 127.0.0.1:$port is in use by another process (set REPRISE_E2E_OTLP_*/REPRISE_E2E_JAEGER_*_PORT)"
      done
      write_jaeger_config
      start jaeger "$JAEGER" --config="file:$DIR/jaeger.yaml"
      ;;
    containerd)
      ((${#CTRD_SOCK} < 100)) || die "containerd: socket path $CTRD_SOCK is too long for a unix socket; use a shorter DIR"
      rm -f "$CTRD_SOCK" "$CTRD_SOCK.ttrpc"
      start containerd "$(command -v containerd)" --config "$CTRD_DIR/config.toml"
      ;;
    apiserver-proxy)
      port_in_use "$APISERVER_PORT" "$NODE_IP" && die "apiserver-proxy: $NODE_IP:$APISERVER_PORT is in use"
      # Pods reach the API server through the `kubernetes` Service, whose
      # endpoint is this address; the API server itself listens on 127.0.0.1.
      start_as apiserver-proxy "$(command -v socat)" \
        "TCP-LISTEN:$APISERVER_PORT,bind=$NODE_IP,reuseaddr,fork" "TCP:127.0.0.1:$APISERVER_PORT"
      ;;
    coredns)
      port_in_use "$((DNS_HEALTH_PORT + 1))" && die "coredns: 127.0.0.1:$((DNS_HEALTH_PORT + 1)) is in use (set REPRISE_E2E_DNS_HEALTH_PORT)"
      start coredns "$COREDNS" -conf "$NODE_DIR/coredns/Corefile"
      ;;
    kube-scheduler)
      port_in_use "$SCHEDULER_PORT" && die "kube-scheduler: 127.0.0.1:$SCHEDULER_PORT is in use (set REPRISE_E2E_SCHEDULER_PORT)"
      start kube-scheduler "$KUBE_SCHEDULER" \
        --config="$NODE_DIR/kube-scheduler.yaml" \
        --bind-address=127.0.0.1 \
        --secure-port="$SCHEDULER_PORT" \
        --cert-dir="$NODE_DIR/scheduler-certs" \
        --profiling=false \
        --v=1
      ;;
    kubelet)
      port_in_use "$KUBELET_HEALTHZ_PORT" && die "kubelet: 127.0.0.1:$KUBELET_HEALTHZ_PORT is in use (set REPRISE_E2E_KUBELET_HEALTHZ_PORT)"
      start kubelet "$KUBELET" \
        --config="$NODE_DIR/kubelet/config.yaml" \
        --kubeconfig="$DIR/kubelet.kubeconfig" \
        --root-dir="$NODE_DIR/kubelet" \
        --cert-dir="$NODE_DIR/kubelet/pki" \
        --hostname-override="$NODE_NAME" \
        --node-ip="$NODE_IP" \
        --node-labels=reprise.dev/e2e-node=true \
        --v=1
      ;;
    kube-proxy)
      start kube-proxy "$KUBE_PROXY" --config="$NODE_DIR/kube-proxy.yaml" --v=1
      ;;
    prometheus)
      port_in_use "$PROMETHEUS_PORT" && die "prometheus: 127.0.0.1:$PROMETHEUS_PORT is in use (set REPRISE_E2E_PROMETHEUS_PORT)"
      start prometheus "$PROMETHEUS" \
        --config.file="$NODE_DIR/prometheus/prometheus.yml" \
        --storage.tsdb.path="$NODE_DIR/prometheus/data" \
        --storage.tsdb.retention.time=1d \
        --web.listen-address="127.0.0.1:$PROMETHEUS_PORT" \
        --log.level=warn
      ;;
  esac
  wait_healthy "$name" "check_$name"
}

# bootstrap_objects: Node `local` (the API-only tests' stand-in for a kubelet)
# and the default ServiceAccount.
bootstrap_objects() {
  if ! kc get node local >/dev/null 2>&1; then
    log "creating Node local (stands in for a kubelet: EndpointSlices need Pods' nodeName to exist)"
    kc apply -f - >/dev/null <<'EOF' || die "could not create Node local"
apiVersion: v1
kind: Node
metadata:
  name: local
  labels:
    kubernetes.io/hostname: local
    kubernetes.io/os: linux
    reprise.dev/e2e-fake-node: "true"
EOF
  fi
  # TaintNodesByCondition admission taints new Nodes not-ready; no node
  # lifecycle controller runs to lift it. Harmless for Pods with nodeName set,
  # but keep the Node looking like a healthy one; beside a real node, keep
  # the scheduler away from it.
  local taints='[]'
  [[ "$MODE" != node ]] || taints='[{"key":"reprise.dev/fake-node","value":"true","effect":"NoSchedule"}]'
  kc patch node local --type=merge -p "{\"spec\":{\"taints\":$taints}}" >/dev/null ||
    die "could not set the taints of Node local"
  local now
  now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  kc patch node local --subresource=status --type=merge -p "{\"status\":{\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"RepriseE2E\",\"message\":\"fake node: no kubelet runs\",\"lastHeartbeatTime\":\"$now\",\"lastTransitionTime\":\"$now\"}]}}" \
    >/dev/null || die "could not set Node local status"

  log "waiting for ServiceAccount default/default (serviceaccount controller)"
  local start=$SECONDS
  until kc get serviceaccount default -n default >/dev/null 2>&1; do
    ((SECONDS - start < TIMEOUT)) ||
      fail_component kube-controller-manager "ServiceAccount default/default not created after ${TIMEOUT}s"
    sleep 0.5
  done
}

# node_ready: lifts the not-ready taint admission put on the new Node (no
# node-lifecycle controller runs) and waits until a pod can be scheduled.
node_ready() {
  kc taint node "$NODE_NAME" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
  local start=$SECONDS taints
  while true; do
    taints="$(kc get node "$NODE_NAME" -o 'jsonpath={.spec.taints}' 2>/dev/null || true)"
    [[ -n "$taints" ]] || break
    ((SECONDS - start < TIMEOUT)) || die "Node $NODE_NAME keeps taints $taints"
    kc taint node "$NODE_NAME" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
    sleep 0.5
  done
  # The images the node runs, when e2e/images.sh has built them.
  local missing
  missing="$(ctr --address "$CTRD_SOCK" -n k8s.io images ls -q 2>/dev/null | grep -c '^reprise.local/pause:dev$' || true)"
  ((missing > 0)) || log "note: no pause image yet; pods start once e2e/images.sh $DIR has imported the images"
}

# --- Commands ---------------------------------------------------------------------------------
cmd_up() {
  need_curl
  find_kubectl
  mkdir -p "$LOGS" "$PIDS"
  if command -v flock >/dev/null 2>&1; then
    exec 8>"$DIR/.lock"
    if ! flock -n 8; then
      log "waiting (up to 300s) for another e2e/cluster.sh up holding $DIR/.lock"
      flock -w 300 8 || die "another e2e/cluster.sh up still holds $DIR/.lock after 300s"
    fi
  fi
  local t0=$SECONDS
  if any_running; then
    ((FRESH == 0)) || die "--fresh: components are running in $DIR; run e2e/cluster.sh down $DIR first"
    load_state || die "components run in $DIR but $STATE is missing; run e2e/cluster.sh down $DIR"
    [[ "$MODE" == "$WANT_MODE" ]] ||
      die "the cluster in $DIR runs in $MODE mode; e2e/cluster.sh down $DIR first to start it ${WANT_MODE/node/with a node}"
    log "components already run in $DIR ($MODE mode): keeping the ports in $STATE"
  else
    if ((FRESH)); then
      log "--fresh: removing etcd data, certs, config and the node's state in $DIR (logs kept)"
      unmount_under "$DIR"
      rm -rf "$DIR/etcd" "$PKI" "$KUBECONFIG_FILE" "$DIR"/*.kubeconfig "$DIR/jaeger.yaml" "$STATE" \
        "$DIR/apiserver-certs" "$NODE_DIR"
      rm -f "$PIDS"/*.pid
    fi
    load_ports_from_env
    MODE="$WANT_MODE"
    derive
    save_state
  fi
  if [[ "$MODE" == node ]]; then
    node_packages
  fi
  load_tools
  gen_pki
  write_kubeconfigs
  [[ "$MODE" != node ]] || { write_node_config; net_up; }

  local c
  for c in $(components); do
    ensure "$c"
    [[ "$c" != kube-controller-manager ]] || bootstrap_objects
    [[ "$c" != kubelet ]] || node_ready
  done
  log "cluster up in $((SECONDS - t0))s ($MODE mode, dir $DIR)"
  print_env
}

cmd_down() {
  load_state || log "no $STATE; stopping whatever pid files remain"
  local i name stopped=0 all=("${CONTROL_PLANE[@]}" "${NODE_COMPONENTS[@]}")
  if [[ "$MODE" == node || -f "$NET_MARK" || -d "$NODE_DIR" ]]; then
    [[ -n "${BRIDGE:-}" ]] || load_ports_from_env
    derive
    # Never build on the way down: the cached binaries, if any.
    KUBE_PROXY="$(cached_tool kube-proxy)" CRICTL="$(cached_tool crictl)"
    # The pods first (while containerd runs), so that nothing is recreated:
    # the kubelet and the controllers stop before.
    for name in prometheus kube-proxy kubelet kube-scheduler kube-controller-manager; do
      stop_component "$name" && stopped=$((stopped + 1)) || true
    done
    remove_pods
  fi
  for ((i = ${#all[@]} - 1; i >= 0; i--)); do
    stop_component "${all[i]}" && stopped=$((stopped + 1)) || true
  done
  if [[ -f "$NET_MARK" ]]; then
    # containerd is gone: no shim may still hold a mount.
    unmount_under "$DIR"
    net_down
  fi
  log "down: stopped $stopped process(es); logs kept in $LOGS"
}

cmd_env() {
  load_state || die "no cluster in $DIR (no $STATE); run e2e/cluster.sh up $DIR"
  local c
  for c in $(components); do
    recorded_pid "$c" >/dev/null || log "warning: $c is not running (e2e/cluster.sh up $DIR)"
  done
  print_env
}

cmd_status() {
  if ! load_state; then
    log "no cluster in $DIR"
    for c in "${CONTROL_PLANE[@]}"; do printf '%-24s down\n' "$c"; done
    return 3
  fi
  export PATH="$PATH:/usr/sbin:/sbin"
  [[ "$MODE" != node ]] || find_kubectl
  local c pid rc=0
  for c in $(components); do
    if pid="$(recorded_pid "$c")"; then
      if command -v curl >/dev/null 2>&1 && "check_$c"; then
        printf '%-24s up (pid %s)\n' "$c" "$pid"
      else
        printf '%-24s running but not healthy (pid %s; see %s)\n' "$c" "$pid" "$LOGS/$c.log"
        rc=3
      fi
    else
      printf '%-24s down\n' "$c"
      rc=3
    fi
  done
  return "$rc"
}

cmd_import() {
  load_state || die "no cluster in $DIR (no $STATE); run e2e/cluster.sh up $DIR"
  [[ "$MODE" == node ]] || die "the cluster in $DIR has no node (--api-only): nothing to import into"
  export PATH="$PATH:/usr/sbin:/sbin"
  check_containerd || die "containerd of $DIR is not running (e2e/cluster.sh up $DIR)"
  local a out
  for a in "${ARCHIVES[@]}"; do
    [[ -f "$a" ]] || die "import: $a is not a file"
    # Like `kind load image-archive`: all platforms,
    # unpacked for the CRI's snapshotter.
    out="$(ctr --address "$CTRD_SOCK" -n k8s.io images import --all-platforms \
      --snapshotter overlayfs "$a" 2>&1)" || die "import $a: $out"
    log "imported $a: $(sed -n 's/^unpacking \([^ ]*\) (.*/\1/p' <<<"$out" | tr '\n' ' ')"
  done
}

case "$CMD" in
  up) cmd_up ;;
  down) cmd_down ;;
  env) cmd_env ;;
  status) cmd_status ;;
  import) cmd_import ;;
  -h | --help | help) usage ;;
  *)
    usage
    exit 2
    ;;
esac
