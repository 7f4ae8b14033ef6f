//! Issue 53 on the real node: retries configured where Kubernetes users
//! configure them, across namespaces and from Gateway API's routes and
//! budgets (`docs/src/tasks/cross-namespace.md`, `docs/src/tasks/httproute.md`).
//!
//! Namespaces: the test's own (`A`, a client), `-srv` (the Services, not
//! injected) and `-b` (another client, labelled `team=b`). In `-srv`:
//! StatefulSet `api` (three pods, `api-0` answering 503 to half its
//! requests and `UNAVAILABLE` to every other gRPC call, on an h2c port),
//! Deployment `conf` (one pod: the conformance backend of Gateway API's
//! retry and timeout tests), Deployments `conn-healthy` and `conn-broken`
//! behind Service `conn` (the broken pod listens on another port: its
//! connections are refused). In each client namespace, Deployment `web`.
//!
//! The standard channel's CRDs for [`routes_across_namespaces_and_the_ported_conformance_assertions`],
//! the experimental channel's for [`an_xbackendtrafficpolicy_budget_bounds_retries_at_the_pods`].
//!
//! Run alone: `--test cluster -- --ignored node::gateway:: --test-threads=1`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use reprise_e2e::cluster::{drive, get, node_name, Cluster, Release};
use serde_json::Value;

use super::{addr, ip, json, pods, ready};

/// Deletes the extra namespaces however the test ends.
struct Namespaces<'a>(&'a Cluster, Vec<String>);

impl Drop for Namespaces<'_> {
    fn drop(&mut self) {
        for ns in &self.1 {
            let _ = self.0.kubectl(&["delete", "namespace", ns, "--wait=false"]);
        }
    }
}

const SECURITY: &str = "securityContext: { runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: { drop: [ALL] }, seccompProfile: { type: RuntimeDefault } }";
const ENV: &str = "- { name: POD_NAME, valueFrom: { fieldRef: { fieldPath: metadata.name } } }\n            - { name: POD_IP, valueFrom: { fieldRef: { fieldPath: status.podIP } } }";
const RESOURCES: &str =
    "resources: { requests: { cpu: 10m, memory: 16Mi }, limits: { memory: 64Mi } }";

/// One Deployment of the e2e app, not injected, labelled `app: {app}`.
fn server(name: &str, app: &str, port: u16, extra_env: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{ name: {name} }}
spec:
  replicas: 1
  selector: {{ matchLabels: {{ app: {app}, variant: {name} }} }}
  template:
    metadata: {{ labels: {{ app: {app}, variant: {name}, reprise.dev/inject: disabled }} }}
    spec:
      terminationGracePeriodSeconds: 2
      automountServiceAccountToken: false
      containers:
        - name: app
          image: reprise.local/e2e-app:dev
          imagePullPolicy: Never
          env:
            {ENV}
            - {{ name: PORT, value: "{port}" }}
            - {{ name: DRAIN_MS, value: "500" }}{extra_env}
          readinessProbe: {{ httpGet: {{ path: /healthz, port: {port} }}, periodSeconds: 1, failureThreshold: 1 }}
          {RESOURCES}
          {SECURITY}
"#
    )
}

/// The Services' namespace.
fn services_yaml() -> String {
    let api = format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata: {{ name: api }}
spec:
  serviceName: api
  replicas: 3
  podManagementPolicy: Parallel
  selector: {{ matchLabels: {{ app: api }} }}
  template:
    metadata: {{ labels: {{ app: api, reprise.dev/inject: disabled }} }}
    spec:
      terminationGracePeriodSeconds: 2
      automountServiceAccountToken: false
      containers:
        - name: api
          image: reprise.local/e2e-app:dev
          imagePullPolicy: Never
          env:
            {ENV}
            - {{ name: FLAKY_POD, value: api-0 }}
            - {{ name: FLAKY_PERCENT, value: "50" }}
            - {{ name: GRPC_PORT, value: "9090" }}
            - {{ name: DRAIN_MS, value: "500" }}
          readinessProbe: {{ httpGet: {{ path: /healthz, port: 8080 }}, periodSeconds: 1, failureThreshold: 1 }}
          {RESOURCES}
          {SECURITY}
"#
    );
    let services = r#"apiVersion: v1
kind: Service
metadata: { name: api }
spec:
  selector: { app: api }
  ports: [{ name: http, port: 80, targetPort: 8080 }]
---
apiVersion: v1
kind: Service
metadata: { name: api-grpc }
spec:
  selector: { app: api }
  ports: [{ name: grpc, port: 9090, targetPort: 9090, appProtocol: kubernetes.io/h2c }]
---
apiVersion: v1
kind: Service
metadata: { name: redirected }
spec:
  selector: { app: api }
  ports: [{ name: http, port: 80, targetPort: 8080 }]
---
apiVersion: v1
kind: Service
metadata: { name: conf }
spec:
  selector: { app: conf }
  ports: [{ name: http, port: 80, targetPort: 8080 }]
---
apiVersion: v1
kind: Service
metadata: { name: conn }
spec:
  selector: { app: conn }
  ports: [{ name: http, port: 80, targetPort: 8080 }]
"#;
    [
        api,
        services.to_string(),
        server("conf", "conf", 8080, ""),
        server("conn-healthy", "conn", 8080, ""),
        // Listens on 8081: the Service's 8080 is refused on this pod.
        server("conn-broken", "conn", 8081, ""),
    ]
    .join("\n---\n")
}

/// A client namespace's `web` Deployment (injected).
fn web_yaml() -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{ name: web }}
spec:
  replicas: 1
  selector: {{ matchLabels: {{ app: web }} }}
  template:
    metadata: {{ labels: {{ app: web }} }}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: app
          image: reprise.local/e2e-app:dev
          imagePullPolicy: Never
          env:
            {ENV}
          readinessProbe: {{ httpGet: {{ path: /healthz, port: 8080 }}, periodSeconds: 1, failureThreshold: 1 }}
          {RESOURCES}
          {SECURITY}
"#
    )
}

/// The Gateway API conformance tests' routes (`tests/httproute-retry*.yaml`,
/// `httproute-timeout-*.yaml` of `sigs.k8s.io/gateway-api/conformance`
/// v1.7.0), attached to Services instead of a Gateway: each `parentRefs`
/// names the Service its `backendRefs` names (GAMMA), the rest as written.
fn conformance_routes(srv: &str) -> String {
    let parent = |svc: &str| {
        format!("parentRefs: [{{ group: \"\", kind: Service, name: {svc}, namespace: {srv}, port: 80 }}]")
    };
    let backend = |svc: &str| format!("backendRefs: [{{ name: {svc}, port: 80 }}]");
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: retries }}
spec:
  {conf}
  rules:
    - matches: [{{ path: {{ type: PathPrefix, value: /retry/code-500-attempts-3 }} }}]
      retry: {{ codes: [500], attempts: 3 }}
      {back}
    - matches: [{{ path: {{ type: PathPrefix, value: /retry/code-all-attempts-2 }} }}]
      retry: {{ codes: [500, 502, 503, 504], attempts: 2 }}
      {back}
    - matches: [{{ path: {{ type: PathPrefix, value: /retry/code-all-attempts-0 }} }}]
      retry: {{ codes: [500, 502, 503, 504], attempts: 0 }}
      {back}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: retries-with-timeouts }}
spec:
  {conf}
  rules:
    - matches: [{{ path: {{ type: PathPrefix, value: /retry/request-timeout-500ms }} }}]
      retry: {{ codes: [500], attempts: 5 }}
      timeouts: {{ request: 500ms }}
      {back}
    - matches: [{{ path: {{ type: PathPrefix, value: /retry/backend-timeout-500ms }} }}]
      retry: {{ codes: [500], attempts: 3 }}
      timeouts: {{ backendRequest: 500ms, request: 15s }}
      {back}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: request-timeout }}
spec:
  {conf}
  rules:
    - matches: [{{ path: {{ type: PathPrefix, value: /request-timeout }} }}]
      {back}
      timeouts: {{ request: 500ms }}
    - matches: [{{ path: {{ type: PathPrefix, value: /disable-request-timeout }} }}]
      {back}
      timeouts: {{ request: "0s" }}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: backend-request-timeout }}
spec:
  {conf}
  rules:
    - matches: [{{ path: {{ type: PathPrefix, value: /backend-timeout }} }}]
      {back}
      timeouts: {{ backendRequest: 500ms }}
    - matches: [{{ path: {{ type: PathPrefix, value: /disable-backend-timeout }} }}]
      {back}
      timeouts: {{ backendRequest: "0s" }}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: retries-connection-error }}
spec:
  {conn}
  rules:
    - matches: [{{ path: {{ type: PathPrefix, value: /retry-on-connection-errors }} }}]
      retry: {{ attempts: 100 }}
      {connback}
"#,
        conf = parent("conf"),
        back = backend("conf"),
        conn = parent("conn"),
        connback = backend("conn"),
    )
}

/// Reprise's entry of a route's `status.parents`: `(Accepted status,
/// reason, message)`.
fn route_accepted(
    c: &Cluster,
    ns: &str,
    kind: &str,
    name: &str,
) -> Option<(String, String, String)> {
    let route = c
        .kubectl(&["-n", ns, "get", kind, name, "-o", "json"])
        .ok()
        .and_then(|s| serde_json::from_str::<Value>(&s).ok())?;
    let entry = route["status"]["parents"]
        .as_array()?
        .iter()
        .find(|p| p["controllerName"] == "reprise.dev/controller")?
        .clone();
    let accepted = entry["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Accepted")?
        .clone();
    let s = |k: &str| accepted[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

/// The one Ready `web` pod of `ns`, as `IP:8080`.
fn web(c: &Cluster, ns: &str) -> SocketAddr {
    let mut found = None;
    c.until(
        &format!("one Ready web pod in {ns}"),
        Duration::from_secs(120),
        || {
            let ready_pods: Vec<Value> = pods(c, ns, "app=web").into_iter().filter(ready).collect();
            found = (ready_pods.len() == 1).then(|| addr(&ip(&ready_pods[0]), 8080));
            found.is_some()
        },
    );
    found.expect("web pod")
}

/// Requests answered by the pods of `selector` in `ns` (their `/served`).
async fn served(c: &Cluster, ns: &str, selector: &str) -> u64 {
    let mut total = 0;
    for p in pods(c, ns, selector) {
        let (status, body) = get(addr(&ip(&p), 8080), "app", "/served")
            .await
            .expect("/served");
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).expect("/served JSON");
        total += v["requests"].as_u64().unwrap_or(0);
    }
    total
}

/// A fresh conformance `uuid`.
fn uuid() -> String {
    format!(
        "{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

/// Sets up the namespaces, the chart and the workloads; returns the
/// release (installed) and the `-srv` and `-b` namespace names.
fn setup(c: &Cluster, channel: &str, step: &dyn Fn(&str)) -> (Release, String, String) {
    step(&format!("1. Gateway API {channel} CRDs, helm install"));
    c.gateway_api(channel);
    let release = Release::new(
        &c.kubeconfig,
        // One namespace per channel: the other test's may still be terminating.
        &format!("reprise-gw-{}-{}", &channel[..3], std::process::id()),
        "reprise",
    );
    let out = release
        .install_on_node(&["controller.logLevel=debug"], "240s")
        .unwrap_or_else(|e| panic!("helm install: {e}"));
    assert!(out.contains("STATUS: deployed"), "{out}");
    let (srv, b) = (format!("{}-srv", c.ns), format!("{}-b", c.ns));
    for ns in [&srv, &b] {
        c.kubectl(&["create", "namespace", ns]).expect("namespace");
    }
    c.kubectl(&["label", "namespace", &b, "team=b"])
        .expect("label");
    for ns in [&c.ns, &b] {
        c.kubectl(&["label", "namespace", ns, "reprise.dev/inject=enabled"])
            .expect("label");
    }
    c.until_injecting(Duration::from_secs(60));
    step("2. Services in -srv, web in A and -b");
    apply_in(c, &srv, &services_yaml());
    for ns in [&c.ns, &b] {
        apply_in(c, ns, &web_yaml());
    }
    c.until("every server pod Ready", Duration::from_secs(180), || {
        pods(c, &srv, "app").iter().filter(|p| ready(p)).count() == 6
    });
    (release, srv, b)
}

fn apply_in(c: &Cluster, ns: &str, yaml: &str) {
    let path = c.work.join(format!(
        "apply-{}.yaml",
        reprise_e2e::cluster::rand_suffix()
    ));
    std::fs::write(&path, yaml).expect("write yaml");
    c.kubectl(&["-n", ns, "apply", "-f", path.to_str().expect("path")])
        .unwrap_or_else(|e| panic!("apply in {ns}: {e}\n{yaml}"));
}

fn count(r: &Value, map: &str, key: &str) -> u64 {
    r[map][key].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e cluster with its node: run e2e/test.sh"]
async fn routes_across_namespaces_and_the_ported_conformance_assertions() {
    node_name().expect("REPRISE_E2E_NODE: this test needs the node");
    let c = Cluster::new("gw");
    let t0 = Instant::now();
    let step = |what: &str| eprintln!("[gateway test {:>6.1}s] {what}", t0.elapsed().as_secs_f64());
    let (_release, srv, b) = setup(&c, "standard", &step);
    let _namespaces = Namespaces(&c, vec![srv.clone(), b.clone()]);
    let (web_a, web_b) = (web(&c, &c.ns), web(&c, &b));
    let api = format!("http://api.{srv}/");

    // (a) A consumer RetryPolicy across namespaces, for A's callers only.
    step("(a) a consumer RetryPolicy in A for -srv/api");
    apply_in(
        &c,
        &c.ns,
        &format!(
            r#"apiVersion: reprise.dev/v1alpha1
kind: RetryPolicy
metadata: {{ name: reads }}
spec:
  targetRef: {{ name: api, namespace: {srv}, port: 80 }}
  podSelector: {{ matchLabels: {{ app: web }} }}
  methods: [GET]
  statuses: [503]
  acknowledgeDuplicateRisk: true
  retries: {{ attempts: 2, backoffBaseMs: 5, backoffCapMs: 50, budgetPercent: 50 }}
"#
        ),
    );
    c.until(
        "reads In-Sync 1/1 with 3 endpoints",
        Duration::from_secs(60),
        || {
            c.policy_field("reads", "{.status.inSync}") == "1/1"
                && c.policy_field("reads", "{.status.endpoints}") == "3"
        },
    );
    let r = drive(web_a, &api, 200, 0).await.expect("drive A");
    step(&format!("   A: {r}"));
    assert_eq!(r["ok"], 200, "A's 503s recovered across namespaces: {r}");
    // A's policy is A's alone: 20 requests every pod fails, from each
    // namespace, counted at the pods. (B's 503s from the flaky pod alone
    // prove nothing: B's calls pass through on one kept-alive connection
    // to the Service's address, which kube-proxy gives one pod.)
    let unavailable = format!("{api}unavailable");
    let mut attempts = Vec::new();
    for (who, web) in [("A", web_a), ("B", web_b)] {
        let before = served(&c, &srv, "app=api").await;
        let r = drive(web, &unavailable, 20, 0).await.expect("drive");
        let n = served(&c, &srv, "app=api").await - before;
        step(&format!(
            "   {who}, 20 to /unavailable: {n} attempts at the pods; {r}"
        ));
        attempts.push(n);
    }
    assert!(
        attempts[0] > 20,
        "A's policy retries A's calls: {attempts:?}"
    );
    assert_eq!(attempts[1], 20, "and not B's: {attempts:?}");

    // A producer policy for callers in namespaces labelled team=b: its
    // status counts B's traffic.
    apply_in(
        &c,
        &srv,
        &format!(
            r#"apiVersion: reprise.dev/v1alpha1
kind: RetryPolicy
metadata: {{ name: producer, namespace: {srv} }}
spec:
  targetRef: {{ name: api, port: 80 }}
  callerNamespaces: {{ from: Selector, selector: {{ matchLabels: {{ team: b }} }} }}
  match: {{ pathPrefix: /producer }}
  methods: [GET]
  statuses: [503]
  acknowledgeDuplicateRisk: true
  retries: {{ attempts: 2, backoffBaseMs: 5, backoffCapMs: 50, budgetPercent: 50 }}
"#
        ),
    );
    let producer_field = |path: &str| {
        c.kubectl(&[
            "-n",
            &srv,
            "get",
            "rp",
            "producer",
            "-o",
            &format!("jsonpath={path}"),
        ])
        .unwrap_or_default()
    };
    c.until(
        "the producer policy In-Sync 1/1 (B's web)",
        Duration::from_secs(60),
        || producer_field("{.status.inSync}") == "1/1",
    );
    let r = drive(web_b, &format!("http://api.{srv}/producer"), 100, 0)
        .await
        .expect("drive B /producer");
    step(&format!("   B /producer (the producer's policy): {r}"));
    assert_eq!(r["ok"], 100, "{r}");

    // (b) A producer HTTPRoute recovers B's 503s (A's own policy runs
    // first for A); a consumer route in B then replaces it for B.
    step("(b) a producer HTTPRoute with retry and timeouts, then B's consumer route");
    apply_in(
        &c,
        &srv,
        &format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: api-retries, namespace: {srv} }}
spec:
  parentRefs: [{{ group: "", kind: Service, name: api, port: 80 }}]
  rules:
    - matches: [{{ path: {{ type: PathPrefix, value: / }} }}]
      retry: {{ codes: [503], attempts: 2, backoff: 5ms }}
      timeouts: {{ request: 5s }}
      backendRefs: [{{ name: api, port: 80 }}]
"#
        ),
    );
    c.until(
        "the producer route Accepted by Reprise",
        Duration::from_secs(60),
        || route_accepted(&c, &srv, "httproute", "api-retries").is_some_and(|a| a.0 == "True"),
    );
    let accepted = route_accepted(&c, &srv, "httproute", "api-retries").expect("entry");
    step(&format!(
        "   status.parents[reprise.dev/controller] Accepted: {accepted:?}"
    ));
    assert!(
        accepted.2.contains("retries GET, HEAD and OPTIONS"),
        "{accepted:?}"
    );
    // The sidecars converge within a second or two; wait until B is recovered.
    let mut r = Value::Null;
    c.until(
        "B's 503s recovered by the producer route",
        Duration::from_secs(60),
        || {
            r = futures_block(drive(web_b, &api, 100, 0)).expect("drive B");
            r["ok"] == 100
        },
    );
    step(&format!("   B (producer route): {r}"));
    let a = drive(web_a, &api, 100, 0).await.expect("drive A");
    assert_eq!(a["ok"], 100, "A: {a}");
    apply_in(
        &c,
        &b,
        &format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: mine, namespace: {b} }}
spec:
  parentRefs: [{{ group: "", kind: Service, name: api, namespace: {srv}, port: 80 }}]
  rules:
    - matches: [{{ path: {{ type: PathPrefix, value: / }} }}]
      backendRefs: [{{ name: api, namespace: {srv}, port: 80 }}]
"#
        ),
    );
    c.until(
        "B's consumer route Accepted",
        Duration::from_secs(60),
        || route_accepted(&c, &b, "httproute", "mine").is_some_and(|a| a.0 == "True"),
    );
    c.until(
        "B's 503s back: its own route (no retry) replaces the producer's",
        Duration::from_secs(60),
        || {
            r = futures_block(drive(web_b, &api, 100, 0)).expect("drive B");
            count(&r, "statuses", "503") > 0
        },
    );
    step(&format!("   B (its own route, no retry): {r}"));
    let r = drive(web_a, &api, 100, 0).await.expect("drive A");
    assert_eq!(r["ok"], 100, "A is not B: {r}");

    // (c) A GRPCRoute whose annotation retries UNAVAILABLE.
    step("(c) a GRPCRoute retrying UNAVAILABLE");
    apply_in(
        &c,
        &srv,
        &format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: say
  namespace: {srv}
  annotations: {{ reprise.dev/retry-grpc-statuses: UNAVAILABLE, reprise.dev/retry-attempts: "2" }}
spec:
  parentRefs: [{{ group: "", kind: Service, name: api-grpc, port: 9090 }}]
  rules:
    - matches: [{{ method: {{ service: reprise.test.Echo }} }}]
      backendRefs: [{{ name: api-grpc, port: 9090 }}]
"#
        ),
    );
    c.until("the GRPCRoute Accepted", Duration::from_secs(60), || {
        route_accepted(&c, &srv, "grpcroute", "say").is_some_and(|a| a.0 == "True")
    });
    let mut g = Value::Null;
    c.until("every Say call OK", Duration::from_secs(60), || {
        let (status, body) = futures_block(get(
            web_a,
            "app",
            &format!("/drive-grpc?target=api-grpc.{srv}%3A9090&n=60&timeout_s=60"),
        ))
        .expect("/drive-grpc");
        assert_eq!(status, 200, "{body}");
        g = serde_json::from_str(&body).expect("JSON");
        g["ok"] == 60
    });
    step(&format!("   {g}"));
    // api-0's UNAVAILABLEs were retried: the balancer steers away from a
    // failing pod, so which pod answered says little; the sidecar counts.
    let (_, m) = get(addr(&web_a.ip().to_string(), 15021), "metrics", "/metrics")
        .await
        .expect("sidecar metrics");
    let recovered = reprise_e2e::cluster::metric_sum(
        &m,
        "reprise_requests_total",
        &["outcome=\"recovered\"", "upstream=\"api-grpc."],
    );
    step(&format!(
        "   gRPC calls recovered by the route's retries: {recovered}"
    ));
    assert!(recovered > 0.0, "api-0's UNAVAILABLEs recovered:\n{m}");

    // (e) A route with a filter Reprise does not implement: not applied.
    step("(e) a route with a RequestRedirect filter");
    apply_in(
        &c,
        &srv,
        &format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: redirect, namespace: {srv} }}
spec:
  parentRefs: [{{ group: "", kind: Service, name: redirected, port: 80 }}]
  rules:
    - filters: [{{ type: RequestRedirect, requestRedirect: {{ statusCode: 302, hostname: example.com }} }}]
      retry: {{ codes: [503], attempts: 2 }}
"#
        ),
    );
    c.until(
        "the redirect route refused",
        Duration::from_secs(60),
        || route_accepted(&c, &srv, "httproute", "redirect").is_some_and(|a| a.0 == "False"),
    );
    let refused = route_accepted(&c, &srv, "httproute", "redirect").expect("entry");
    step(&format!("   {refused:?}"));
    assert_eq!(refused.1, "UnsupportedValue");
    assert!(refused.2.contains("spec.rules[0].filters"), "{refused:?}");
    // Nothing of it applied: no retry of a request every pod fails.
    let before = served(&c, &srv, "app=api").await;
    let r = drive(
        web_a,
        &format!("http://redirected.{srv}/unavailable"),
        20,
        0,
    )
    .await
    .expect("drive");
    let attempts = served(&c, &srv, "app=api").await - before;
    step(&format!(
        "   20 to /unavailable: {attempts} attempts at the pods; {r}"
    ));
    assert_eq!(attempts, 20, "nothing of it applied: {r}");

    // The ported conformance assertions.
    step("conformance: the upstream tests' routes on Services conf and conn");
    apply_in(&c, &srv, &conformance_routes(&srv));
    for route in [
        "retries",
        "retries-with-timeouts",
        "request-timeout",
        "backend-request-timeout",
        "retries-connection-error",
    ] {
        c.until(
            &format!("{route} Accepted"),
            Duration::from_secs(60),
            || route_accepted(&c, &srv, "httproute", route).is_some_and(|a| a.0 == "True"),
        );
    }
    let conf = format!("http://conf.{srv}");
    let cases: Vec<(&str, String, u64)> = vec![
        // HTTPRouteRetry
        ("HTTPRouteRetry", "/retry/code-500-attempts-3?responseCode=500&succeedAfter=2".into(), 200),
        ("HTTPRouteRetry", "/retry/code-500-attempts-3?responseCode=500&succeedAfter=4".into(), 500),
        ("HTTPRouteRetry", "/retry/code-500-attempts-3?responseCode=503&succeedAfter=2".into(), 503),
        ("HTTPRouteRetry", "/retry/code-all-attempts-2?responseCode=500&succeedAfter=1".into(), 200),
        ("HTTPRouteRetry", "/retry/code-all-attempts-2?responseCode=500&succeedAfter=3".into(), 500),
        ("HTTPRouteRetry", "/retry/code-all-attempts-2?responseCode=502&succeedAfter=1".into(), 200),
        ("HTTPRouteRetry", "/retry/code-all-attempts-2?responseCode=502&succeedAfter=3".into(), 502),
        ("HTTPRouteRetry", "/retry/code-all-attempts-2?responseCode=503&succeedAfter=1".into(), 200),
        ("HTTPRouteRetry", "/retry/code-all-attempts-2?responseCode=503&succeedAfter=3".into(), 503),
        ("HTTPRouteRetry", "/retry/code-all-attempts-2?responseCode=504&succeedAfter=1".into(), 200),
        ("HTTPRouteRetry", "/retry/code-all-attempts-2?responseCode=504&succeedAfter=3".into(), 504),
        ("HTTPRouteRetry", "/retry/code-all-attempts-0?responseCode=500&succeedAfter=1".into(), 500),
        ("HTTPRouteRetry", "/retry/code-all-attempts-0?responseCode=502&succeedAfter=1".into(), 502),
        ("HTTPRouteRetry", "/retry/code-all-attempts-0?responseCode=503&succeedAfter=1".into(), 503),
        ("HTTPRouteRetry", "/retry/code-all-attempts-0?responseCode=504&succeedAfter=1".into(), 504),
        // HTTPRouteRetryWithRequestTimeout
        ("HTTPRouteRetryWithRequestTimeout", "/retry/request-timeout-500ms?responseCode=500&succeedAfter=1".into(), 200),
        ("HTTPRouteRetryWithRequestTimeout", "/retry/request-timeout-500ms?responseCode=500&succeedAfter=2&delayRetry=300ms".into(), 504),
        // HTTPRouteRetryWithBackendTimeout (provisional)
        ("HTTPRouteRetryWithBackendTimeout", "/retry/backend-timeout-500ms?responseCode=500&succeedAfter=2&delayRetry=100ms&delay=100ms".into(), 200),
        ("HTTPRouteRetryWithBackendTimeout", "/retry/request-timeout-500ms?responseCode=500&succeedAfter=2&delayRetry=1s&delay=1s".into(), 504),
        // HTTPRouteTimeoutRequest
        ("HTTPRouteTimeoutRequest", "/request-timeout".into(), 200),
        ("HTTPRouteTimeoutRequest", "/request-timeout?delay=1s".into(), 504),
        ("HTTPRouteTimeoutRequest", "/disable-request-timeout?delay=1s".into(), 200),
        // HTTPRouteTimeoutBackendRequest
        ("HTTPRouteTimeoutBackendRequest", "/backend-timeout".into(), 200),
        ("HTTPRouteTimeoutBackendRequest", "/backend-timeout?delay=1s".into(), 504),
        ("HTTPRouteTimeoutBackendRequest", "/disable-backend-timeout?delay=1s".into(), 200),
    ];
    let mut results = Vec::new();
    for (test, path, want) in &cases {
        // Three times each, a new uuid every time (the upstream suite asks
        // for consecutive successes).
        for _ in 0..3 {
            let sep = if path.contains('?') { '&' } else { '?' };
            let url = if path.starts_with("/retry/") {
                format!("{conf}{path}{sep}uuid={}", uuid())
            } else {
                format!("{conf}{path}")
            };
            let r = drive(web_a, &url, 1, 0).await.expect("drive");
            let got = r["statuses"]
                .as_object()
                .and_then(|m| m.keys().next().cloned())
                .unwrap_or_default();
            results.push(format!(
                "{test} {path}: want {want}, got {got} {}",
                r["reprise_errors"]
            ));
            assert_eq!(got, want.to_string(), "{test} {path}: {r}");
            if *want == 200 {
                assert_eq!(
                    count(&r, "bodies", "?"),
                    0,
                    "the conformance backend answered: {r}"
                );
            }
        }
    }
    // HTTPRouteRetryConnectionError: ten in a row answered by the healthy pod.
    for _ in 0..10 {
        let r = drive(
            web_a,
            &format!("http://conn.{srv}/retry-on-connection-errors"),
            1,
            0,
        )
        .await
        .expect("drive");
        let healthy = r["bodies"]
            .as_object()
            .is_some_and(|b| b.keys().all(|k| k.starts_with("conn-healthy")));
        assert!(
            r["ok"] == 1 && healthy,
            "HTTPRouteRetryConnectionError: {r}"
        );
    }
    results.push("HTTPRouteRetryConnectionError /retry-on-connection-errors: 10 of 10 answered by conn-healthy".into());
    step(&format!(
        "   conformance, each case three times:\n     {}",
        results.join("\n     ")
    ));

    // (f) Status: the consumer policy and the producer's count the traffic
    // that crossed namespaces (written at most once a minute).
    step("(f) status.traffic of the consumer and the producer policies");
    let rp = c
        .kubectl(&["-n", &c.ns, "get", "rp"])
        .expect("kubectl get rp");
    step(&format!("   kubectl get rp:\n{rp}"));
    assert!(rp.contains("reads") && rp.contains("1/1"), "{rp}");
    c.until(
        "status.traffic of both policies",
        Duration::from_secs(150),
        || {
            let own: u64 = c
                .policy_field("reads", "{.status.traffic.requests}")
                .parse()
                .unwrap_or(0);
            let theirs: u64 = producer_field("{.status.traffic.requests}")
                .parse()
                .unwrap_or(0);
            own >= 200 && theirs >= 100
        },
    );
    let own = json(&c, &c.ns, &["get", "rp", "reads"]);
    let theirs = json(&c, &srv, &["get", "rp", "producer"]);
    step(&format!(
        "   reads: {}\n   producer: {}",
        own["status"]["traffic"], theirs["status"]["traffic"]
    ));
    assert!(own["status"]["traffic"]["recovered"].as_i64().unwrap_or(0) > 0);
    // A route's traffic: in Reprise's entry of its status.parents.
    let mut said = String::new();
    c.until("the producer route's reprise.dev/Traffic condition", Duration::from_secs(150), || {
        said = c
            .kubectl(&[
                "-n", &srv, "get", "httproute", "api-retries", "-o",
                "jsonpath={.status.parents[?(@.controllerName==\"reprise.dev/controller\")].conditions[?(@.type==\"reprise.dev/Traffic\")].message}",
            ])
            .unwrap_or_default();
        said.contains("requests")
    });
    step(&format!(
        "   HTTPRoute api-retries, reprise.dev/Traffic: {said}"
    ));
    step("done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e cluster with its node: run e2e/test.sh"]
async fn an_xbackendtrafficpolicy_budget_bounds_retries_at_the_pods() {
    node_name().expect("REPRISE_E2E_NODE: this test needs the node");
    let c = Cluster::new("gwb");
    let t0 = Instant::now();
    let step = |what: &str| eprintln!("[budget test {:>6.1}s] {what}", t0.elapsed().as_secs_f64());
    let (_release, srv, b) = setup(&c, "experimental", &step);
    let _namespaces = Namespaces(&c, vec![srv.clone(), b]);
    let web_a = web(&c, &c.ns);
    apply_in(
        &c,
        &srv,
        &format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: api-retries, namespace: {srv} }}
spec:
  parentRefs: [{{ group: "", kind: Service, name: api, port: 80 }}]
  rules:
    - retry: {{ codes: [503], attempts: 2, backoff: 1ms }}
      backendRefs: [{{ name: api, port: 80 }}]
"#
        ),
    );
    c.until("the route Accepted", Duration::from_secs(60), || {
        route_accepted(&c, &srv, "httproute", "api-retries").is_some_and(|a| a.0 == "True")
    });
    // Every pod fails /unavailable: each request is worth two retries.
    let budget = |percent: u32, count: u32| {
        format!(
            r#"apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XBackendTrafficPolicy
metadata: {{ name: api-budget, namespace: {srv} }}
spec:
  targetRefs: [{{ group: "", kind: Service, name: api }}]
  retryConstraint:
    budget: {{ percent: {percent}, interval: 10s }}
    minRetryRate: {{ count: {count}, interval: 1s }}
"#
        )
    };
    let mut rows = Vec::new();
    for (percent, count) in [(100, 1000), (0, 1)] {
        apply_in(&c, &srv, &budget(percent, count));
        // Let the budget reach the sidecar and a fresh window begin.
        tokio::time::sleep(Duration::from_secs(12)).await;
        let before = served(&c, &srv, "app=api").await;
        let started = Instant::now();
        let r = drive(web_a, &format!("http://api.{srv}/unavailable"), 200, 20)
            .await
            .expect("drive");
        let secs = started.elapsed().as_secs_f64();
        let attempts = served(&c, &srv, "app=api").await - before;
        step(&format!("   percent {percent}, minRetryRate {count}/s: 200 requests in {secs:.1} s, {attempts} attempts at the pods; {r}"));
        rows.push((percent, count, secs, attempts));
    }
    let (unbounded, bounded) = (rows[0].3, rows[1].3);
    assert!(
        unbounded >= 580,
        "a 100% budget lets every retry through: {rows:?}"
    );
    // 0% and one retry a second over a 10 s window: the 200 requests' own
    // attempts and at most about ten retries per ten seconds of the run.
    let allowed = 200 + (rows[1].2 / 10.0).ceil() as u64 * 10 + 10;
    assert!(
        bounded >= 200 && bounded <= allowed,
        "the budget bounds retries: {bounded} > {allowed} ({rows:?})"
    );
    let ancestors = c
        .kubectl(&[
            "-n",
            &srv,
            "get",
            "xbackendtrafficpolicy",
            "api-budget",
            "-o",
            "jsonpath={.status.ancestors}",
        ])
        .expect("status");
    assert!(
        ancestors.contains("reprise.dev/controller") && ancestors.contains("\"Accepted\""),
        "{ancestors}"
    );
    step(&format!("   status.ancestors: {ancestors}"));
    step("done");
}

fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}
