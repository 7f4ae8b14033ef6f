//! Issue 55 on the real node: deadlines that travel down a call chain, and
//! retries across its layers.
//!
//! - Deployments `front`, `orders` and `stock`, three pods each, and `web`
//!   (one pod, the client: `/drive`), all injected. `front` and `orders` run
//!   the e2e app in chain mode (`NEXT_HOP`): each request is a call to the
//!   next hop through the pod's sidecar, with `traceparent` and `baggage`
//!   forwarded by OpenTelemetry's propagators. `stock` answers, after
//!   `?delay_ms=`, a 503 to `?fail_percent=` of requests.
//! - One RetryPolicy per layer: `web` → `front`, `front` → `orders`,
//!   `orders` → `stock`.
//! - The namespace's `reprise.dev/deadline-propagate: "false"` reaches a
//!   new pod's sidecar as `REPRISE_DEADLINE_PROPAGATE=false` (the webhook
//!   reads the namespace, which the chart's RBAC allows).
//! - Layers: `stock` failing 0%, 50% and 100%, every layer at `attempts: 2`,
//!   with a budget that binds (10%, no floor) and one that does not (100%),
//!   `retryLayers: Every` and `Once`: attempts at `stock` per client
//!   request, first-try success, recovered requests, effective success.
//! - Deadline: `stock` slowed past the first hop's deadline (1 s; 3 s to
//!   answer), hops that do not cancel their calls (`?cancel_calls=false`):
//!   attempts started at `stock` after the first hop's deadline, with
//!   propagation and without (every policy's `deadlines` off).
//! - Jaeger: one chain's trace, a hop's SERVER span stopped by the
//!   propagated deadline (`reprise.deadline.stopped`), under the caller's
//!   spans.
//!
//! The tables are printed (`[chain test]` lines) for the results file.
//! Run alone: `--test cluster -- --ignored node::chain:: --test-threads=1
//! --nocapture`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use reprise_e2e::cluster::{drive, node_name, Cluster, Release};
use reprise_e2e::hop::Seen;
use serde_json::Value;

use super::{ip, pods, ready};

/// Client requests per row of the layers table.
const LAYER_REQUESTS: u32 = 100;
/// Client requests per row of the deadline table.
const DEADLINE_REQUESTS: u32 = 20;
/// The first hop's deadline in the deadline table.
const FIRST_DEADLINE_MS: u64 = 1_000;

fn app_yaml() -> String {
    let security = "securityContext: { runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: { drop: [ALL] }, seccompProfile: { type: RuntimeDefault } }";
    let resources = "resources: { requests: { cpu: 10m, memory: 16Mi }, limits: { memory: 64Mi } }";
    let deployment = |name: &str, replicas: u32, next: Option<&str>| {
        let next = next.map_or(String::new(), |n| {
            format!("\n            - {{ name: NEXT_HOP, value: {n} }}")
        });
        format!(
            r#"apiVersion: apps/v1
kind: Deployment
metadata: {{ name: {name} }}
spec:
  replicas: {replicas}
  selector: {{ matchLabels: {{ app: {name} }} }}
  template:
    metadata: {{ labels: {{ app: {name} }} }}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: app
          image: reprise.local/e2e-app:dev
          imagePullPolicy: Never
          ports: [{{ name: http, containerPort: 8080 }}]
          env:
            - {{ name: POD_NAME, valueFrom: {{ fieldRef: {{ fieldPath: metadata.name }} }} }}
            - {{ name: POD_IP, valueFrom: {{ fieldRef: {{ fieldPath: status.podIP }} }} }}
            - {{ name: DRAIN_MS, value: "500" }}{next}
          readinessProbe: {{ httpGet: {{ path: /healthz, port: 8080 }}, periodSeconds: 1, failureThreshold: 1 }}
          {resources}
          {security}
---
"#
        )
    };
    let service = |name: &str| {
        format!(
            r#"apiVersion: v1
kind: Service
metadata: {{ name: {name} }}
spec:
  selector: {{ app: {name} }}
  ports: [{{ name: http, port: 80, targetPort: 8080 }}]
---
"#
        )
    };
    [
        deployment("web", 1, None),
        deployment("front", 3, Some("orders")),
        deployment("orders", 3, Some("stock")),
        deployment("stock", 3, None),
        service("front"),
        service("orders"),
        service("stock"),
    ]
    .concat()
}

/// The RetryPolicy of the layer whose pods are `caller`, calling `callee`.
fn policy_yaml(caller: &str, callee: &str, spec: &str) -> String {
    format!(
        r#"apiVersion: reprise.dev/v1alpha1
kind: RetryPolicy
metadata: {{ name: {caller}-{callee} }}
spec:
  targetRef: {{ name: {callee}, port: 80 }}
  podSelector: {{ matchLabels: {{ app: {caller} }} }}
  methods: [GET]
  acknowledgeDuplicateRisk: true
{spec}
"#
    )
}

/// The three layers: `web` → `front` → `orders` → `stock`.
const LAYERS: [(&str, &str); 3] = [("web", "front"), ("front", "orders"), ("orders", "stock")];

/// Applies `spec(layer)` to every layer's policy and waits until every
/// selected sidecar runs the new generation.
fn apply_policies(c: &Cluster, spec: impl Fn(usize) -> String) {
    for (i, (caller, callee)) in LAYERS.iter().enumerate() {
        c.apply(&policy_yaml(caller, callee, &spec(i)))
            .unwrap_or_else(|e| panic!("RetryPolicy {caller}-{callee}: {e}"));
    }
    for (caller, callee) in LAYERS {
        let policy = format!("{caller}-{callee}");
        c.until(
            &format!("{policy} in sync at its generation"),
            Duration::from_secs(90),
            || {
                let generation = c.policy_field(&policy, "{.metadata.generation}");
                let observed = c.policy_field(&policy, "{.status.observedGeneration}");
                let in_sync = c.policy_field(&policy, "{.status.inSync}");
                let want = if caller == "web" { "1/1" } else { "3/3" };
                generation == observed && in_sync == want
            },
        );
    }
}

/// What `stock`'s pods saw of the requests tagged `tag`.
async fn seen(c: &Cluster, tag: &str) -> Vec<Seen> {
    let prefix = format!("{tag}-");
    let mut out = Vec::new();
    for p in pods(c, &c.ns, "app=stock") {
        let addr: SocketAddr = format!("{}:8080", ip(&p)).parse().expect("address");
        let (status, body) = reprise_e2e::cluster::get(addr, "stats", "/stats")
            .await
            .expect("stock's /stats");
        assert_eq!(status, 200, "{body}");
        let stats: Value = serde_json::from_str(&body).expect("JSON");
        let all: Vec<Seen> = serde_json::from_value(stats["seen"].clone()).expect("seen");
        out.extend(all.into_iter().filter(|s| s.id.starts_with(&prefix)));
    }
    out
}

/// One row of the layers table: `(attempts at stock per request,
/// first-try successes, recovered, successes)`.
fn figures(by_id: &BTreeMap<String, u16>, seen: &[Seen]) -> (f64, u64, u64, u64) {
    let mut attempts: BTreeMap<&str, Vec<&Seen>> = BTreeMap::new();
    for s in seen {
        attempts.entry(s.id.as_str()).or_default().push(s);
    }
    let (mut first_ok, mut recovered, mut ok) = (0, 0, 0);
    for (id, status) in by_id {
        let mut tries = attempts.get(id.as_str()).cloned().unwrap_or_default();
        tries.sort_by_key(|s| s.started_ms);
        let first = tries.first().is_some_and(|s| s.status == Some(200));
        first_ok += u64::from(first);
        if *status == 200 {
            ok += 1;
            recovered += u64::from(!first);
        }
    }
    (
        seen.len() as f64 / by_id.len().max(1) as f64,
        first_ok,
        recovered,
        ok,
    )
}

fn by_id(r: &Value) -> BTreeMap<String, u16> {
    serde_json::from_value(r["by_id"].clone()).expect("by_id")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e cluster with its node: run e2e/test.sh"]
async fn deadlines_and_retries_across_a_three_hop_chain() {
    node_name().expect(
        "REPRISE_E2E_NODE: this test needs the node (e2e/cluster.sh up without --api-only, then e2e/images.sh)",
    );
    let c = Cluster::bare("chain");
    let release = Release::new(
        &c.kubeconfig,
        &format!("reprise-chain-{}", std::process::id()),
        "reprise",
    );
    let t0 = Instant::now();
    let step = |what: &str| eprintln!("[chain test {:>6.1}s] {what}", t0.elapsed().as_secs_f64());

    step("1. helm install --wait (Jaeger, every trace sampled)");
    let out = release
        .install_on_node(&["jaeger.enabled=true", "otel.sampler=always_on"], "240s")
        .unwrap_or_else(|e| {
            let pods = release.kubectl(&["get", "pods", "-o", "wide"]);
            panic!("helm install: {e}\npods: {pods:?}")
        });
    assert!(out.contains("STATUS: deployed"), "{out}");
    c.kubectl(&["label", "namespace", &c.ns, "reprise.dev/inject=enabled"])
        .expect("label");
    c.until_injecting(Duration::from_secs(60));

    step("2. the chain: web -> front -> orders -> stock, three pods a hop");
    c.apply(&app_yaml()).expect("the chain");
    for (app, n) in [("web", 1), ("front", 3), ("orders", 3), ("stock", 3)] {
        c.until(
            &format!("{n} Ready {app} pods"),
            Duration::from_secs(240),
            || {
                pods(&c, &c.ns, &format!("app={app}"))
                    .iter()
                    .filter(|p| ready(p))
                    .count()
                    == n
            },
        );
    }
    apply_policies(&c, |_| {
        "  statuses: [503]\n  retries: { attempts: 2, backoffBaseMs: 1, backoffCapMs: 5, budgetPercent: 100 }"
            .to_string()
    });
    let web = pods(&c, &c.ns, "app=web")
        .into_iter()
        .find(ready)
        .expect("web");
    assert_eq!(web["spec"]["initContainers"][0]["name"], "reprise-sidecar");
    let web_app: SocketAddr = format!("{}:8080", ip(&web)).parse().expect("address");
    // Every hop answers through the chain.
    let r = drive(web_app, "http://front/work", 10, 0)
        .await
        .expect("drive");
    assert_eq!(r["ok"], 10, "the chain answers: {r}");

    // 3. Layers.
    step("3. layers: attempts at stock per client request");
    let mut table = vec![
        "| budget | stock fails | retryLayers | attempts at stock per client request | first-try success | recovered | effective success |".to_string(),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    let mut rows = BTreeMap::new();
    for (b, (budget_name, budget)) in [
        ("100% (does not bind)", "budgetPercent: 100"),
        (
            "10%, no floor (binds)",
            "budgetPercent: 10, budgetMinRetriesPerSecond: 0",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        for layers in ["Every", "Once"] {
            apply_policies(&c, |_| {
                format!("  statuses: [503]\n  retryLayers: {layers}\n  retries: {{ attempts: 2, backoffBaseMs: 1, backoffCapMs: 5, {budget} }}")
            });
            for fail in [0u32, 50, 100] {
                // A fresh budget window for every row.
                tokio::time::sleep(Duration::from_secs(11)).await;
                let tag = format!("l{b}-{layers}-{fail}");
                let url = format!("http://front/work?fail_percent={fail}");
                let r = drive_tagged(web_app, &url, LAYER_REQUESTS, &tag).await;
                let statuses = by_id(&r);
                assert_eq!(statuses.len() as u32, LAYER_REQUESTS, "{r}");
                let seen = seen(&c, &tag).await;
                let (per_request, first_ok, recovered, ok) = figures(&statuses, &seen);
                let n = f64::from(LAYER_REQUESTS);
                let line = format!(
                    "| {budget_name} | {fail}% | {layers} | {per_request:.2} | {:.0}% | {recovered} ({:.0}%) | {:.0}% |",
                    100.0 * first_ok as f64 / n,
                    100.0 * recovered as f64 / n,
                    100.0 * ok as f64 / n,
                );
                step(&line);
                table.push(line);
                rows.insert((budget_name, layers, fail), (per_request, ok));
            }
        }
    }
    step(&format!("layers table:\n{}", table.join("\n")));
    // What must hold whatever the run: nothing fails at 0%, nothing
    // recovers at 100%, and without a binding budget a total outage costs
    // 27 attempts with every layer retrying and 7 with the rule.
    for budget in ["100% (does not bind)", "10%, no floor (binds)"] {
        for layers in ["Every", "Once"] {
            let (per, ok) = rows[&(budget, layers, 0)];
            assert_eq!(
                (per, ok),
                (1.0, u64::from(LAYER_REQUESTS)),
                "{budget} {layers} 0%"
            );
            assert_eq!(rows[&(budget, layers, 100)].1, 0, "{budget} {layers} 100%");
        }
    }
    assert_eq!(rows[&("100% (does not bind)", "Every", 100)].0, 27.0);
    assert_eq!(rows[&("100% (does not bind)", "Once", 100)].0, 7.0);

    // 4. The deadline: stock slowed past the first hop's deadline, hops
    //    that let their calls run on.
    step("4. deadline: attempts at stock after the first hop's deadline");
    let mut table = vec![
        "| propagation | client requests | attempts at stock | started after the first hop's deadline | per client request |".to_string(),
        "|---|---|---|---|---|".to_string(),
    ];
    let mut late_by = BTreeMap::new();
    for propagate in [false, true] {
        let switches = if propagate {
            ""
        } else {
            "\n  deadlines: { propagate: false, acceptIncoming: false }"
        };
        apply_policies(&c, |layer| {
            let (total, attempt) = if layer == 0 {
                (format!(", totalDeadlineMs: {FIRST_DEADLINE_MS}"), 400)
            } else {
                (String::new(), 2_000)
            };
            format!("  failureBoundary: BeforeHeaders{switches}\n  retries: {{ attempts: 2, reuseEndpoints: true, backoffBaseMs: 1, backoffCapMs: 5, budgetPercent: 100, attemptTimeoutMs: {attempt}{total} }}")
        });
        let tag = format!("d-{propagate}");
        let url = "http://front/work?delay_ms=3000&cancel_calls=false";
        let r = drive_tagged(web_app, url, DEADLINE_REQUESTS, &tag).await;
        assert_eq!(
            r["statuses"]["504"].as_u64(),
            Some(u64::from(DEADLINE_REQUESTS)),
            "every client request ends at its 1 s deadline: {r}"
        );
        // The hops that do not cancel go on after their callers gave up.
        tokio::time::sleep(Duration::from_secs(15)).await;
        let seen = seen(&c, &tag).await;
        let late = seen
            .iter()
            .filter(|s| {
                s.sent_ms
                    .is_some_and(|sent| s.started_ms > sent + FIRST_DEADLINE_MS)
            })
            .count();
        let line = format!(
            "| {} | {DEADLINE_REQUESTS} | {} | {late} | {:.2} |",
            if propagate { "on" } else { "off" },
            seen.len(),
            late as f64 / f64::from(DEADLINE_REQUESTS)
        );
        step(&line);
        table.push(line);
        late_by.insert(propagate, late);
    }
    step(&format!("deadline table:\n{}", table.join("\n")));
    assert_eq!(
        late_by[&true], 0,
        "with propagation no attempt starts past the deadline"
    );
    assert!(late_by[&false] > 0, "without it the hops below go on");

    // 5. Jaeger: a hop stopped by the propagated deadline, in the chain's trace.
    step("5. Jaeger: a chain's trace with a hop stopped by the propagated deadline");
    let jaeger_pod = pods(&c, &release.ns, "app.kubernetes.io/component=jaeger")
        .into_iter()
        .find(ready)
        .expect("a Ready Jaeger pod");
    let jaeger = format!("http://{}:16686", ip(&jaeger_pod));
    let mut found = None;
    let start = Instant::now();
    while found.is_none() && start.elapsed() < Duration::from_secs(60) {
        found = reprise_e2e::jaeger::find(
            &jaeger,
            "reprise-sidecar",
            &[("reprise.deadline.stopped", "attempt_cut")],
            20,
        )
        .await
        .ok()
        .and_then(|traces| {
            traces.into_iter().find(|t| {
                let pods: std::collections::BTreeSet<_> = t
                    .spans
                    .iter()
                    .filter_map(|s| s.tag("k8s.pod.name"))
                    .collect();
                pods.iter().any(|p| p.starts_with("web-")) && pods.len() >= 3
            })
        });
        if found.is_none() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let trace = found.expect("a chain's trace with a hop stopped by the propagated deadline");
    let drawn = reprise_e2e::jaeger::waterfall(&trace, 40);
    let stopped = trace
        .spans
        .iter()
        .find(|s| s.tag("reprise.deadline.stopped") == Some("attempt_cut"))
        .expect("the stopped hop");
    assert_eq!(stopped.tag("span.kind"), Some("server"), "{drawn}");
    assert_eq!(
        stopped.tag("reprise.deadline.received"),
        Some("accepted"),
        "{drawn}"
    );
    let pod = stopped.tag("k8s.pod.name").unwrap_or_default();
    assert!(
        pod.starts_with("front-") || pod.starts_with("orders-"),
        "a hop below the first: {pod}\n{drawn}"
    );
    let root = trace
        .spans
        .iter()
        .find(|s| s.parent.is_none())
        .expect("the root");
    assert!(
        root.tag("k8s.pod.name")
            .is_some_and(|p| p.starts_with("web-")),
        "the trace starts at the client's sidecar:\n{drawn}"
    );
    let summary: Vec<String> = trace
        .spans
        .iter()
        .map(|s| {
            format!(
                "{} {} pod={} received={} left_ms={} stopped={} error={}",
                s.tag("span.kind").unwrap_or("?"),
                s.name,
                s.tag("k8s.pod.name").unwrap_or("?"),
                s.tag("reprise.deadline.received").unwrap_or("-"),
                s.tag("reprise.deadline.left_ms").unwrap_or("-"),
                s.tag("reprise.deadline.stopped").unwrap_or("-"),
                s.tag("error.type").unwrap_or("-"),
            )
        })
        .collect();
    step(&format!(
        "   trace {}:\n{drawn}\n{}",
        trace.id,
        summary.join("\n")
    ));
    // 6. A namespace's switch reaches its new pods' sidecars (last: the
    //    webhook keeps a namespace's annotations for 30 s).
    step("6. the namespace's reprise.dev/deadline-propagate reaches a new pod");
    c.kubectl(&[
        "annotate",
        "namespace",
        &c.ns,
        "reprise.dev/deadline-propagate=false",
    ])
    .expect("annotate");
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: { name: probe }\nspec:\n  containers: [{ name: app, image: reprise.local/e2e-app:dev, imagePullPolicy: Never }]\n",
    )
    .expect("pod probe");
    let probe: Value = serde_json::from_str(
        &c.kubectl(&["-n", &c.ns, "get", "pod", "probe", "-o", "json"])
            .expect("get probe"),
    )
    .expect("json");
    let env = &probe["spec"]["initContainers"][0]["env"];
    assert!(
        env.as_array()
            .into_iter()
            .flatten()
            .any(|e| e["name"] == "REPRISE_DEADLINE_PROPAGATE" && e["value"] == "false"),
        "the namespace's annotation in the sidecar's environment: {env}"
    );
    c.kubectl(&["-n", &c.ns, "delete", "pod", "probe", "--wait=false"])
        .expect("delete probe");
    c.kubectl(&[
        "annotate",
        "namespace",
        &c.ns,
        "reprise.dev/deadline-propagate-",
    ])
    .expect("remove the annotation");

    step("done");
}

/// `drive` with every request tagged `tag-N` in its baggage.
async fn drive_tagged(app: SocketAddr, url: &str, n: u32, tag: &str) -> Value {
    let path = format!(
        "/drive?url={}&n={n}&interval_ms=0&timeout_s=300&chain_tag={tag}",
        url.replace(':', "%3A")
            .replace('/', "%2F")
            .replace('?', "%3F")
            .replace('&', "%26")
            .replace('=', "%3D")
    );
    let (status, body) = tokio::time::timeout(
        Duration::from_secs(330),
        reprise_e2e::cluster::get(app, "app", &path),
    )
    .await
    .expect("/drive answered in time")
    .expect("/drive");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("/drive JSON")
}
