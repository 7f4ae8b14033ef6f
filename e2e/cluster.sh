#!/usr/bin/env bash
# A throwaway Kubernetes control plane plus Jaeger for the e2e tests, all on
# 127.0.0.1, no kubelet, no containers: etcd, kube-apiserver,
# kube-controller-manager and Jaeger v2 (in-memory), run as plain processes
# from the binaries e2e/build-tools.sh builds and caches.
#
# Usage:
#   e2e/cluster.sh up [--fresh] [DIR]   start what is not running, wait until healthy,
#                                       print the env lines (idempotent)
#   e2e/cluster.sh down [DIR]           stop the processes recorded in DIR/pids
#   e2e/cluster.sh env [--plain] [DIR]  print the env lines
#   e2e/cluster.sh status [DIR]         which components are up (exit 0 iff all are)
#   e2e/cluster/selftest.sh [DIR]       check tokens, TokenReview, EndpointSlices
#
# DIR defaults to ${REPRISE_E2E_DIR:-/tmp/reprise-e2e}. It holds pki/ (CA,
# serving and admin certs, service-account keys), kubeconfig (admin,
# system:masters, certs embedded), etcd/ (data), jaeger.yaml, cluster.env (the
# ports in use), logs/<name>.log and pids/<name>.pid. `down` keeps everything
# but the pid files, so a later `up` resumes the same cluster (same etcd data,
# same certs); `up --fresh` (only when nothing runs) wipes all but logs/ first.
#
# Env lines (stdout; progress goes to stderr), as `export NAME=value` so that
# `eval "$(e2e/cluster.sh env)"` works; `env --plain` drops the `export `:
#   KUBECONFIG, JAEGER_QUERY (Jaeger query HTTP API base URL),
#   OTEL_EXPORTER_OTLP_ENDPOINT (OTLP/gRPC), REPRISE_E2E_OTLP_HTTP_ENDPOINT,
#   REPRISE_E2E_DIR
#
# Ports (127.0.0.1 only; read when `up` starts a cluster, then kept in
# DIR/cluster.env while any component runs):
#   REPRISE_E2E_ETCD_PORT=23790          etcd client      REPRISE_E2E_ETCD_PEER_PORT=23800
#   REPRISE_E2E_APISERVER_PORT=26443     kube-apiserver   REPRISE_E2E_KCM_PORT=20257 (healthz)
#   REPRISE_E2E_OTLP_GRPC_PORT=24317     REPRISE_E2E_OTLP_HTTP_PORT=24318
#   REPRISE_E2E_JAEGER_QUERY_PORT=26686  REPRISE_E2E_JAEGER_GRPC_PORT=26685 (query gRPC)
# Other knobs: REPRISE_E2E_TIMEOUT (seconds per component start-up, default 120),
# KUBECTL (path; default: kubectl on PATH), REPRISE_E2E_KCM_CONTROLLERS.
#
# Without a kubelet, `up` also creates what Pods and EndpointSlices need:
#   - Node `local` (status Ready, no taints). The endpointslice controller skips
#     Pods whose spec.nodeName names no existing Node, so give Pods
#     spec.nodeName: local. Nothing schedules or runs Pods; a test sets a Pod's
#     status itself (kubectl patch pod P --subresource=status ...: phase,
#     podIP/podIPs, condition Ready=True), and the controller publishes it.
#   - it waits for ServiceAccount default/default; Pod admission needs the
#     namespace's `default` ServiceAccount, so in a new namespace wait for it.
# Caveats, all from the missing kubelet or from apiserver validation:
#   - A Pod with spec.nodeName set is deleted gracefully and waits for a kubelet
#     forever (Terminating): delete it with --grace-period=0 --force (or set its
#     status.phase to Succeeded/Failed first). Namespaces holding such Pods do
#     not finish deleting until their Pods are force-deleted.
#   - The apiserver rejects loopback (127.0.0.0/8) addresses in IPv4/IPv6
#     EndpointSlices and Endpoints (hard-coded validation), so a Pod with a
#     127.x podIP never reaches an EndpointSlice (the controller reports
#     FailedToUpdateEndpointSlices); see e2e/cluster/selftest.sh.
#   - The apiserver caches successful token authentications for 10 s, so a
#     Pod-bound token still passes TokenReview up to 10 s after its Pod goes.
#   - The `kubernetes` Service has no endpoints (--endpoint-reconciler-type=none:
#     its only address would be 127.0.0.1). Clients use KUBECONFIG.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; }

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
COMPONENTS=(etcd kube-apiserver kube-controller-manager jaeger)
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
FRESH=0 PLAIN=0
while (($#)); do
  case "$1" in
    --fresh) [[ "$CMD" == up ]] || die "--fresh is an option of 'up'"; FRESH=1 ;;
    --plain) [[ "$CMD" == env ]] || die "--plain is an option of 'env'"; PLAIN=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
  shift
done
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

# port_in_use PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
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
  local p
  for p in ETCD_PORT ETCD_PEER_PORT APISERVER_PORT KCM_PORT OTLP_GRPC_PORT OTLP_HTTP_PORT \
    JAEGER_QUERY_PORT JAEGER_GRPC_PORT; do
    [[ "${!p}" =~ ^[0-9]+$ ]] && ((${!p} > 0 && ${!p} < 65536)) || die "REPRISE_E2E_$p=${!p} is not a port"
  done
}

load_state() {
  [[ -f "$STATE" ]] || return 1
  # shellcheck disable=SC1090
  source "$STATE"
}

save_state() {
  cat >"$STATE.tmp" <<EOF
# Written by e2e/cluster.sh up; the ports of the cluster in this directory.
ETCD_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
APISERVER_PORT=$APISERVER_PORT
KCM_PORT=$KCM_PORT
OTLP_GRPC_PORT=$OTLP_GRPC_PORT
OTLP_HTTP_PORT=$OTLP_HTTP_PORT
JAEGER_QUERY_PORT=$JAEGER_QUERY_PORT
JAEGER_GRPC_PORT=$JAEGER_GRPC_PORT
EOF
  mv -f "$STATE.tmp" "$STATE"
}

any_running() {
  local c
  for c in "${COMPONENTS[@]}"; do
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

# --- Files ----------------------------------------------------------------------------
gen_pki() {
  local want=(ca.crt ca.key serving.crt serving.key admin.crt admin.key sa.key sa.pub) f missing=0
  for f in "${want[@]}"; do [[ -s "$PKI/$f" ]] || missing=1; done
  ((missing)) || return 0
  command -v openssl >/dev/null 2>&1 || die "openssl is required (apt-get install openssl)"
  log "generating CA, serving/admin certs and service-account keys in $PKI"
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
    signed serving "/CN=kube-apiserver" \
      "basicConstraints=critical,CA:FALSE" \
      "keyUsage=critical,digitalSignature,keyEncipherment" \
      "extendedKeyUsage=serverAuth" \
      "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc.cluster.local,IP:10.96.0.1"
    signed admin "/O=system:masters/CN=reprise-e2e-admin" \
      "basicConstraints=critical,CA:FALSE" \
      "keyUsage=critical,digitalSignature,keyEncipherment" \
      "extendedKeyUsage=clientAuth"
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key
    openssl pkey -in sa.key -pubout -out sa.pub
    chmod 600 ./*.key
  ) || {
    cat "$tmp/openssl.log" >&2 2>/dev/null || true
    rm -rf "$tmp"
    die "openssl failed"
  }
  rm -f "$tmp/openssl.log"
  rm -rf "$PKI" "$KUBECONFIG_FILE"
  mv "$tmp" "$PKI"
}

write_kubeconfig() {
  local b64=(base64 -w0)
  base64 -w0 </dev/null >/dev/null 2>&1 || b64=(base64)
  cat >"$KUBECONFIG_FILE.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: reprise-e2e
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $("${b64[@]}" <"$PKI/ca.crt" | tr -d '\n')
users:
- name: reprise-e2e-admin
  user:
    client-certificate-data: $("${b64[@]}" <"$PKI/admin.crt" | tr -d '\n')
    client-key-data: $("${b64[@]}" <"$PKI/admin.key" | tr -d '\n')
contexts:
- name: reprise-e2e
  context:
    cluster: reprise-e2e
    user: reprise-e2e-admin
    namespace: default
current-context: reprise-e2e
EOF
  chmod 600 "$KUBECONFIG_FILE.tmp"
  mv -f "$KUBECONFIG_FILE.tmp" "$KUBECONFIG_FILE"
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
  local envfile
  envfile="$("$E2E_DIR/build-tools.sh" --env-file)" || die "e2e/build-tools.sh failed"
  # shellcheck disable=SC1090
  source "$envfile"
  local v
  for v in KUBE_APISERVER KUBE_CONTROLLER_MANAGER ETCD JAEGER; do
    [[ -x "${!v:-}" ]] || die "$v=${!v:-} from $envfile is not executable"
  done
}

kc() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" --request-timeout=20s "$@"; }

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
      # --endpoint-reconciler-type=none: the `kubernetes` Service would get
      # 127.0.0.1 as its endpoint, which Endpoints validation rejects (loopback).
      start kube-apiserver "$KUBE_APISERVER" \
        --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
        --bind-address=127.0.0.1 \
        --advertise-address=127.0.0.1 \
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
        --service-cluster-ip-range=10.96.0.0/16 \
        --allow-privileged=true \
        --endpoint-reconciler-type=none \
        --cert-dir="$DIR/apiserver-certs" \
        --profiling=false \
        --v=1
      ;;
    kube-controller-manager)
      port_in_use "$KCM_PORT" &&
        die "kube-controller-manager: 127.0.0.1:$KCM_PORT is in use by another process (set REPRISE_E2E_KCM_PORT)"
      # No --authentication/authorization-kubeconfig: its /healthz is always
      # allowed anyway, and with them it keeps failing to read the (absent)
      # requestheader CA from kube-system/extension-apiserver-authentication.
      start kube-controller-manager "$KUBE_CONTROLLER_MANAGER" \
        --kubeconfig="$KUBECONFIG_FILE" \
        --controllers="${REPRISE_E2E_KCM_CONTROLLERS:-endpointslice-controller,endpoints-controller,serviceaccount-controller,serviceaccount-token-controller,namespace-controller,garbage-collector-controller,root-ca-certificate-publisher-controller,clusterrole-aggregation-controller}" \
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
  esac
  wait_healthy "$name" "check_$name"
}

# bootstrap_objects: the cluster objects that stand in for a kubelet.
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
  # but keep the Node looking like a healthy one.
  kc patch node local --type=json -p '[{"op":"replace","path":"/spec/taints","value":[]}]' >/dev/null 2>&1 ||
    true
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
    log "components already run in $DIR: keeping the ports in $STATE"
  else
    if ((FRESH)); then
      log "--fresh: removing etcd data, certs and config in $DIR (logs kept)"
      rm -rf "$DIR/etcd" "$PKI" "$KUBECONFIG_FILE" "$DIR/jaeger.yaml" "$STATE" "$DIR/apiserver-certs"
      rm -f "$PIDS"/*.pid
    fi
    load_ports_from_env
    save_state
  fi
  load_tools
  gen_pki
  [[ -s "$KUBECONFIG_FILE" ]] && grep -q "127.0.0.1:$APISERVER_PORT\$" "$KUBECONFIG_FILE" || write_kubeconfig

  local c
  for c in "${COMPONENTS[@]}"; do
    ensure "$c"
    [[ "$c" != kube-controller-manager ]] || bootstrap_objects
  done
  log "cluster up in $((SECONDS - t0))s (dir $DIR)"
  print_env
}

cmd_down() {
  load_state || log "no $STATE; stopping whatever pid files remain"
  local i name pid stopped=0
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    name="${COMPONENTS[i]}"
    [[ -f "$PIDS/$name.pid" ]] || continue
    if ! pid="$(recorded_pid "$name")"; then
      log "$name: not running (stale pid file removed)"
      rm -f "$PIDS/$name.pid"
      continue
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
    stopped=$((stopped + 1))
  done
  log "down: stopped $stopped process(es); logs kept in $LOGS"
}

cmd_env() {
  load_state || die "no cluster in $DIR (no $STATE); run e2e/cluster.sh up $DIR"
  local c
  for c in "${COMPONENTS[@]}"; do
    recorded_pid "$c" >/dev/null || log "warning: $c is not running (e2e/cluster.sh up $DIR)"
  done
  print_env
}

cmd_status() {
  if ! load_state; then
    log "no cluster in $DIR"
    for c in "${COMPONENTS[@]}"; do printf '%-24s down\n' "$c"; done
    return 3
  fi
  local c pid all=0
  for c in "${COMPONENTS[@]}"; do
    if pid="$(recorded_pid "$c")"; then
      if command -v curl >/dev/null 2>&1 && "check_$c"; then
        printf '%-24s up (pid %s)\n' "$c" "$pid"
      else
        printf '%-24s running but not healthy (pid %s; see %s)\n' "$c" "$pid" "$LOGS/$c.log"
        all=3
      fi
    else
      printf '%-24s down\n' "$c"
      all=3
    fi
  done
  return "$all"
}

case "$CMD" in
  up) cmd_up ;;
  down) cmd_down ;;
  env) cmd_env ;;
  status) cmd_status ;;
  -h | --help | help) usage ;;
  *)
    usage
    exit 2
    ;;
esac
