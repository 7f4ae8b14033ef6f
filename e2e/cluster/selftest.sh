#!/usr/bin/env bash
# Checks a cluster started by `e2e/cluster.sh up [DIR]` does what the e2e tests
# rely on without a kubelet; exits non-zero on the first failure.
#
#   e2e/cluster/selftest.sh [DIR]     (DIR as for e2e/cluster.sh)
#
# In a fresh namespace (deleted at the end):
#   1. components healthy, Node `local` Ready, ServiceAccount `default` created
#      by the serviceaccount controller, kube-root-ca.crt published;
#   2. a token from `kubectl create token default --audience reprise
#      --bound-object-kind Pod ...` passes a TokenReview for audience
#      "reprise" with user.extra authentication.kubernetes.io/pod-name and
#      pod-uid; the same review fails for another audience, and after the Pod
#      is deleted;
#   3. a Service with a selector and a Pod (spec.nodeName: local) whose status
#      is patched to Running/Ready with a podIP get an EndpointSlice from the
#      endpointslice controller with that address, ready=true, the Pod as
#      targetRef, nodeName local and the target port;
#   4. Jaeger: an OTLP/HTTP span shows up in the query API.
# Then it reports (without failing) the loopback limitation: EndpointSlices
# (and Endpoints) reject 127.0.0.0/8 addresses, so a Pod with podIP 127.0.0.21
# gets no endpoint; a hand-made addressType FQDN slice holding "127.0.0.21" is
# accepted.
#
# SELFTEST_POD_IP (default 10.244.0.21) is the podIP used for check 3; it must
# not be loopback, link-local or unspecified. Nothing is ever sent to it.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CLUSTER="$HERE/../cluster.sh"
DIR="${1:-${REPRISE_E2E_DIR:-/tmp/reprise-e2e}}"
POD_IP="${SELFTEST_POD_IP:-10.244.0.21}"
LOOPBACK_IP=127.0.0.21
WAIT="${SELFTEST_TIMEOUT:-30}"

log() { printf '[selftest %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
PASSED=0
pass() {
  PASSED=$((PASSED + 1))
  log "ok: $*"
}
fail() {
  log "FAIL: $*"
  exit 1
}

"$CLUSTER" status "$DIR" >&2 || fail "cluster in $DIR is not (fully) up: run e2e/cluster.sh up $DIR"
eval "$("$CLUSTER" env "$DIR")"
KUBECTL="${KUBECTL:-$(command -v kubectl || true)}"
[[ -n "$KUBECTL" ]] || fail "kubectl not found (set KUBECTL)"
kc() { "$KUBECTL" --request-timeout=20s "$@"; }

NS="reprise-selftest-$(date +%s)-$$"
cleanup() {
  local rc=$?
  # Pods bound to a node wait for a kubelet to confirm deletion; there is
  # none, so delete them with grace period 0 or the namespace never goes.
  kc delete pods --all -n "$NS" --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
  kc delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
  if ((rc == 0)); then
    log "PASS: $PASSED checks"
  else
    log "FAILED after $PASSED passing checks (namespace $NS deleted; logs in $DIR/logs)"
  fi
}
trap cleanup EXIT

# poll SECONDS CMD...: retries CMD every 0.5 s until it succeeds or time runs out.
poll() {
  local secs="$1" start=$SECONDS
  shift
  until "$@"; do
    ((SECONDS - start < secs)) || return 1
    sleep 0.5
  done
}

# --- 1. Cluster basics --------------------------------------------------------------
[[ "$(kc get --raw /readyz)" == ok ]] || fail "apiserver /readyz"
pass "apiserver /readyz"
[[ "$(kc get node local -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]] ||
  fail "Node local missing or not Ready"
pass "Node local exists and is Ready"

kc create namespace "$NS" >/dev/null || fail "create namespace $NS"
poll "$WAIT" kc get serviceaccount default -n "$NS" -o name >/dev/null 2>&1 ||
  fail "serviceaccount controller did not create $NS/default in ${WAIT}s"
pass "ServiceAccount $NS/default created by the controller"
poll "$WAIT" kc get configmap kube-root-ca.crt -n "$NS" -o name >/dev/null 2>&1 ||
  fail "root-ca-certificate-publisher did not create $NS/kube-root-ca.crt in ${WAIT}s"
pass "ConfigMap $NS/kube-root-ca.crt published"

# pod NAME LABEL-VALUE: a Pod bound to Node local (never runs).
pod() {
  kc apply -n "$NS" -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  labels: {app: $2}
spec:
  nodeName: local
  serviceAccountName: default
  containers:
  - name: app
    image: example.invalid/never-pulled:0
    ports: [{name: http, containerPort: 8080}]
EOF
}

# review TOKEN AUDIENCE: prints "authenticated|username|pod-name|pod-uid|audiences|error".
review() {
  kc create -o go-template='{{if .status.authenticated}}true{{else}}false{{end}}|{{with .status.user}}{{.username}}|{{with .extra}}{{index . "authentication.kubernetes.io/pod-name"}}|{{index . "authentication.kubernetes.io/pod-uid"}}{{end}}{{end}}|{{with .status.audiences}}{{.}}{{end}}|{{with .status.error}}{{.}}{{end}}{{"\n"}}' \
    -f - <<EOF
apiVersion: authentication.k8s.io/v1
kind: TokenReview
spec:
  token: "$1"
  audiences: ["$2"]
EOF
}

# --- 2. Pod-bound token + TokenReview -------------------------------------------------
pod tok tok || fail "create Pod $NS/tok"
UID_TOK="$(kc get pod tok -n "$NS" -o jsonpath='{.metadata.uid}')"
TOKEN="$(kc create token default -n "$NS" --audience reprise --bound-object-kind Pod \
  --bound-object-name tok --bound-object-uid "$UID_TOK")" || fail "kubectl create token"
pass "kubectl create token bound to Pod tok (uid $UID_TOK)"

got="$(review "$TOKEN" reprise)" || fail "TokenReview create"
want="true|system:serviceaccount:$NS:default|[tok]|[$UID_TOK]|[reprise]|"
[[ "$got" == "$want" ]] || fail "TokenReview(audience reprise): got '$got', want '$want'"
pass "TokenReview accepts it for audience reprise; user.extra has pod-name [tok] and pod-uid"

got="$(review "$TOKEN" https://kubernetes.default.svc)" || fail "TokenReview create"
[[ "$got" == false* ]] || fail "TokenReview(audience https://kubernetes.default.svc) should fail, got '$got'"
pass "TokenReview rejects it for another audience (${got##*|})"

kc delete pod tok -n "$NS" --grace-period=0 --force >/dev/null 2>&1 || fail "delete Pod tok"
poll "$WAIT" bash -c '[[ "$("$0" --request-timeout=20s get pod tok -n "$1" -o name 2>&1)" == *NotFound* ]]' \
  "$KUBECTL" "$NS" || fail "Pod tok still exists after force delete"
rejected() {
  got="$(review "$TOKEN" reprise)" && [[ "$got" == false* ]]
}
poll "$WAIT" rejected || fail "TokenReview still accepts the token of deleted Pod tok: '$got'"
pass "TokenReview rejects it once Pod tok is deleted (${got##*|})"

# --- 3. Service + Pod status -> EndpointSlice ------------------------------------------
kc apply -n "$NS" -f - >/dev/null <<EOF || fail "create Service web"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
EOF
pod web-1 web || fail "create Pod web-1"
status_patch() {
  printf '{"status":{"phase":"Running","podIP":"%s","podIPs":[{"ip":"%s"}],"conditions":[{"type":"Ready","status":"True"}]}}' "$1" "$1"
}
kc patch pod web-1 -n "$NS" --subresource=status --type=merge -p "$(status_patch "$POD_IP")" >/dev/null ||
  fail "patch Pod web-1 status"
pass "Pod web-1 status patched: Running, Ready, podIP $POD_IP"

slice_of() {
  kc get endpointslices -n "$NS" -l "kubernetes.io/service-name=$1" \
    -o go-template='{{range .items}}{{$p := .ports}}{{range .endpoints}}{{index .addresses 0}} ready={{.conditions.ready}} pod={{.targetRef.name}} node={{.nodeName}} port={{range $p}}{{.port}}{{end}}{{"\n"}}{{end}}{{end}}'
}
want="$POD_IP ready=true pod=web-1 node=local port=8080"
got=""
check_slice() {
  got="$(slice_of web 2>&1)"
  [[ "$got" == "$want" ]]
}
poll "$WAIT" check_slice || fail "EndpointSlice for web: got '$got', want '$want' (see $DIR/logs/kube-controller-manager.log)"
pass "EndpointSlice for Service web: $want"

kc patch pod web-1 -n "$NS" --subresource=status --type=json \
  -p '[{"op":"replace","path":"/status/conditions/0/status","value":"False"}]' >/dev/null ||
  fail "patch Pod web-1 not ready"
want="$POD_IP ready=false pod=web-1 node=local port=8080"
poll "$WAIT" check_slice || fail "EndpointSlice after Ready=False: got '$got', want '$want'"
pass "EndpointSlice follows Ready=False"

# --- 4. Jaeger: OTLP/HTTP in, query API out ---------------------------------------------
TRACE_ID="$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
SPAN_ID="$(od -An -tx1 -N8 /dev/urandom | tr -d ' \n')"
now_ns="$(date +%s%N)"
curl --noproxy '*' -fsS -m 5 -H 'Content-Type: application/json' "$REPRISE_E2E_OTLP_HTTP_ENDPOINT/v1/traces" -d @- >/dev/null <<EOF ||
{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"reprise-selftest"}}]},
 "scopeSpans":[{"spans":[{"traceId":"$TRACE_ID","spanId":"$SPAN_ID","name":"selftest","kind":1,
 "startTimeUnixNano":"$((now_ns - 1000000))","endTimeUnixNano":"$now_ns"}]}]}]}
EOF
  fail "POST OTLP/HTTP span to $REPRISE_E2E_OTLP_HTTP_ENDPOINT"
poll "$WAIT" bash -c 'curl --noproxy "*" -fsS -m 2 "$0/api/traces/$1" 2>/dev/null | grep -q "\"operationName\":\"selftest\""' \
  "$JAEGER_QUERY" "$TRACE_ID" || fail "span $TRACE_ID not found via $JAEGER_QUERY/api/traces"
pass "Jaeger: OTLP/HTTP span found via the query API"

# --- Notes: loopback addresses -------------------------------------------------------------
pod web-lo web-lo || fail "create Pod web-lo"
kc apply -n "$NS" -f - >/dev/null <<EOF || fail "create Service web-lo"
apiVersion: v1
kind: Service
metadata: {name: web-lo}
spec:
  selector: {app: web-lo}
  ports: [{name: http, port: 80, targetPort: 8080}]
EOF
kc patch pod web-lo -n "$NS" --subresource=status --type=merge -p "$(status_patch "$LOOPBACK_IP")" >/dev/null ||
  fail "patch Pod web-lo status"
if poll 5 bash -c '[[ -n "$("$0" --request-timeout=20s get endpointslices -n "$1" -l kubernetes.io/service-name=web-lo -o jsonpath="{.items[*].endpoints[*].addresses[*]}")" ]]' \
  "$KUBECTL" "$NS"; then
  log "NOTE: a Pod with podIP $LOOPBACK_IP DID get an EndpointSlice address (loopback accepted?)"
else
  log "NOTE: Pod podIP $LOOPBACK_IP (loopback) gets no EndpointSlice address: the apiserver rejects loopback"
  log "      in EndpointSlices/Endpoints ($(kc get events -n "$NS" --field-selector reason=FailedToUpdateEndpointSlices \
    -o jsonpath='{.items[0].message}' 2>/dev/null | grep -o 'may not be in the loopback range[^"]*' | head -n1))"
fi
if kc create --dry-run=server -n "$NS" -o name -f - >/dev/null 2>&1 <<EOF; then
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-lo-manual
  labels: {kubernetes.io/service-name: web-lo, endpointslice.kubernetes.io/managed-by: reprise-e2e}
addressType: FQDN
endpoints: [{addresses: ["$LOOPBACK_IP"], conditions: {ready: true}, targetRef: {kind: Pod, name: web-lo}}]
ports: [{name: http, port: 8080, protocol: TCP}]
EOF
  log "NOTE: a hand-made EndpointSlice with addressType FQDN and address \"$LOOPBACK_IP\" is accepted (deprecated type)"
else
  log "NOTE: a hand-made FQDN EndpointSlice with address \"$LOOPBACK_IP\" is rejected too"
fi
