#!/usr/bin/env bash
# Static checks of the Helm chart in charts/reprise; no cluster needed.
#
#   charts/test.sh            (HELM=, PROMTOOL= to pick the binaries)
#
# Lints the chart (--strict), renders it with `helm template` for every
# documented combination of values and asserts what must hold for each
# (structurally with python3 + PyYAML when importable, else with grep), checks
# that bad values are refused by values.schema.json with the field named, and
# that the chart's CRD is byte-identical to crds/retrypolicy.yaml. The
# PrometheusRule's groups go through `promtool check rules` and the unit tests
# of charts/alerts.test.yaml (`promtool test rules`). Every render is for
# the oldest Kubernetes the chart's kubeVersion admits (KUBE_VERSION): helm
# template's own default is too old for it (1.20 in a helm built without
# the release's flags, as e2e/build-tools.sh builds it).
# One line per check; exits non-zero when any check fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHART="$ROOT/charts/reprise"
HELM="${HELM:-$HOME/.cache/reprise-tools/helm-v3.22.0/helm}"
PROMTOOL="${PROMTOOL:-$HOME/.cache/reprise-tools/promtool-v3.16.0/promtool}"
RELEASE=reprise
NS=reprise-system
KUBE_VERSION="${KUBE_VERSION:-1.28.0}"

[[ -x "$HELM" ]] || {
  echo "helm not found at $HELM (set HELM, or build it with e2e/build-tools.sh)" >&2
  exit 2
}
[[ -x "$PROMTOOL" ]] || {
  echo "promtool not found at $PROMTOOL (set PROMTOOL, or build it with e2e/build-tools.sh)" >&2
  exit 2
}

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

PASSED=0
FAILED=0
pass() {
  PASSED=$((PASSED + 1))
  echo "ok   $*"
}
fail() {
  FAILED=$((FAILED + 1))
  echo "FAIL $*"
}

# Structural assertions need PyYAML; without it (or with CHART_TEST_GREP=1)
# every check falls back to its grep patterns.
if [[ -z "${CHART_TEST_GREP:-}" ]] && python3 -c 'import yaml' 2>/dev/null; then
  MODE=yaml
else
  MODE=grep
fi
echo "chart: checking $CHART with $("$HELM" version --short) (assertions: $MODE)"

cat >"$TMP/q.py" <<'PY'
import json, sys, yaml

docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]

def find(kind, name=None):
    return [d for d in docs if d.get("kind") == kind
            and (name is None or d["metadata"]["name"] == name)]

def one(kind, name=None):
    found = find(kind, name)
    if len(found) != 1:
        raise AssertionError(f"expected one {kind} {name or ''}, found {len(found)}")
    return found[0]

def pod(name="reprise-controller"):
    return one("Deployment", name)["spec"]["template"]["spec"]

def container(name="reprise-controller"):
    return pod(name)["containers"][0]

def args():
    return container()["args"]

def env():
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container().get("env", [])}

def webhooks():
    return one("MutatingWebhookConfiguration")["webhooks"]

def webhook(name="inject.reprise.dev"):
    found = [w for w in webhooks() if w["name"] == name]
    if len(found) != 1:
        raise AssertionError(f"expected one webhook {name}, found {len(found)}")
    return found[0]

def transparent_webhook():
    return webhook("transparent.inject.reprise.dev")

def selector_rest(w):
    # The namespace selector's expressions other than the transparent label's.
    return [e for e in w["namespaceSelector"]["matchExpressions"] if e["key"] != "reprise.dev/transparent"]

def transparent_expr(w):
    return [e for e in w["namespaceSelector"]["matchExpressions"] if e["key"] == "reprise.dev/transparent"]

def injection():
    return yaml.safe_load(one("ConfigMap", "reprise-injection")["data"]["injection.yaml"])

def rules():
    return [r for d in find("ClusterRole") + find("Role") for r in d.get("rules", [])]

def containers():
    out = []
    for d in find("Deployment") + find("Pod"):
        spec = d["spec"]["template"]["spec"] if d["kind"] == "Deployment" else d["spec"]
        out += [(d, c) for c in spec["containers"] + spec.get("initContainers", [])]
    return out

def hardened(d, c):
    spec = d["spec"]["template"]["spec"] if d["kind"] == "Deployment" else d["spec"]
    p, s = spec["securityContext"], c["securityContext"]
    return (p["runAsNonRoot"] and p["seccompProfile"]["type"] == "RuntimeDefault"
            and s["runAsNonRoot"] and s["runAsUser"] == 65532
            and s["readOnlyRootFilesystem"] and s["allowPrivilegeEscalation"] is False
            and s["capabilities"]["drop"] == ["ALL"]
            and s["seccompProfile"]["type"] == "RuntimeDefault")

def podspec(d):
    return d["spec"]["template"]["spec"] if d["kind"] == "Deployment" else d["spec"]

def test_objects():
    # What `helm test` creates: the selftest Pod and its RBAC.
    return [d for d in docs if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "test"]

def dashboard(name="reprise-dashboard"):
    return json.loads(one("ConfigMap", name)["data"]["reprise.json"])

def alerts():
    return {r["alert"]: r for g in one("PrometheusRule")["spec"]["groups"] for r in g["rules"]}

def valid():
    # Every document is a Kubernetes object; no duplicate kind/namespace/name.
    seen = set()
    for d in docs:
        key = (d["apiVersion"], d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
        assert key not in seen, f"duplicate {key}"
        seen.add(key)
    return f"{len(docs)} documents"

# argv[2]: file of NUL-separated expressions; one result line each:
# "ok[ detail]" or "no[ error]".
for expr in open(sys.argv[2]).read().split("\0"):
    if not expr:
        continue
    try:
        result = eval(expr)
        detail = f" ({result})" if isinstance(result, str) else ""
        print(("ok" if result else "no") + detail)
    except Exception as e:
        print(f"no ({type(e).__name__}: {e})".replace("\n", " "))
PY

# Checks of the current render, evaluated together by flush (one python3
# start per render: importing yaml is the slow part).
CURRENT=""
DESCS=()
EXPRS=()

# flush: evaluates the queued checks of the current render (yaml mode).
flush() {
  ((${#EXPRS[@]})) || return 0
  printf '%s\0' "${EXPRS[@]}" >"$TMP/exprs"
  local results=() i line
  if python3 "$TMP/q.py" "$TMP/$CURRENT.yaml" "$TMP/exprs" >"$TMP/results" 2>"$TMP/q.err"; then
    mapfile -t results <"$TMP/results"
  fi
  for i in "${!EXPRS[@]}"; do
    line="${results[$i]:-no ($(tail -1 "$TMP/q.err"))}"
    if [[ $line == ok* ]]; then
      pass "$CURRENT: ${DESCS[$i]}${line#ok}"
    else
      fail "$CURRENT: ${DESCS[$i]}${line#no}"
    fi
  done
  DESCS=()
  EXPRS=()
}

# render NAME [helm args...]: renders into $TMP/NAME.yaml and checks that the
# output is valid YAML made of distinct Kubernetes objects.
render() {
  flush
  CURRENT="$1"
  shift
  if "$HELM" template "$RELEASE" "$CHART" -n "$NS" --kube-version "$KUBE_VERSION" "$@" >"$TMP/$CURRENT.yaml" 2>"$TMP/$CURRENT.err"; then
    check "renders valid YAML${*:+ with $*}" 'valid()' '+^kind: '
  else
    fail "$CURRENT: helm template failed: $(head -3 "$TMP/$CURRENT.err" | tr '\n' ' ')"
    : >"$TMP/$CURRENT.yaml"
  fi
}

# check DESCRIPTION PYTHON-EXPR [+REGEX|-REGEX ...], about the current render.
# With PyYAML the expression is evaluated against the rendered documents
# (helpers in q.py); otherwise every +REGEX must and every -REGEX must not
# match a line of the rendered output (grep -E).
check() {
  local desc="$1" expr="$2"
  shift 2
  if [[ $MODE == yaml ]]; then
    DESCS+=("$desc")
    EXPRS+=("$expr")
    return 0
  fi
  local spec ok=1
  for spec in "$@"; do
    case "$spec" in
      +*) grep -Eq -- "${spec:1}" "$TMP/$CURRENT.yaml" || ok=0 ;;
      -*) ! grep -Eq -- "${spec:1}" "$TMP/$CURRENT.yaml" || ok=0 ;;
    esac
  done
  if ((ok)); then
    pass "$CURRENT: $desc"
  else
    fail "$CURRENT: $desc"
  fi
}

# refuse DESCRIPTION FIELD [helm args...]: helm template must fail and name FIELD.
refuse() {
  local desc="$1" field="$2"
  shift 2
  if "$HELM" template "$RELEASE" "$CHART" -n "$NS" --kube-version "$KUBE_VERSION" "$@" >/dev/null 2>"$TMP/refuse.err"; then
    fail "schema: $desc was accepted ($*)"
  elif grep -q -- "$field" "$TMP/refuse.err"; then
    pass "schema: $desc refused, naming $field"
  else
    fail "schema: $desc refused without naming $field: $(head -3 "$TMP/refuse.err" | tr '\n' ' ')"
  fi
}

SVC="reprise-controller.$NS.svc"

# --- lint and CRD copy ---------------------------------------------------------------
if "$HELM" lint "$CHART" --strict --kube-version "$KUBE_VERSION" >"$TMP/lint.out" 2>&1; then
  pass "lint: helm lint --strict"
else
  fail "lint: $(grep -E 'ERROR|WARNING' "$TMP/lint.out" | head -3 | tr '\n' ' ')"
fi
if "$HELM" lint "$CHART" --strict --kube-version "$KUBE_VERSION" --set grafanaDashboard.enabled=true --set prometheusRule.enabled=true \
  --set podMonitor.enabled=true >"$TMP/lint.out" 2>&1; then
  pass "lint: helm lint --strict with the dashboard, the PrometheusRule and the PodMonitor"
else
  fail "lint (dashboard, PrometheusRule, PodMonitor): $(grep -E 'ERROR|WARNING' "$TMP/lint.out" | head -3 | tr '\n' ' ')"
fi
# kubeVersion: the CRD's validation rules name their field (fieldPath),
# which Kubernetes serves from 1.28; vendors' version suffixes still match.
if grep -qx 'kubeVersion: ">=1.28.0-0"' "$CHART/Chart.yaml" &&
  ! "$HELM" template "$RELEASE" "$CHART" --kube-version 1.27.16 >/dev/null 2>"$TMP/kube.err" &&
  grep -q 'incompatible with Kubernetes v1.27.16' "$TMP/kube.err" &&
  "$HELM" template "$RELEASE" "$CHART" --kube-version 1.28.0 >/dev/null 2>&1 &&
  "$HELM" template "$RELEASE" "$CHART" --kube-version v1.32.13-eks-1a2b3c4 >/dev/null 2>&1; then
  pass "kubeVersion >=1.28.0-0: 1.27 refused, 1.28.0 and a vendor's v1.32.13-eks-1a2b3c4 admitted"
else
  fail "kubeVersion: expected >=1.28.0-0 refusing 1.27.16 and admitting 1.28.0 and v1.32.13-eks-1a2b3c4 ($(head -1 "$TMP/kube.err" 2>/dev/null))"
fi
if cmp -s "$CHART/crds/retrypolicy.yaml" "$ROOT/crds/retrypolicy.yaml"; then
  pass "crd: charts/reprise/crds/retrypolicy.yaml == crds/retrypolicy.yaml"
else
  fail "crd: charts/reprise/crds/retrypolicy.yaml differs from crds/retrypolicy.yaml (cp it over)"
fi

# --- defaults ------------------------------------------------------------------------
render defaults
check "2 controller replicas, PDB minAvailable 1" \
  'pod() and one("Deployment","reprise-controller")["spec"]["replicas"] == 2 and one("PodDisruptionBudget")["spec"]["minAvailable"] == 1' \
  '+^kind: PodDisruptionBudget' '+^  replicas: 2$' '+minAvailable: 1'
check "controller runs 'run' with the Secret and webhook-configuration flags" \
  'args()[:2] == ["run","--leader-election"] and "--tls-secret=reprise-tls" in args() and "--webhook-configuration=reprise-sidecar-injector" in args() and not any(a.startswith("--tls-dir") for a in args())' \
  '+- --tls-secret=reprise-tls' '+- --webhook-configuration=reprise-sidecar-injector' '---tls-dir'
check "listeners, injection config and TLS SANs in args" \
  'all(a in args() for a in ["--push-addr=0.0.0.0:15010","--metrics-addr=0.0.0.0:15020","--webhook-addr=0.0.0.0:9443","--injection-config=/etc/reprise/injection.yaml","--tls-san='"$SVC"'","--tls-san='"$SVC"'.cluster.local"])' \
  '+--webhook-addr=0.0.0.0:9443' "+--tls-san=$SVC\$" "+--tls-san=$SVC.cluster.local"
check "Service reprise-controller: push 15010, metrics 15020, webhook 443->9443" \
  '{(p["name"],p["port"],p["targetPort"]) for p in one("Service","reprise-controller")["spec"]["ports"]} == {("push",15010,"push"),("metrics",15020,"metrics"),("webhook",443,"webhook")} and {p["containerPort"] for p in container()["ports"]} == {15010,15020,9443}' \
  '+^  name: reprise-controller$' '+port: 443' '+containerPort: 9443'
check "probes: /readyz and /healthz on the metrics port" \
  'container()["readinessProbe"]["httpGet"] == {"path":"/readyz","port":"metrics"} and container()["livenessProbe"]["httpGet"] == {"path":"/healthz","port":"metrics"}' \
  '+path: /readyz' '+path: /healthz'
check "POD_NAME/POD_NAMESPACE from the downward API, REPRISE_LOG, no OTEL_*" \
  'env()["POD_NAME"] == {"fieldRef":{"fieldPath":"metadata.name"}} and env()["POD_NAMESPACE"] == {"fieldRef":{"fieldPath":"metadata.namespace"}} and env()["REPRISE_LOG"] == "info" and not any(k.startswith("OTEL_") for k in env())' \
  '+name: POD_NAMESPACE' '+fieldPath: metadata.name' '-OTEL_'
check "webhook: service clientConfig /inject:443, Ignore, 5s, Never, no caBundle" \
  'webhook()["clientConfig"] == {"service":{"name":"reprise-controller","namespace":"'"$NS"'","path":"/inject","port":443}} and webhook()["failurePolicy"] == "Ignore" and webhook()["timeoutSeconds"] == 5 and webhook()["reinvocationPolicy"] == "Never" and webhook()["sideEffects"] == "None" and webhook()["admissionReviewVersions"] == ["v1"]' \
  '+path: /inject' '+failurePolicy: Ignore' '+timeoutSeconds: 5' '-^ +caBundle:' '-^    url:'
check "webhook selects CREATE pods in enabled namespaces, not $NS/kube-system, not opted-out pods" \
  'webhook()["rules"] == [{"operations":["CREATE"],"apiGroups":[""],"apiVersions":["v1"],"resources":["pods"],"scope":"Namespaced"}] and webhook()["namespaceSelector"]["matchLabels"] == {"reprise.dev/inject":"enabled"} and selector_rest(webhook()) == [{"key":"kubernetes.io/metadata.name","operator":"NotIn","values":["'"$NS"'","kube-system"]}] and webhook()["objectSelector"]["matchExpressions"] == [{"key":"reprise.dev/inject","operator":"NotIn","values":["disabled"]}]' \
  '+reprise.dev/inject: enabled' '+- "kube-system"' "+- \"$NS\"" '+values: \["disabled"\]'
check "two webhook entries: /inject for namespaces not labelled reprise.dev/transparent=enabled, /inject/transparent for those" \
  '[w["name"] for w in webhooks()] == ["inject.reprise.dev","transparent.inject.reprise.dev"] and transparent_expr(webhook()) == [{"key":"reprise.dev/transparent","operator":"NotIn","values":["enabled"]}] and transparent_expr(transparent_webhook()) == [{"key":"reprise.dev/transparent","operator":"In","values":["enabled"]}] and transparent_webhook()["clientConfig"] == {"service":{"name":"reprise-controller","namespace":"'"$NS"'","path":"/inject/transparent","port":443}}' \
  '+name: transparent.inject.reprise.dev' '+path: /inject/transparent' '+operator: In' '+key: reprise.dev/transparent'
check "the transparent entry differs only in name, selector and path (same injection label, exclusions, opt-out, policy)" \
  'all(webhook()[k] == transparent_webhook()[k] for k in ("rules","objectSelector","failurePolicy","timeoutSeconds","reinvocationPolicy","sideEffects","admissionReviewVersions")) and selector_rest(webhook()) == selector_rest(transparent_webhook()) and transparent_webhook()["namespaceSelector"]["matchLabels"] == {"reprise.dev/inject":"enabled"} and "caBundle" not in transparent_webhook()["clientConfig"]' \
  '+name: inject.reprise.dev' '-^ +caBundle:'
check "injection.yaml: sidecar image, controller address, camelCase keys" \
  'injection() == {"image":"ghcr.io/reprise-dev/reprise-sidecar:0.1.0","imagePullPolicy":"IfNotPresent","controllerAddress":"https://'"$SVC"':15010","serverName":"'"$SVC"'","proxyPort":15001,"adminPort":15000,"redirectPort":15006,"proxyUid":65532,"logLevel":"info","diagnosticsRetained":100,"resources":{"requests":{"cpu":"50m","memory":"32Mi"},"limits":{"memory":"128Mi"}},"otel":{"endpoint":"","protocol":"grpc","sampler":"parentbased_traceidratio","samplerArg":"0.1","compression":"none","tls":{"caSecret":"","caKey":"ca.crt","clientSecret":""}},"transparent":{"excludeOutboundPorts":[53],"excludeOutboundCidrs":[],"initResources":{"requests":{"cpu":"10m","memory":"16Mi"},"limits":{"memory":"64Mi"}}}}' \
  "+controllerAddress: \"https://$SVC:15010\"" '+image: "ghcr.io/reprise-dev/reprise-sidecar:0.1.0"' '+samplerArg: "0.1"'
check "injection ConfigMap mounted at /etc/reprise, checksum annotation on the pod" \
  'any(m["mountPath"] == "/etc/reprise" and m["readOnly"] for m in container()["volumeMounts"]) and len(one("Deployment","reprise-controller")["spec"]["template"]["metadata"]["annotations"]["checksum/injection"]) == 64' \
  '+mountPath: /etc/reprise' '+checksum/injection: [0-9a-f]{64}'
check "every container hardened (non-root 65532, read-only root, no escalation, drop ALL, RuntimeDefault)" \
  'containers() and all(hardened(d, c) for d, c in containers())' \
  '+readOnlyRootFilesystem: true' '+allowPrivilegeEscalation: false' '+type: RuntimeDefault' '-privileged: true'
check "controller image defaults to appVersion; anti-affinity by hostname" \
  'container()["image"] == "ghcr.io/reprise-dev/reprise-controller:0.1.0" and pod()["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"' \
  '+image: "ghcr.io/reprise-dev/reprise-controller:0.1.0"' '+topologyKey: kubernetes.io/hostname'
check "RBAC: no wildcards, no cluster-admin, secrets only by name (+create)" \
  'all("*" not in r.get(k, []) for r in rules() for k in ("verbs","resources","apiGroups","resourceNames")) and all(r.get("resourceNames") == ["reprise-tls"] or r["verbs"] == ["create"] for r in rules() if "secrets" in r["resources"]) and not any("cluster-admin" in str(d) for d in docs)' \
  '-"\*"' '-cluster-admin'
check "RBAC: leases/webhook restricted by resourceNames" \
  'any(r["resources"] == ["leases"] and r["resourceNames"] == ["reprise-controller"] and set(r["verbs"]) == {"get","update","patch"} for r in rules()) and any(r["resources"] == ["mutatingwebhookconfigurations"] and r.get("resourceNames") == ["reprise-sidecar-injector"] and r["verbs"] == ["get","patch"] for r in rules())' \
  '+resourceNames: \["reprise-controller"\]' '+resourceNames: \["reprise-sidecar-injector"\]'
check "helm test Pod runs selftest as reprise-test" \
  'one("Pod","reprise-test")["metadata"]["annotations"]["helm.sh/hook"] == "test" and one("Pod","reprise-test")["spec"]["containers"][0]["command"] == ["/usr/local/bin/reprise-controller","selftest","--namespace","'"$NS"'","--webhook-configuration","reprise-sidecar-injector"] and one("Pod","reprise-test")["spec"]["serviceAccountName"] == "reprise-test" and one("Pod","reprise-test")["spec"]["restartPolicy"] == "Never"' \
  '+helm.sh/hook: test' '+- selftest' '+serviceAccountName: reprise-test'
check "helm test RBAC: test hooks created before the Pod (weight -1), deleted once the test is over; the Pod kept for its log" \
  'sorted(d["kind"] for d in test_objects()) == ["ClusterRole","ClusterRoleBinding","Pod","Role","RoleBinding","ServiceAccount"] and all(d["metadata"]["annotations"] == {"helm.sh/hook":"test","helm.sh/hook-weight":"-1","helm.sh/hook-delete-policy":"before-hook-creation,hook-succeeded"} for d in test_objects() if d["kind"] != "Pod") and one("Pod","reprise-test")["metadata"]["annotations"] == {"helm.sh/hook":"test","helm.sh/hook-delete-policy":"before-hook-creation"}' \
  '+helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded' '+helm.sh/hook-weight: "-1"'
check "controller resources: 100m and 128Mi requested, a 512Mi memory limit, no CPU limit" \
  'container()["resources"] == {"requests":{"cpu":"100m","memory":"128Mi"},"limits":{"memory":"512Mi"}}' \
  '+memory: 512Mi' '-memory: 256Mi'
check "no pull secrets, node selector, tolerations or priority class on any pod; the test pod without affinity" \
  'all(k not in podspec(d) for d in find("Deployment") + find("Pod") for k in ("imagePullSecrets","nodeSelector","tolerations","priorityClassName")) and "affinity" not in one("Pod","reprise-test")["spec"] and set(one("Deployment","reprise-controller")["spec"]["template"]["metadata"]["annotations"]) == {"checksum/injection"}' \
  '-imagePullSecrets' '-nodeSelector' '-tolerations' '-priorityClassName'
check "the webhook's whole-request time is its timeoutSeconds" \
  '"--webhook-timeout=5s" in args()' \
  '+- --webhook-timeout=5s$'
check "NetworkPolicy reprise-controller: push from anywhere, webhook from webhookFrom, metrics from no pod" \
  '(lambda np: np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "controller" and np["spec"]["policyTypes"] == ["Ingress"] and [r["ports"][0]["port"] for r in np["spec"]["ingress"]] == ["push","webhook"] and "from" not in np["spec"]["ingress"][0] and [p["ipBlock"]["cidr"] for p in np["spec"]["ingress"][1]["from"]] == ["0.0.0.0/0","::/0"])(one("NetworkPolicy","reprise-controller"))' \
  '+^kind: NetworkPolicy$' '+- port: push$' '+- port: webhook$' '-- port: metrics$'
check "no ServiceMonitor, PodMonitor, PrometheusRule, dashboard, Jaeger or cert-manager objects" \
  'not find("ServiceMonitor") and not find("PodMonitor") and not find("PrometheusRule") and not find("ConfigMap","reprise-dashboard") and not find("Certificate") and not find("Issuer") and not find("Deployment","reprise-jaeger")' \
  '-kind: ServiceMonitor' '-kind: PodMonitor' '-kind: PrometheusRule' '-grafana_dashboard' '-kind: Certificate' '-reprise-jaeger'

# --- networkPolicy --------------------------------------------------------------------
render netpol-off --set networkPolicy.enabled=false
check "no NetworkPolicy when networkPolicy.enabled=false" \
  'not find("NetworkPolicy")' \
  '-kind: NetworkPolicy'
render netpol-sources --set-json 'networkPolicy.webhookFrom=[{"ipBlock":{"cidr":"10.0.0.0/24"}}]' \
  --set-json 'networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]'
check "NetworkPolicy: the webhook from the values' sources, metrics from Prometheus's namespace" \
  '(lambda r: r[1]["from"] == [{"ipBlock":{"cidr":"10.0.0.0/24"}}] and r[2]["ports"][0]["port"] == "metrics" and r[2]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "monitoring")(one("NetworkPolicy","reprise-controller")["spec"]["ingress"])' \
  '+cidr: 10.0.0.0/24' '+- port: metrics$' '+kubernetes.io/metadata.name: monitoring'

# --- replicas=1 ----------------------------------------------------------------------
render replicas1 --set controller.replicas=1
check "PDB omitted with one replica" \
  'not find("PodDisruptionBudget") and one("Deployment","reprise-controller")["spec"]["replicas"] == 1' \
  '-kind: PodDisruptionBudget' '+^  replicas: 1$'

# --- cert-manager --------------------------------------------------------------------
render certmanager --set certManager.enabled=true
check "webhook annotated cert-manager.io/inject-ca-from: $NS/reprise-webhook" \
  'one("MutatingWebhookConfiguration")["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "'"$NS"'/reprise-webhook"' \
  "+cert-manager.io/inject-ca-from: $NS/reprise-webhook"
check "Certificate reprise-webhook -> Secret reprise-webhook-tls for the Service names" \
  'one("Certificate","reprise-webhook")["spec"]["secretName"] == "reprise-webhook-tls" and one("Certificate","reprise-webhook")["spec"]["dnsNames"] == ["'"$SVC"'","'"$SVC"'.cluster.local"] and one("Certificate","reprise-webhook")["spec"]["issuerRef"]["name"] == "reprise-ca"' \
  '+secretName: reprise-webhook-tls' "+- $SVC.cluster.local"
check "self-signed Issuer, CA Certificate and CA Issuer created" \
  'one("Issuer","reprise-selfsigned")["spec"] == {"selfSigned":{}} and one("Certificate","reprise-ca")["spec"]["isCA"] is True and one("Issuer","reprise-ca")["spec"]["ca"]["secretName"] == "reprise-ca"' \
  '+selfSigned: \{\}' '+isCA: true'
check "controller uses --tls-dir with the Secret mounted read-only, no --tls-secret" \
  '"--tls-dir=/var/run/reprise/tls" in args() and not any(a.startswith(("--tls-secret","--webhook-configuration")) for a in args()) and any(v.get("secret",{}).get("secretName") == "reprise-webhook-tls" for v in pod()["volumes"]) and any(m["mountPath"] == "/var/run/reprise/tls" and m.get("readOnly") for m in container()["volumeMounts"])' \
  '+--tls-dir=/var/run/reprise/tls' '---tls-secret' '+secretName: reprise-webhook-tls'
check "controller RBAC drops secrets and webhook patching" \
  'not any("secrets" in r["resources"] or "mutatingwebhookconfigurations" in r["resources"] for r in one("ClusterRole","reprise-controller")["rules"] + one("Role","reprise-controller")["rules"])' \
  '-resources: \["secrets"\]' '-resourceNames: \["reprise-tls"\]'
render certmanager-issuer --set certManager.enabled=true --set certManager.issuerRef.name=corp-ca --set certManager.issuerRef.kind=ClusterIssuer
check "issuerRef used, no chart-made issuers" \
  'one("Certificate","reprise-webhook")["spec"]["issuerRef"] == {"name":"corp-ca","kind":"ClusterIssuer","group":"cert-manager.io"} and not find("Issuer")' \
  '+name: corp-ca' '+kind: ClusterIssuer' '-^kind: Issuer$'

# --- ServiceMonitor ------------------------------------------------------------------
render servicemonitor --set serviceMonitor.enabled=true --set serviceMonitor.interval=15s
check "ServiceMonitor scrapes the metrics port every 15s" \
  'one("ServiceMonitor","reprise-controller")["spec"]["endpoints"] == [{"port":"metrics","path":"/metrics","scheme":"http","interval":"15s"}] and one("ServiceMonitor")["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "controller"' \
  '+kind: ServiceMonitor' '+port: metrics' '+interval: 15s'

# --- PodMonitor (the sidecars) --------------------------------------------------------
render podmonitor --set podMonitor.enabled=true --set podMonitor.interval=15s --set podMonitor.labels.release=kube-prometheus-stack
check "PodMonitor reprise-sidecars: every namespace's reprise-health ports, /metrics every 15s, nothing else" \
  '(lambda pm: pm["spec"] == {"namespaceSelector":{"any":True},"selector":{},"podMetricsEndpoints":[{"port":"reprise-health","path":"/metrics","scheme":"http","interval":"15s"}]} and pm["metadata"]["namespace"] == "'"$NS"'" and pm["metadata"]["labels"]["release"] == "kube-prometheus-stack")(one("PodMonitor","reprise-sidecars"))' \
  '+kind: PodMonitor' '+- port: reprise-health' '+any: true' '+release: kube-prometheus-stack'
check "the port it names is the one the injector gives the sidecar's health listener (not the loopback admin port)" \
  '"name: Some(\"reprise-health\".into())" in open("'"$ROOT"'/controller/src/inject/container.rs").read() and "format!(\"0.0.0.0:{}\", config.health_port)" in open("'"$ROOT"'/controller/src/inject/container.rs").read()' \
  '+port: reprise-health'
render podmonitor-namespaces --set podMonitor.enabled=true --set 'podMonitor.namespaces={shop,payments}'
check "podMonitor.namespaces: only those namespaces" \
  'one("PodMonitor")["spec"]["namespaceSelector"] == {"matchNames":["shop","payments"]}' \
  '+matchNames:' '+- shop' '-any: true'

# --- placement, pull secrets, digests, extra env ----------------------------------------
DC="sha256:$(printf 'c%.0s' {1..64})"
DS="sha256:$(printf '5%.0s' {1..64})"
DJ="sha256:$(printf 'e%.0s' {1..64})"
AFF='{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"pool","operator":"In","values":["infra"]}]}]}}}'
render placement --set-json 'imagePullSecrets=[{"name":"regcred"}]' \
  --set image.controller.digest=$DC --set image.sidecar.digest=$DS \
  --set controller.nodeSelector.pool=infra \
  --set-json 'controller.tolerations=[{"key":"infra","operator":"Exists","effect":"NoSchedule"}]' \
  --set-json "controller.affinity=$AFF" --set controller.priorityClassName=system-cluster-critical \
  --set controller.podLabels.team=platform --set 'controller.podAnnotations.example\.com/owner=platform' \
  --set-json 'controller.extraEnv=[{"name":"RUST_BACKTRACE","value":"1"},{"name":"TOKIO_WORKER_THREADS","valueFrom":{"configMapKeyRef":{"name":"reprise-tuning","key":"threads"}}}]'
check "controller pods: the pull secret, node selector, tolerations and priority class from values" \
  'pod()["imagePullSecrets"] == [{"name":"regcred"}] and pod()["nodeSelector"] == {"pool":"infra"} and pod()["tolerations"] == [{"key":"infra","operator":"Exists","effect":"NoSchedule"}] and pod()["priorityClassName"] == "system-cluster-critical"' \
  '+- name: regcred' '+pool: infra' '+key: infra' '+priorityClassName: "system-cluster-critical"'
check "controller.affinity replaces the default anti-affinity" \
  'pod()["affinity"] == '"$AFF"'' \
  '+nodeAffinity:' '-podAntiAffinity:'
check "pod labels and annotations added to the chart's, the selector and the Deployment's own labels unchanged" \
  '(lambda m: m["labels"]["team"] == "platform" and m["labels"]["app.kubernetes.io/component"] == "controller" and m["annotations"]["example.com/owner"] == "platform" and len(m["annotations"]["checksum/injection"]) == 64)(one("Deployment","reprise-controller")["spec"]["template"]["metadata"]) and one("Deployment","reprise-controller")["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name":"reprise","app.kubernetes.io/instance":"reprise","app.kubernetes.io/component":"controller"} and "team" not in one("Deployment","reprise-controller")["metadata"]["labels"]' \
  '+team: platform' '+example.com/owner: platform' '+checksum/injection: [0-9a-f]{64}'
check "extraEnv after the chart's variables, value and valueFrom as given" \
  '[e["name"] for e in container()["env"]][-2:] == ["RUST_BACKTRACE","TOKIO_WORKER_THREADS"] and env()["RUST_BACKTRACE"] == "1" and env()["TOKIO_WORKER_THREADS"] == {"configMapKeyRef":{"name":"reprise-tuning","key":"threads"}} and env()["REPRISE_LOG"] == "info"' \
  '+name: RUST_BACKTRACE' '+name: reprise-tuning'
check "digests: the controller, the helm test pod and the injected sidecar are repository@digest" \
  'container()["image"] == "ghcr.io/reprise-dev/reprise-controller@'"$DC"'" and one("Pod","reprise-test")["spec"]["containers"][0]["image"] == container()["image"] and injection()["image"] == "ghcr.io/reprise-dev/reprise-sidecar@'"$DS"'"' \
  "+image: \"ghcr.io/reprise-dev/reprise-controller@$DC\"" "+image: \"ghcr.io/reprise-dev/reprise-sidecar@$DS\"" '-reprise-controller:0.1.0'
check "helm test pod: the controller's pull secret, node selector, tolerations, affinity, labels and annotations; no priority class" \
  '(lambda p: p["spec"]["imagePullSecrets"] == [{"name":"regcred"}] and p["spec"]["nodeSelector"] == {"pool":"infra"} and p["spec"]["tolerations"] == pod()["tolerations"] and p["spec"]["affinity"] == pod()["affinity"] and "priorityClassName" not in p["spec"] and p["metadata"]["labels"]["team"] == "platform" and p["metadata"]["annotations"]["example.com/owner"] == "platform" and p["metadata"]["annotations"]["helm.sh/hook"] == "test")(one("Pod","reprise-test"))' \
  '+serviceAccountName: reprise-test'
check "every container still hardened" \
  'containers() and all(hardened(d, c) for d, c in containers())' \
  '+readOnlyRootFilesystem: true' '-privileged: true'
render jaeger-placement --set jaeger.enabled=true --set-json 'imagePullSecrets=[{"name":"regcred"}]' --set image.jaeger.digest=$DJ \
  --set jaeger.nodeSelector.pool=tracing \
  --set-json 'jaeger.tolerations=[{"key":"tracing","operator":"Equal","value":"yes","effect":"NoExecute","tolerationSeconds":60}]' \
  --set-json "jaeger.affinity=$AFF" --set jaeger.priorityClassName=low-priority \
  --set jaeger.podLabels.team=observability --set 'jaeger.podAnnotations.example\.com/owner=observability'
check "Jaeger pod: digest, pull secret, node selector, tolerations, affinity, priority class, labels and annotations" \
  '(lambda d: container("reprise-jaeger")["image"] == "jaegertracing/jaeger@'"$DJ"'" and podspec(d)["imagePullSecrets"] == [{"name":"regcred"}] and podspec(d)["nodeSelector"] == {"pool":"tracing"} and podspec(d)["tolerations"] == [{"key":"tracing","operator":"Equal","value":"yes","effect":"NoExecute","tolerationSeconds":60}] and podspec(d)["affinity"] == '"$AFF"' and podspec(d)["priorityClassName"] == "low-priority" and d["spec"]["template"]["metadata"]["labels"]["team"] == "observability" and d["spec"]["template"]["metadata"]["annotations"] == {"example.com/owner":"observability"} and d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "jaeger")(one("Deployment","reprise-jaeger"))' \
  "+image: \"jaegertracing/jaeger@$DJ\"" '+pool: tracing' '+priorityClassName: "low-priority"' '+team: observability'
check "the controller keeps its own placement (the pull secret is every pod's)" \
  '"nodeSelector" not in pod() and "podAntiAffinity" in pod()["affinity"] and pod()["imagePullSecrets"] == [{"name":"regcred"}] and "team" not in one("Deployment","reprise-controller")["spec"]["template"]["metadata"]["labels"]' \
  '+podAntiAffinity:' '+pool: tracing'

# --- Grafana dashboard and PrometheusRule ---------------------------------------------
ALERTS='{"RepriseRetryBudgetRefusing","RepriseEffectiveSuccessLow","RepriseSnapshotNacked","RepriseSidecarsOutOfSync","RepriseTraceSpansDropped","RepriseWebhookFailingOpen","RepriseUpstreamCertificateExpiring"}'
render monitoring --set grafanaDashboard.enabled=true --set prometheusRule.enabled=true
check "dashboard ConfigMap labelled grafana_dashboard: \"1\", carrying dashboards/reprise.json as it is" \
  'one("ConfigMap","reprise-dashboard")["metadata"]["labels"]["grafana_dashboard"] == "1" and one("ConfigMap","reprise-dashboard")["metadata"]["namespace"] == "'"$NS"'" and dashboard() == json.load(open("'"$CHART"'/dashboards/reprise.json"))' \
  '+"grafana_dashboard": "1"' '+^  reprise.json: \|-$' '+"uid": "reprise-overview"'
check "dashboard: six panels, every query on the \${datasource} variable" \
  'len(dashboard()["panels"]) == 6 and all(t["datasource"]["uid"] == "${datasource}" and t["expr"] for p in dashboard()["panels"] for t in p["targets"])' \
  '+"title": "Sidecars in sync"' '+"uid": "\$\{datasource\}"'
check "PrometheusRule reprise-alerts: the seven alerts, each with a severity, a summary and a description" \
  'set(alerts()) == '"$ALERTS"' and all(r["labels"]["severity"] in ("warning","critical") and r["annotations"]["summary"] and r["annotations"]["description"] for r in alerts().values())' \
  '+^kind: PrometheusRule$' '+- alert: RepriseSnapshotNacked$' '+- alert: RepriseUpstreamCertificateExpiring$'
check "alerts: effective success under 0.95, certificates expiring within 7 days" \
  'alerts()["RepriseEffectiveSuccessLow"]["expr"].endswith("< 0.95") and alerts()["RepriseUpstreamCertificateExpiring"]["expr"].endswith("< 7 * 86400")' \
  '+^ +< 0.95$' '+< 7 \* 86400$'
render monitoring-values --set grafanaDashboard.enabled=true --set grafanaDashboard.label=example.com/dashboard \
  --set grafanaDashboard.labelValue=7 --set grafanaDashboard.namespace=monitoring \
  --set grafanaDashboard.annotations.grafana_folder=Reprise --set prometheusRule.enabled=true \
  --set prometheusRule.labels.release=kube-prometheus-stack --set prometheusRule.effectiveSuccessThreshold=0.99 \
  --set prometheusRule.certificateExpiryDays=21
check "dashboard label key and value (a number quoted), namespace and folder annotation from values" \
  'one("ConfigMap","reprise-dashboard")["metadata"]["labels"]["example.com/dashboard"] == "7" and "grafana_dashboard" not in one("ConfigMap","reprise-dashboard")["metadata"]["labels"] and one("ConfigMap","reprise-dashboard")["metadata"]["namespace"] == "monitoring" and one("ConfigMap","reprise-dashboard")["metadata"]["annotations"] == {"grafana_folder":"Reprise"}' \
  '+"example.com/dashboard": "7"' '+namespace: monitoring' '+grafana_folder: Reprise' '-grafana_dashboard'
check "rule labels for the Prometheus's selector; threshold 0.99 and 21 days in expressions and descriptions" \
  'one("PrometheusRule")["metadata"]["labels"]["release"] == "kube-prometheus-stack" and alerts()["RepriseEffectiveSuccessLow"]["expr"].endswith("< 0.99") and "under 0.99 " in alerts()["RepriseEffectiveSuccessLow"]["annotations"]["description"] and alerts()["RepriseUpstreamCertificateExpiring"]["expr"].endswith("< 21 * 86400") and "under 21 days" in alerts()["RepriseUpstreamCertificateExpiring"]["annotations"]["description"]' \
  '+release: kube-prometheus-stack' '+^ +< 0.99$' '+< 21 \* 86400$' '+under 21 days'

# --- Jaeger --------------------------------------------------------------------------
JAEGER="http://reprise-jaeger.$NS.svc:4317"
render jaeger --set jaeger.enabled=true
check "Jaeger Deployment (2.13.0, hardened, /tmp emptyDir) and Service 4317/4318/16686" \
  'container("reprise-jaeger")["image"] == "jaegertracing/jaeger:2.13.0" and {p["port"] for p in one("Service","reprise-jaeger")["spec"]["ports"]} == {4317,4318,16686} and any(m["mountPath"] == "/tmp" for m in container("reprise-jaeger")["volumeMounts"])' \
  '+image: "jaegertracing/jaeger:2.13.0"' '+port: 16686' '+mountPath: /tmp'
check "controller and sidecars trace to the bundled Jaeger over grpc" \
  'env()["OTEL_EXPORTER_OTLP_ENDPOINT"] == "'"$JAEGER"'" and env()["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc" and injection()["otel"]["endpoint"] == "'"$JAEGER"'"' \
  "+value: \"$JAEGER\"" "+endpoint: \"$JAEGER\""

# --- otel.endpoint -------------------------------------------------------------------
OTEL=http://otel-collector.observability.svc:4318
render otel --set otel.endpoint=$OTEL --set otel.protocol=http/protobuf --set otel.samplerArg=0.25
check "OTEL_* env for the controller, all values strings" \
  'env()["OTEL_EXPORTER_OTLP_ENDPOINT"] == "'"$OTEL"'" and env()["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf" and env()["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio" and env()["OTEL_TRACES_SAMPLER_ARG"] == "0.25" and env()["OTEL_SERVICE_NAME"] == "reprise-controller" and all(isinstance(e.get("value", ""), str) for e in container()["env"])' \
  "+value: \"$OTEL\"" '+value: "0.25"' '+value: "reprise-controller"'
check "OTEL_RESOURCE_ATTRIBUTES from the downward API (defined before use)" \
  'env()["OTEL_RESOURCE_ATTRIBUTES"] == "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE),k8s.node.name=$(NODE_NAME)" and [e["name"] for e in container()["env"]].index("NODE_NAME") < [e["name"] for e in container()["env"]].index("OTEL_RESOURCE_ATTRIBUTES") and env()["NODE_NAME"] == {"fieldRef":{"fieldPath":"spec.nodeName"}}' \
  '+k8s.pod.name=\$\(POD_NAME\),k8s.namespace.name=\$\(POD_NAMESPACE\),k8s.node.name=\$\(NODE_NAME\)' '+fieldPath: spec.nodeName'
check "sidecars get the same endpoint, samplerArg as a string" \
  'injection()["otel"] == {"endpoint":"'"$OTEL"'","protocol":"http/protobuf","sampler":"parentbased_traceidratio","samplerArg":"0.25","compression":"none","tls":{"caSecret":"","caKey":"ca.crt","clientSecret":""}}' \
  "+endpoint: \"$OTEL\"" '+samplerArg: "0.25"'
check "plain text: compression none, no certificate variables or Secret volumes" \
  'env()["OTEL_EXPORTER_OTLP_COMPRESSION"] == "none" and not any(k in env() for k in ("OTEL_EXPORTER_OTLP_CERTIFICATE","OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE","OTEL_EXPORTER_OTLP_CLIENT_KEY")) and not any(v["name"].startswith("otlp-") for v in pod()["volumes"])' \
  '+name: OTEL_EXPORTER_OTLP_COMPRESSION' '-OTEL_EXPORTER_OTLP_CERTIFICATE' '-name: otlp-'

# --- otel over TLS ---------------------------------------------------------------------
OTELS=https://otel-collector.observability.svc:4317
render otel-tls --set otel.endpoint=$OTELS --set otel.compression=gzip \
  --set otel.tls.caSecret=otlp-ca --set otel.tls.caKey=bundle.pem --set otel.tls.clientSecret=otlp-client
check "controller: compression, certificate and client certificate variables name the mounted files" \
  'env()["OTEL_EXPORTER_OTLP_COMPRESSION"] == "gzip" and env()["OTEL_EXPORTER_OTLP_CERTIFICATE"] == "/var/run/reprise/otlp-ca/ca.crt" and env()["OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"] == "/var/run/reprise/otlp-client/tls.crt" and env()["OTEL_EXPORTER_OTLP_CLIENT_KEY"] == "/var/run/reprise/otlp-client/tls.key"' \
  '+value: "gzip"' '+value: /var/run/reprise/otlp-ca/ca.crt' '+value: /var/run/reprise/otlp-client/tls.key'
check "controller: the Secrets mounted read-only, the bundle's key as ca.crt" \
  '{v["name"]: v["secret"] for v in pod()["volumes"] if v["name"].startswith("otlp-")} == {"otlp-ca":{"secretName":"otlp-ca","items":[{"key":"bundle.pem","path":"ca.crt"}]},"otlp-client":{"secretName":"otlp-client","items":[{"key":"tls.crt","path":"tls.crt"},{"key":"tls.key","path":"tls.key"}]}} and {m["name"]: (m["mountPath"], m["readOnly"]) for m in container()["volumeMounts"] if m["name"].startswith("otlp-")} == {"otlp-ca":("/var/run/reprise/otlp-ca",True),"otlp-client":("/var/run/reprise/otlp-client",True)}' \
  '+secretName: "otlp-ca"' '+key: "bundle.pem"' '+mountPath: /var/run/reprise/otlp-client'
check "sidecars: compression and the Secrets' names in injection.yaml (mounted from the pod's namespace)" \
  'injection()["otel"]["compression"] == "gzip" and injection()["otel"]["tls"] == {"caSecret":"otlp-ca","caKey":"bundle.pem","clientSecret":"otlp-client"}' \
  '+compression: "gzip"' '+caSecret: "otlp-ca"' '+clientSecret: "otlp-client"'

# --- webhook.url ---------------------------------------------------------------------
URL=https://192.0.2.10:9443/inject
render webhookurl --set webhook.url=$URL
check "clientConfig.url replaces the service reference; the transparent entry calls its /transparent" \
  'webhook()["clientConfig"] == {"url":"'"$URL"'"} and transparent_webhook()["clientConfig"] == {"url":"'"$URL"'/transparent"}' \
  "+url: \"$URL\"" "+url: \"$URL/transparent\"" '-path: /inject'
render webhookurl-slash --set webhook.url=$URL/
check "a trailing slash in webhook.url makes no double slash" \
  'transparent_webhook()["clientConfig"] == {"url":"'"$URL"'/transparent"}' \
  "+url: \"$URL/transparent\""

# --- transparent mode ----------------------------------------------------------------
render transparent --set sidecar.redirectPort=15106 --set sidecar.proxyUid=1337 \
  --set injection.transparentLabel=example.com/capture \
  --set 'transparent.excludeOutboundPorts={53,5432}' --set 'transparent.excludeOutboundCidrs={169.254.169.254/32,fd00::/8}' \
  --set transparent.initResources.limits.cpu=1
check "redirect port, proxy UID, exclusions and init resources reach injection.yaml (quantities as strings)" \
  'injection()["redirectPort"] == 15106 and injection()["proxyUid"] == 1337 and injection()["transparent"] == {"excludeOutboundPorts":[53,5432],"excludeOutboundCidrs":["169.254.169.254/32","fd00::/8"],"initResources":{"requests":{"cpu":"10m","memory":"16Mi"},"limits":{"cpu":"1","memory":"64Mi"}}}' \
  '+redirectPort: 15106' '+proxyUid: 1337' '+excludeOutboundPorts: \[53,5432\]' '+cpu: "1"'
check "the transparent label key is configurable, in both entries" \
  'transparent_expr(webhook()) == [] and [e for e in webhook()["namespaceSelector"]["matchExpressions"] if e["key"] == "example.com/capture"] == [{"key":"example.com/capture","operator":"NotIn","values":["enabled"]}] and [e for e in transparent_webhook()["namespaceSelector"]["matchExpressions"] if e["key"] == "example.com/capture"] == [{"key":"example.com/capture","operator":"In","values":["enabled"]}]' \
  '+key: example.com/capture' '-key: reprise.dev/transparent'

# --- failurePolicy=Fail --------------------------------------------------------------
render fail --set webhook.failurePolicy=Fail --set webhook.timeoutSeconds=10
check "failurePolicy Fail, timeoutSeconds 10" \
  'webhook()["failurePolicy"] == "Fail" and webhook()["timeoutSeconds"] == 10' \
  '+failurePolicy: Fail' '+timeoutSeconds: 10'

# --- names ---------------------------------------------------------------------------
LONG=a-release-name-of-fifty-three-characters-for-testing1
render longname --set fullnameOverride=$LONG
check "names within 63 characters; webhook, RBAC and Service names agree" \
  'all(len(d["metadata"]["name"]) <= 63 for d in docs) and one("Service", webhook()["clientConfig"]["service"]["name"]) and any(r.get("resourceNames") == [one("MutatingWebhookConfiguration")["metadata"]["name"]] for r in rules())' \
  '-name: [a-z0-9-]{64,}'

flush

# --- values the schema refuses -------------------------------------------------------
refuse "controller.replicas=0" replicas --set controller.replicas=0
refuse "webhook.failurePolicy=Sometimes" failurePolicy --set webhook.failurePolicy=Sometimes
refuse "unknown key controler.replicas" controler --set controler.replicas=2
refuse "webhook.timeoutSeconds=31" timeoutSeconds --set webhook.timeoutSeconds=31
refuse "otel.protocol=http" protocol --set otel.protocol=http
refuse "otel.compression=zstd" compression --set otel.compression=zstd
refuse "otel.tls.caSecret with an http:// endpoint" endpoint --set otel.endpoint=http://c:4317 --set otel.tls.caSecret=otlp-ca
refuse "otel.tls.clientSecret with the bundled Jaeger (plain text)" endpoint --set jaeger.enabled=true --set otel.tls.clientSecret=otlp-client
refuse "unknown key otel.tls.insecure" insecure --set otel.tls.insecure=true
refuse "controller.logLevel=verbose" logLevel --set controller.logLevel=verbose
refuse "image.sidecar.pullPolicy=Sometimes" pullPolicy --set image.sidecar.pullPolicy=Sometimes
refuse "webhook.url without https" url --set webhook.url=http://insecure/inject
refuse "sidecar.proxyUid=0 (root)" proxyUid --set sidecar.proxyUid=0
refuse "sidecar.redirectPort=70000" redirectPort --set sidecar.redirectPort=70000
refuse "sidecar.diagnosticsRetained=1001" diagnosticsRetained --set sidecar.diagnosticsRetained=1001
refuse "transparent.excludeOutboundPorts={0}" excludeOutboundPorts --set 'transparent.excludeOutboundPorts={0}'
refuse "transparent.excludeOutboundCidrs={db.internal}" excludeOutboundCidrs --set 'transparent.excludeOutboundCidrs={db.internal}'
refuse "injection.transparentLabel with a space" transparentLabel --set 'injection.transparentLabel=a b'
refuse "prometheusRule.effectiveSuccessThreshold=0" effectiveSuccessThreshold --set prometheusRule.effectiveSuccessThreshold=0
refuse "prometheusRule.effectiveSuccessThreshold=95 (a percentage)" effectiveSuccessThreshold --set prometheusRule.effectiveSuccessThreshold=95
refuse "prometheusRule.effectiveSuccessThreshold=1.5" effectiveSuccessThreshold --set prometheusRule.effectiveSuccessThreshold=1.5
refuse "prometheusRule.certificateExpiryDays=0" certificateExpiryDays --set prometheusRule.certificateExpiryDays=0
refuse "grafanaDashboard.label with a space" label --set 'grafanaDashboard.label=grafana dashboard'
refuse "unknown key prometheusRule.threshold" threshold --set prometheusRule.threshold=0.9
refuse "image.controller.digest=latest (not a digest)" digest --set image.controller.digest=latest
refuse "image.sidecar.digest without its algorithm" digest --set image.sidecar.digest="$(printf 'a%.0s' {1..64})"
refuse "imagePullSecrets as bare names, not {name: ...}" imagePullSecrets --set 'imagePullSecrets={regcred}'
refuse "controller.nodeSelector with a number" nodeSelector --set controller.nodeSelector.zone=1
refuse "controller.tolerations operator Maybe" operator --set-json 'controller.tolerations=[{"key":"a","operator":"Maybe"}]'
refuse "controller.tolerations as a map" tolerations --set controller.tolerations.key=a
refuse "jaeger.tolerations with tolerationSeconds a string" tolerationSeconds --set-json 'jaeger.tolerations=[{"key":"a","operator":"Exists","tolerationSeconds":"60"}]'
refuse "controller.affinity.nodeSelector (not an affinity)" affinity --set-json 'controller.affinity={"nodeSelector":{"a":"b"}}'
refuse "controller.priorityClassName=High_Priority" priorityClassName --set controller.priorityClassName=High_Priority
refuse "controller.podLabels with a number" podLabels --set controller.podLabels.tier=1
refuse "controller.podLabels app.kubernetes.io/name (the chart's selector)" podLabels --set 'controller.podLabels.app\.kubernetes\.io/name=x'
refuse "jaeger.podLabels helm.sh/chart (the chart's label)" podLabels --set 'jaeger.podLabels.helm\.sh/chart=x'
refuse "controller.podAnnotations checksum/injection (the chart's)" podAnnotations --set 'controller.podAnnotations.checksum/injection=x'
refuse "controller.extraEnv REPRISE_LOG (controller.logLevel's)" controller.logLevel --set-json 'controller.extraEnv=[{"name":"REPRISE_LOG","value":"debug"}]'
refuse "controller.extraEnv OTEL_EXPORTER_OTLP_ENDPOINT (otel.endpoint's)" otel.endpoint --set-json 'controller.extraEnv=[{"name":"OTEL_EXPORTER_OTLP_ENDPOINT","value":"http://c:4317"}]'
refuse "controller.extraEnv with a number value" extraEnv --set-json 'controller.extraEnv=[{"name":"A","value":1}]'
refuse "controller.extraEnv with both value and valueFrom" valueFrom --set-json 'controller.extraEnv=[{"name":"A","value":"1","valueFrom":{"fieldRef":{"fieldPath":"spec.nodeName"}}}]'
refuse "controller.extraEnv naming one variable twice" twice --set-json 'controller.extraEnv=[{"name":"A","value":"1"},{"name":"A","value":"2"}]'
refuse "controller.extraEnv as a map" extraEnv --set controller.extraEnv.A=b
refuse "controller.extraEnv name starting with a digit" extraEnv/0/name --set-json 'controller.extraEnv=[{"name":"1A","value":"1"}]'
refuse "podMonitor.interval=30 (no unit)" interval --set podMonitor.interval=30
refuse "podMonitor.namespaces={Shop}" namespaces --set 'podMonitor.namespaces={Shop}'
refuse "unknown key podMonitor.port (the port is the sidecar's reprise-health)" port --set podMonitor.port=15000

# --- the alerts under promtool -------------------------------------------------------
# No cluster here has the PrometheusRule CRD, so the rules file promtool reads
# is the document's spec (the template keeps it last), taken out with awk:
# the lines after "spec:", two spaces less indented. promtool then checks and
# unit-tests what the chart renders, not a copy of it.
mkdir -p "$TMP/promtool"
"$HELM" template "$RELEASE" "$CHART" -n "$NS" --kube-version "$KUBE_VERSION" --set prometheusRule.enabled=true \
  --show-only templates/prometheusrule.yaml 2>"$TMP/promtool/err" |
  awk 'f { sub(/^  /, ""); print } /^spec:$/ { f = 1 }' >"$TMP/promtool/rules.yaml" || true
mapfile -t RULE_ALERTS < <(sed -n 's/^ *- alert: *\([A-Za-z0-9_]*\)$/\1/p' "$TMP/promtool/rules.yaml")
if ((${#RULE_ALERTS[@]} == 0)); then
  fail "promtool: no alert in the rendered groups: $(head -3 "$TMP/promtool/err" | tr '\n' ' ')"
elif "$PROMTOOL" check rules "$TMP/promtool/rules.yaml" >"$TMP/promtool/check.out" 2>&1 &&
  grep -q "SUCCESS: ${#RULE_ALERTS[@]} rules found" "$TMP/promtool/check.out"; then
  pass "promtool: check rules (${#RULE_ALERTS[@]} alerts)"
else
  fail "promtool: check rules: $(tail -5 "$TMP/promtool/check.out" | tr '\n' ' ')"
fi
untested=()
for a in "${RULE_ALERTS[@]}"; do
  grep -Eq "^ +alertname: $a\$" "$ROOT/charts/alerts.test.yaml" || untested+=("$a")
done
if ((${#untested[@]})); then
  fail "promtool: alerts without a test in charts/alerts.test.yaml: ${untested[*]}"
else
  pass "promtool: every alert has a test in charts/alerts.test.yaml"
fi
cp "$ROOT/charts/alerts.test.yaml" "$TMP/promtool/"
if "$PROMTOOL" test rules "$TMP/promtool/alerts.test.yaml" >"$TMP/promtool/test.out" 2>&1; then
  pass "promtool: test rules charts/alerts.test.yaml ($(grep -c 'alertname:' "$TMP/promtool/alerts.test.yaml") evaluations)"
else
  fail "promtool: test rules charts/alerts.test.yaml:"
  sed 's/^/     /' "$TMP/promtool/test.out"
fi

if ((FAILED)); then
  echo "chart: $FAILED of $((PASSED + FAILED)) checks failed"
  exit 1
fi
echo "chart: $PASSED checks passed"
