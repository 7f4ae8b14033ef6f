//! Issue 45's model cluster (not a test): the controller's real cache, fed
//! generated objects through [`Cache::fed`] (the live watches' event path),
//! its real snapshot source ([`push::cache_source`]) and its real
//! [`PushServer`], in one process per replica; N sidecars running the real
//! subscription code in a second process, as `push_scale` does. Only the
//! authentication is stubbed: a pod's labels come from the model.
//!
//! The model: 200 namespaces of 10 Services each (3 to 20 endpoints; the
//! first Service of every 20th namespace has 500, in EndpointSlices of at
//! most 100) and 5 RetryPolicies each (policy `p-k` targets Service `svc-k`
//! and selects the pods labelled `app=app-k`). A fifth of the sidecars call
//! the restarted Service `ns-000/svc-0` (Deployments of 50 replicas, one
//! pod in ten from a StatefulSet); the rest are spread over every
//! namespace and apps `app-0` to `app-5` (`app-5`: no policy). Deployment
//! pods share their Deployment's labels; a StatefulSet pod has its own
//! (`statefulset.kubernetes.io/pod-name`).
//!
//! Phases: feed the model; connect the sidecars; wait until every one
//! ACKed; then 60 s of churn: a rolling restart of `ns-000/svc-0` at 20
//! endpoint changes a second (each replaces one pod: its endpoint leaves,
//! a new address comes, one EndpointSlice update) and one edit a second of
//! `ns-001/p-1` (its rule's priority, generation bumped).
//!
//! A sidecar is affected by a change when its snapshot contains what
//! changed: the restarted Service's upstream, or the edited policy. Before
//! the churn, each replica checks this against `snapshot_for` for every
//! label set of the model. A change reaches a sidecar when its proxy runs a
//! configuration that contains it (each new address encodes its change's
//! number, each edit's priority its own); the subscription sends the ACK
//! right after (and writes the snapshot at most once a second). The clients
//! process watches every proxy's configuration every 10 ms.
//!
//! The load includes the traffic reports: every simulated sidecar counts a
//! little traffic under its policies each second
//! (`Proxy::count_model_traffic`), so that its subscription sends the
//! controller a report every 10 s, as a serving sidecar does; the detail
//! line says how many the controller holds at the end.
//!
//! With `--routes` (issue 53), a third of the policies are producer
//! HTTPRoutes instead: policy `p-k` of namespace `i` with `(i + k) % 3 == 0`
//! becomes route `r-k` attached to `svc-k` in its namespace (retry on 503,
//! three attempts), which applies to every sidecar of every namespace (its
//! Service's endpoints in every snapshot: eager). The restarted Service
//! `ns-000/svc-0` is then a producer's: every sidecar is affected by its
//! churn. The edited policy stays a policy.
//!
//! `cargo run --release -p reprise-controller --example cluster_scale -- 10000 [--replicas 3] [--routes] [--out FILE]`

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use reprise_controller::cache::{Cache, Feed};
use reprise_controller::metrics::{Counter, Metrics};
use reprise_controller::push::{self, AuthError, Identity, PushServer};
use reprise_controller::sidecars::SidecarRegistry;
use reprise_controller::HTTPRoute;
use reprise_crds::resource::{RetryPolicy, RetryPolicySpec, TargetRef};
use reprise_crds::retry_rule::RetryRule;
use reprise_crds::snapshot::Snapshot;

const NAMESPACES: usize = 200;
const SERVICES_PER_NAMESPACE: usize = 10;
const POLICIES_PER_NAMESPACE: usize = 5;
/// Every this many namespaces, the first Service has `BIG_ENDPOINTS`.
const BIG_EVERY: usize = 20;
const BIG_ENDPOINTS: usize = 500;
/// Kubernetes' default EndpointSlice size.
const SLICE_MAX: usize = 100;
/// Apps per namespace: `app-0`..`app-4` have a policy each, `app-5` none.
const APPS: usize = 6;
const DEPLOYMENT_REPLICAS: usize = 50;

const RESTARTED_NS: &str = "ns-000";
const RESTARTED_SVC: &str = "svc-0";
const EDITED_NS: &str = "ns-001";
const EDITED_POLICY: &str = "p-1";
const EDITED_APP: &str = "app-1";

const CHURN_SECS: u64 = 60;
const ENDPOINT_CHANGES_PER_SEC: u64 = 20;
/// New pods of the restart get addresses from here on, the change's number added.
const NEW_POD_BASE: u32 = u32::from_be_bytes([10, 128, 0, 0]);

fn main() -> anyhow::Result<()> {
    raise_descriptor_limit();
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("server") => server(args[2].parse()?),
        Some("clients") => clients(&args[2], args[3].parse()?, &args[4]),
        _ => driver(&args[1..]),
    }
}

/// Raises the soft descriptor limit to the hard one: one per sidecar
/// stream on either side.
fn raise_descriptor_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    );
}

// ---------------------------------------------------------------- model

/// `--routes`: set in the driver's environment, inherited by its processes.
fn routes_mode() -> bool {
    std::env::var_os("CLUSTER_SCALE_ROUTES").is_some()
}

/// Whether policy `k` of namespace `i` is a producer route in `--routes` mode.
fn producer(i: usize, k: usize) -> bool {
    routes_mode() && (i + k).is_multiple_of(3)
}

fn ns(i: usize) -> String {
    format!("ns-{i:03}")
}

/// A sidecar pod of the model.
struct Pod {
    namespace: String,
    name: String,
    labels: BTreeMap<String, String>,
}

/// The N sidecar pods, the same in every process.
fn pods(n: usize) -> Vec<Pod> {
    let callers = n / 5;
    let mut per_namespace = vec![0usize; NAMESPACES];
    (0..n)
        .map(|i| {
            let (namespace, app, deployment, stateful) = if i < callers {
                // Callers of the restarted Service: Deployments of 50, and
                // one pod in ten from a StatefulSet.
                (
                    RESTARTED_NS.to_string(),
                    0,
                    format!("caller-{}", i / DEPLOYMENT_REPLICAS),
                    i % 10 == 9,
                )
            } else {
                let j = i - callers;
                let k = j % NAMESPACES;
                let l = per_namespace[k];
                per_namespace[k] += 1;
                let app = l % APPS;
                (ns(k), app, format!("app-{app}-web"), l % 10 == 7)
            };
            let app = format!("app-{app}");
            let mut labels = BTreeMap::from([("app".to_string(), app.clone())]);
            let name = if stateful {
                let name = format!("{app}-db-{i}");
                labels.insert("statefulset.kubernetes.io/pod-name".into(), name.clone());
                labels.insert("controller-revision-hash".into(), format!("{app}-db-7f9c"));
                name
            } else {
                let hash = format!("{:08x}", fnv(&format!("{namespace}/{deployment}")) as u32);
                labels.insert("pod-template-hash".into(), hash.clone());
                format!("{deployment}-{hash}-{i:05}")
            };
            Pod {
                namespace,
                name,
                labels,
            }
        })
        .collect()
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

/// Whether the change of a kind reaches this pod: the policies select by
/// `app` within their namespace.
fn calls_restarted(p: &Pod) -> bool {
    // A producer's route reaches every sidecar.
    routes_mode()
        || p.namespace == RESTARTED_NS && p.labels.get("app").map(String::as_str) == Some("app-0")
}

fn edit_selects(p: &Pod) -> bool {
    p.namespace == EDITED_NS && p.labels.get("app").map(String::as_str) == Some(EDITED_APP)
}

fn endpoints_of(namespace: usize, service: usize) -> usize {
    if service == 0 && namespace.is_multiple_of(BIG_EVERY) {
        BIG_ENDPOINTS
    } else {
        3 + (namespace * 7 + service * 13) % 18
    }
}

fn endpoint(ip: Ipv4Addr, pod: &str, namespace: &str, zone: usize) -> serde_json::Value {
    serde_json::json!({
        "addresses": [ip.to_string()],
        "conditions": { "ready": true, "serving": true, "terminating": false },
        "targetRef": { "kind": "Pod", "name": pod, "namespace": namespace },
        "zone": format!("zone-{}", ["a", "b", "c"][zone % 3]),
    })
}

fn slice(
    namespace: &str,
    service: &str,
    index: usize,
    endpoints: Vec<serde_json::Value>,
) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("{service}-{index:02}"),
            "namespace": namespace,
            "labels": { "kubernetes.io/service-name": service, "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io" },
        },
        "addressType": "IPv4",
        "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
        "endpoints": endpoints,
    }))
    .expect("slice")
}

fn policy(namespace: &str, k: usize, priority: i32, generation: i64) -> RetryPolicy {
    let mut rule = RetryRule {
        priority,
        ..RetryRule::default()
    };
    rule.retries.attempts = 3;
    let mut p = RetryPolicy::new(
        &format!("p-{k}"),
        RetryPolicySpec {
            target_ref: TargetRef {
                name: format!("svc-{k}"),
                namespace: None,
                port: None,
            },
            pod_selector: Some(
                serde_json::from_value(
                    serde_json::json!({ "matchLabels": { "app": format!("app-{k}") } }),
                )
                .expect("selector"),
            ),
            caller_namespaces: None,
            rule,
        },
    );
    p.metadata.namespace = Some(namespace.into());
    p.metadata.generation = Some(generation);
    p
}

/// Producer route `r-k`, in `namespace`, attached to `svc-k`.
fn route(namespace: &str, k: usize) -> HTTPRoute {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": { "name": format!("r-{k}"), "namespace": namespace, "generation": 1,
                      "creationTimestamp": "2026-12-01T00:00:00Z" },
        "spec": {
            "parentRefs": [{ "group": "", "kind": "Service", "name": format!("svc-{k}"), "port": 80 }],
            "rules": [{
                "matches": [{ "path": { "type": "PathPrefix", "value": "/" } }],
                "retry": { "codes": [503], "attempts": 3 },
                "backendRefs": [{ "name": format!("svc-{k}"), "port": 80 }]
            }]
        }
    }))
    .expect("route")
}

/// The cluster's objects: policies, Services, EndpointSlices, and with
/// `--routes` the producer routes.
fn cluster() -> (
    Vec<RetryPolicy>,
    Vec<Service>,
    Vec<EndpointSlice>,
    Vec<HTTPRoute>,
) {
    let (mut policies, mut services, mut slices) = (Vec::new(), Vec::new(), Vec::new());
    let mut routes = Vec::new();
    let mut next_ip = u32::from_be_bytes([10, 0, 0, 1]);
    for i in 0..NAMESPACES {
        let namespace = ns(i);
        for k in 0..POLICIES_PER_NAMESPACE {
            if producer(i, k) {
                routes.push(route(&namespace, k));
            } else {
                policies.push(policy(&namespace, k, 0, 1));
            }
        }
        for s in 0..SERVICES_PER_NAMESPACE {
            let name = format!("svc-{s}");
            let index = (i * SERVICES_PER_NAMESPACE + s) as u32;
            services.push(
                serde_json::from_value(serde_json::json!({
                    "metadata": { "name": name, "namespace": namespace },
                    "spec": {
                        "clusterIP": Ipv4Addr::from(u32::from_be_bytes([10, 96, 0, 0]) + index).to_string(),
                        "ports": [{ "name": "http", "port": 80, "targetPort": 8080 }],
                        "selector": { "app": name },
                    },
                }))
                .expect("service"),
            );
            let eps: Vec<serde_json::Value> = (0..endpoints_of(i, s))
                .map(|e| {
                    next_ip += 1;
                    endpoint(
                        Ipv4Addr::from(next_ip),
                        &format!("{name}-{e}"),
                        &namespace,
                        e,
                    )
                })
                .collect();
            for (c, chunk) in eps.chunks(SLICE_MAX).enumerate() {
                slices.push(slice(&namespace, &name, c, chunk.to_vec()));
            }
        }
    }
    (policies, services, slices, routes)
}

// ---------------------------------------------------------------- server

fn epoch_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// One controller replica. Commands on stdin: `connected`, `stats`,
/// `churn START_MS` (runs the churn from that wall-clock time, then prints
/// when each change was made), `exit`.
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn server(n: usize) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let (policies, services, slices, routes) = cluster();
    let restarted: Vec<EndpointSlice> = slices
        .iter()
        .filter(|s| {
            s.metadata.namespace.as_deref() == Some(RESTARTED_NS)
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/service-name"))
                    .map(String::as_str)
                    == Some(RESTARTED_SVC)
        })
        .cloned()
        .collect();
    let counts = (policies.len(), services.len(), slices.len(), routes.len());
    let (cache, mut feed) = Cache::fed(policies, services, slices);
    for r in routes {
        feed.apply_http_route(r);
    }
    let labels: HashMap<(String, String), BTreeMap<String, String>> = pods(n)
        .into_iter()
        .map(|p| ((p.namespace, p.name), p.labels))
        .collect();
    let labels = Arc::new(labels);
    let source = push::cache_source(cache.clone());
    check_affected(&*source, n);
    println!(
        "model {} policies, {} producer routes, {} services, {} slices, {} pods, fed and checked in {:.1?}",
        counts.0,
        counts.3,
        counts.1,
        counts.2,
        labels.len(),
        t0.elapsed()
    );
    let material = reprise_controller::tls::generate(&["localhost".into()])?;
    let registry = Arc::new(SidecarRegistry::default());
    let metrics = Arc::new(Metrics::default());
    let model = Arc::clone(&labels);
    let auth = move |_token: &str, namespace: &str, pod: &str| {
        let labels = model
            .get(&(namespace.to_string(), pod.to_string()))
            .cloned()
            .ok_or_else(|| AuthError::WrongPod(pod.to_string()))?;
        Ok(Identity {
            namespace: namespace.into(),
            pod: pod.into(),
            labels,
            capabilities: Default::default(),
        })
    };
    let server = PushServer::new(
        Arc::new(auth),
        source,
        Arc::clone(&registry),
        Arc::clone(&metrics),
        None,
        reprise_controller::telemetry::Tracing::off(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!(
        "addr {} {}",
        listener.local_addr()?,
        material.ca_pem.replace('\n', "|")
    );
    // Every modelled sidecar connects from loopback: no cap per source.
    let gate = reprise_controller::listen::Gate::new(
        "push",
        reprise_controller::listen::Limits {
            max_per_source: None,
            ..reprise_controller::push::PUSH_LIMITS
        },
    );
    tokio::spawn(server.serve_within(
        listener,
        reprise_controller::tls::server_config(&material)?,
        std::future::pending(),
        gate,
    ));
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(tokio::io::stdin()));
    while let Some(line) = lines.next_line().await? {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["traffic"] => {
                let now = k8s_openapi::jiff::Timestamp::now().as_second();
                let all = registry.traffic().all(now);
                println!(
                    "traffic {} {}",
                    all.values().map(|t| t.sidecars).sum::<u64>(),
                    all.values().map(|t| t.counts.requests).sum::<u64>()
                );
            }
            ["connected"] => println!(
                "connected {} {}",
                registry.connected(),
                registry.out_of_sync()
            ),
            ["stats"] => println!(
                "stats {} {} {}",
                metrics.get(Counter::Pushes),
                metrics.get(Counter::PushBytes),
                metrics.get(Counter::Acks)
            ),
            ["churn", start_ms] => {
                let times = churn(&mut feed, restarted.clone(), start_ms.parse()?).await;
                for (kind, i, t) in times {
                    println!("change {kind} {i} {t}");
                }
                println!("churned");
            }
            ["exit"] => std::process::exit(0),
            _ => println!("?"),
        }
    }
    Ok(())
}

/// Checks the definition of "affected" against full recomputation: for
/// every label set of the model, the snapshot contains the restarted
/// Service's upstream exactly when the model says the pod calls it, and
/// the edited policy exactly when the policy selects it.
fn check_affected(source: &dyn push::SnapshotSource, n: usize) {
    let mut seen = HashSet::new();
    let upstream = format!("{RESTARTED_SVC}.{RESTARTED_NS}");
    for p in pods(n) {
        if !seen.insert((p.namespace.clone(), p.labels.clone())) {
            continue;
        }
        let s = source.snapshot_for(&Identity {
            namespace: p.namespace.clone(),
            pod: p.name.clone(),
            labels: p.labels.clone(),
            capabilities: Default::default(),
        });
        let has_upstream = s.upstreams.iter().any(|u| u.name == upstream);
        let has_policy = s
            .policies
            .iter()
            .any(|q| q.namespace == EDITED_NS && q.name == EDITED_POLICY);
        assert_eq!(
            has_upstream,
            calls_restarted(&p),
            "{}/{}",
            p.namespace,
            p.name
        );
        assert_eq!(has_policy, edit_selects(&p), "{}/{}", p.namespace, p.name);
    }
}

/// The churn, from `start_ms` (Unix milliseconds) for `CHURN_SECS`: returns
/// each change's kind (`r` restart, `e` edit), number and time (Unix µs,
/// just before it was fed).
async fn churn(
    feed: &mut Feed,
    mut slices: Vec<EndpointSlice>,
    start_ms: u64,
) -> Vec<(char, u64, u64)> {
    let now_ms = epoch_us() / 1000;
    let start =
        tokio::time::Instant::now() + Duration::from_millis(start_ms.saturating_sub(now_ms));
    let restarts = CHURN_SECS * ENDPOINT_CHANGES_PER_SEC;
    let step = Duration::from_millis(1000 / ENDPOINT_CHANGES_PER_SEC);
    let mut schedule: Vec<(Duration, char, u64)> = (0..restarts)
        .map(|i| (step * i as u32, 'r', i))
        .chain((0..CHURN_SECS).map(|k| (Duration::from_millis(1000 * k + 25), 'e', k)))
        .collect();
    schedule.sort();
    let mut times = Vec::with_capacity(schedule.len());
    for (at, kind, i) in schedule {
        tokio::time::sleep_until(start + at).await;
        let t = epoch_us();
        if kind == 'r' {
            // Replace the pod in slot i % 500: its endpoint goes, a new pod's comes.
            let slot = (i as usize) % BIG_ENDPOINTS;
            let slice = &mut slices[slot / SLICE_MAX];
            if let Some(ep) = slice.endpoints.get_mut(slot % SLICE_MAX) {
                let pod = format!("{RESTARTED_SVC}-r{i}");
                *ep = serde_json::from_value(endpoint(
                    Ipv4Addr::from(NEW_POD_BASE + i as u32),
                    &pod,
                    RESTARTED_NS,
                    slot,
                ))
                .expect("endpoint");
            }
            feed.apply_slice(slice.clone());
        } else {
            feed.apply_policy(policy(EDITED_NS, 1, i as i32 + 1, i as i64 + 2));
        }
        times.push((kind, i, t));
    }
    times
}

// ---------------------------------------------------------------- clients

/// What a sidecar's running configuration holds of the churn: the last
/// restart change and the last edit (-1: none).
fn markers(config: &reprise_crds::Config) -> (i64, i64) {
    let upstream = format!("{RESTARTED_SVC}.{RESTARTED_NS}");
    let restart = config
        .upstreams
        .iter()
        .find(|u| u.name == upstream)
        .map_or(-1, |u| {
            u.endpoints
                .iter()
                .filter_map(|e| match e.addr.ip() {
                    std::net::IpAddr::V4(ip) if u32::from(ip) >= NEW_POD_BASE => {
                        Some(i64::from(u32::from(ip) - NEW_POD_BASE))
                    }
                    _ => None,
                })
                .max()
                .unwrap_or(-1)
        });
    let rule = format!("{EDITED_NS}/{EDITED_POLICY}");
    let edit = config
        .rules
        .iter()
        .find(|r| r.id == rule)
        .map_or(-1, |r| i64::from(r.priority) - 1);
    (restart, edit)
}

/// A configuration a sidecar swapped in: the sidecar, when (Unix µs), its
/// restart and edit markers.
type Swap = (u32, u64, i64, i64);

/// Second process: N sidecars running the real subscription code, sidecar
/// i subscribed to replica i mod R. Commands on stdin: `record` (from now
/// on, note every configuration a sidecar swaps in), `dump FILE`.
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn clients(dir: &str, n: usize, addrs: &str) -> anyhow::Result<()> {
    std::fs::write(format!("{dir}/token"), "t")?;
    let addrs: Vec<&str> = addrs.split(',').collect();
    let mut proxies = Vec::with_capacity(n);
    for (i, pod) in pods(n).into_iter().enumerate() {
        let r = i % addrs.len();
        let sub = reprise_sidecar::config::Subscription {
            controller: format!("https://{}", addrs[r]).parse()?,
            server_name: Some("localhost".into()),
            pod: pod.name,
            namespace: pod.namespace,
            token_path: format!("{dir}/token").into(),
            ca: reprise_sidecar::config::TrustedCa::File(format!("{dir}/ca-{r}.crt").into()),
            snapshot_path: format!("{dir}/snap/{i}.json").into(),
            address_map: None,
            report_every: Duration::from_secs(reprise_crds::traffic::REPORT_SECS),
            diagnostics_retained: None,
            deadlines: reprise_crds::policy::DeadlinePolicy::ON,
        };
        let proxy = reprise_sidecar::Proxy::new(
            Snapshot::new(vec![], vec![])
                .resolve()
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        );
        proxies.push(Arc::clone(&proxy));
        tokio::spawn(sub.run(proxy, None));
        if i % 200 == 199 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Every sidecar serves a little traffic under its policies, so that each
    // sends the controller a traffic report every REPORT_SECS, as real ones do.
    {
        let proxies = proxies.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                for p in &proxies {
                    p.count_model_traffic();
                }
            }
        });
    }
    let events: Arc<Mutex<Option<Vec<Swap>>>> = Arc::default();
    let watcher = {
        let events = Arc::clone(&events);
        async move {
            let mut last: Vec<_> = proxies.iter().map(|p| p.config()).collect();
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            loop {
                tick.tick().await;
                let now = epoch_us();
                let mut found = Vec::new();
                for (i, p) in proxies.iter().enumerate() {
                    let config = p.config();
                    if !Arc::ptr_eq(&config, &last[i]) {
                        let (r, e) = markers(&config);
                        found.push((i as u32, now, r, e));
                        last[i] = config;
                    }
                }
                if let Some(ev) = events.lock().expect("lock").as_mut() {
                    ev.extend(found);
                }
            }
        }
    };
    tokio::spawn(watcher);
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(tokio::io::stdin()));
    while let Some(line) = lines.next_line().await? {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["record"] => *events.lock().expect("lock") = Some(Vec::new()),
            ["dump", path] => {
                let ev = events.lock().expect("lock").take().unwrap_or_default();
                let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
                for (i, t, r, e) in ev {
                    writeln!(out, "{i} {t} {r} {e}")?;
                }
                out.flush()?;
                println!("dumped");
            }
            _ => println!("?"),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- driver

struct Proc {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Proc {
    fn spawn(args: &[&str]) -> anyhow::Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        let input = child.stdin.take().expect("stdin");
        Ok(Proc {
            child,
            input,
            output,
        })
    }

    fn ask(&mut self, command: &str) -> anyhow::Result<String> {
        writeln!(self.input, "{command}")?;
        self.line()
    }

    fn line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        if self.output.read_line(&mut line)? == 0 {
            anyhow::bail!("process {} ended", self.child.id());
        }
        Ok(line.trim_end().to_string())
    }

    fn cpu(&self) -> f64 {
        cpu_secs(self.child.id())
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn words(line: &str) -> Vec<u64> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|w| w.parse().ok())
        .collect()
}

fn driver(args: &[String]) -> anyhow::Result<()> {
    let mut n = 1000usize;
    let mut replicas = 1usize;
    let mut out = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--replicas" => replicas = it.next().map_or(Ok(1), |v| v.parse())?,
            // Read by every process of the run, through the environment.
            "--routes" => std::env::set_var("CLUSTER_SCALE_ROUTES", "1"),
            "--out" => out = it.next().cloned(),
            v => n = v.parse()?,
        }
    }
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("reprise-cluster-scale-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("snap"))?;
    let dirs = dir.display().to_string();
    let pods = pods(n);
    println!(
        "{n} sidecars, {replicas} replica(s); {} call {RESTARTED_NS}/{RESTARTED_SVC}, {} are selected by {EDITED_NS}/{EDITED_POLICY}",
        pods.iter().filter(|p| calls_restarted(p)).count(),
        pods.iter().filter(|p| edit_selects(p)).count()
    );

    let started = Instant::now();
    let mut servers = Vec::new();
    let mut addrs = Vec::new();
    for r in 0..replicas {
        let mut s = Proc::spawn(&["server", &n.to_string()])?;
        println!("replica {r}: {}", s.line()?);
        let line = s.line()?;
        let mut parts = line.splitn(3, ' ').skip(1);
        addrs.push(parts.next().unwrap_or("").to_string());
        std::fs::write(
            dir.join(format!("ca-{r}.crt")),
            parts.next().unwrap_or("").replace('|', "\n"),
        )?;
        servers.push(s);
    }
    let mut clients = Proc::spawn(&["clients", &dirs, &n.to_string(), &addrs.join(",")])?;

    // Every sidecar connected and in sync, within bounds.
    let connecting = Instant::now();
    let mut synced = false;
    while connecting.elapsed() < Duration::from_secs(300) {
        let mut connected = 0;
        let mut behind = 0;
        for s in &mut servers {
            let w = words(&s.ask("connected")?);
            connected += w.first().copied().unwrap_or(0);
            behind += w.get(1).copied().unwrap_or(0);
        }
        if connected as usize >= n && behind == 0 {
            synced = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    println!(
        "connected and ACKed: {synced} after {:.1?} (setup {:.1?})",
        connecting.elapsed(),
        started.elapsed()
    );
    std::thread::sleep(Duration::from_secs(2));

    let stats = |servers: &mut [Proc]| -> anyhow::Result<Vec<u64>> {
        let mut sum = vec![0u64; 3];
        for s in servers.iter_mut() {
            for (a, b) in sum.iter_mut().zip(words(&s.ask("stats")?)) {
                *a += b;
            }
        }
        Ok(sum)
    };
    let before = stats(&mut servers)?;
    writeln!(clients.input, "record")?;
    let start_ms = epoch_us() / 1000 + 1000;
    for s in &mut servers {
        writeln!(s.input, "churn {start_ms}")?;
    }
    std::thread::sleep(Duration::from_millis(
        (start_ms * 1000).saturating_sub(epoch_us()) / 1000,
    ));
    let cpu0: Vec<f64> = servers.iter().map(Proc::cpu).collect();
    let clients_cpu0 = clients.cpu();
    let load0 = loadavg();
    // change times per replica: kind -> number -> Unix µs
    let mut times: Vec<HashMap<(char, u64), u64>> = Vec::new();
    let mut cpu1 = vec![0.0; replicas];
    let mut clients_cpu1 = 0.0;
    for (r, s) in servers.iter_mut().enumerate() {
        let mut t = HashMap::new();
        loop {
            let line = s.line()?;
            if line == "churned" {
                break;
            }
            let mut p = line.split_whitespace().skip(1);
            let kind = p.next().and_then(|k| k.chars().next()).unwrap_or('?');
            let i: u64 = p.next().unwrap_or("0").parse()?;
            let at: u64 = p.next().unwrap_or("0").parse()?;
            t.insert((kind, i), at);
        }
        if r == 0 {
            // The churn ends at the same moment on every replica.
            clients_cpu1 = clients.cpu();
        }
        cpu1[r] = s.cpu();
        times.push(t);
    }
    let churn_end = Instant::now();
    let load1 = loadavg();
    // Let the pushes the churn caused finish (bounded).
    let mut calm = 0;
    while churn_end.elapsed() < Duration::from_secs(120) && calm < 3 {
        let mut behind = 0;
        for s in &mut servers {
            behind += words(&s.ask("connected")?).get(1).copied().unwrap_or(0);
        }
        calm = if behind == 0 { calm + 1 } else { 0 };
        std::thread::sleep(Duration::from_millis(500));
    }
    let drained = churn_end.elapsed();
    println!("drained in {drained:.1?} after the churn");
    let after = stats(&mut servers)?;
    // All the work the churn caused, however the cores were shared.
    let work: f64 = servers.iter().map(Proc::cpu).sum::<f64>() - cpu0.iter().sum::<f64>();
    let clients_work = clients.cpu() - clients_cpu0;
    let events_path = dir.join("events.txt");
    clients.ask(&format!("dump {}", events_path.display()))?;
    let rss: Vec<f64> = servers.iter().map(|s| hwm_mib(s.child.id())).collect();
    let clients_rss = hwm_mib(clients.child.id());

    // Per sidecar, its swaps in order.
    let mut swaps: Vec<Vec<(u64, i64, i64)>> = vec![Vec::new(); n];
    for line in std::fs::read_to_string(&events_path)?.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if let [i, t, r, e] = w.as_slice() {
            swaps[i.parse::<usize>()?].push((t.parse()?, r.parse()?, e.parse()?));
        }
    }
    let restarts = CHURN_SECS * ENDPOINT_CHANGES_PER_SEC;
    let changes = restarts + CHURN_SECS;
    // Per change, the longest time from the change (on the sidecar's
    // replica) to an affected sidecar running it; None: one never did.
    let mut last: HashMap<(char, u64), Option<u64>> = HashMap::new();
    for (kind, count) in [('r', restarts), ('e', CHURN_SECS)] {
        for i in 0..count {
            last.insert((kind, i), Some(0));
        }
    }
    let (mut affected_swaps, mut unaffected_swaps, mut unaffected_pushed) = (0u64, 0u64, 0u64);
    for (s, pod) in pods.iter().enumerate() {
        let made = &times[s % replicas];
        let kinds: Vec<(char, u64, bool)> = [
            ('r', restarts, true, calls_restarted(pod)),
            ('e', CHURN_SECS, false, edit_selects(pod)),
        ]
        .into_iter()
        .filter(|k| k.3)
        .map(|(k, c, restart, _)| (k, c, restart))
        .collect();
        if kinds.is_empty() {
            unaffected_swaps += swaps[s].len() as u64;
            unaffected_pushed += u64::from(!swaps[s].is_empty());
            continue;
        }
        affected_swaps += swaps[s].len() as u64;
        for (kind, count, restart) in kinds {
            // A configuration holding change i holds every earlier one too
            // (snapshots are whole states of the cache, sent in order).
            let mut next = 0u64;
            for &(t, r, e) in &swaps[s] {
                let marker = if restart { r } else { e };
                while (next as i64) <= marker && next < count {
                    let delay = made.get(&(kind, next)).map(|m| t.saturating_sub(*m));
                    if let (Some(Some(v)), Some(d)) = (last.get_mut(&(kind, next)), delay) {
                        *v = (*v).max(d);
                    }
                    next += 1;
                }
            }
            for i in next..count {
                last.insert((kind, i), None);
            }
        }
    }
    let mut delays: Vec<f64> = last
        .values()
        .flatten()
        .map(|d| *d as f64 / 1000.0)
        .collect();
    let missed = last.values().filter(|d| d.is_none()).count();
    delays.sort_by(f64::total_cmp);
    let secs = CHURN_SECS as f64;
    let server_cpu: Vec<f64> = cpu0.iter().zip(&cpu1).map(|(a, b)| b - a).collect();
    let total_cpu: f64 = server_cpu.iter().sum();
    let clients_cpu = clients_cpu1 - clients_cpu0;
    let pushes = after[0] - before[0];
    let bytes = after[1] - before[1];
    let per = |x: f64| x / changes as f64;
    let summary = format!(
        "| {n} | {replicas} | {:.2} ({}) | {} | {:.2} | {:.0} / {:.0} ms | {} | {:.0} | {:.0} | {:.1} MB | {} ({}) |",
        total_cpu / secs,
        server_cpu.iter().map(|c| format!("{:.2}", c / secs)).collect::<Vec<_>>().join(" + "),
        rss.iter().map(|m| format!("{m:.0} MiB")).collect::<Vec<_>>().join(" + "),
        clients_cpu / secs,
        pct(&delays, 0.5),
        pct(&delays, 0.99),
        missed,
        per(pushes as f64),
        per(affected_swaps as f64),
        per(bytes as f64) / 1e6,
        unaffected_pushed,
        unaffected_swaps,
    );
    println!("| Sidecars | Replicas | Controller cores during churn (each) | Peak RSS | Clients cores | Change → last affected sidecar p50 / p99 | Changes never reached | Pushes per change | Affected swaps per change | Bytes per change | Unaffected sidecars pushed (swaps) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    println!("{summary}");
    // The traffic reports the controller holds (5-minute window): every
    // sidecar with a policy reports every REPORT_SECS.
    let (mut reporting, mut requests) = (0u64, 0u64);
    for s in &mut servers {
        let w = words(&s.ask("traffic")?);
        reporting += w.first().copied().unwrap_or(0);
        requests += w.get(1).copied().unwrap_or(0);
    }
    let detail = format!(
        "traffic reports from {reporting} sidecar-policy pairs, {requests} requests in the window; changes {changes}; pushes {pushes}; bytes {bytes}; max delay {:.0} ms; controller CPU churn + drain {work:.1} s ({:.1} ms a change), clients {clients_work:.1} s; clients peak RSS {clients_rss:.0} MiB; drained {:.1?} after the churn; load average {load0} at the start, {load1} at the end",
        delays.last().copied().unwrap_or(f64::NAN),
        work * 1000.0 / changes as f64,
        drained
    );
    println!("{detail}");
    if let Some(path) = out {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        writeln!(f, "{summary}")?;
        writeln!(f, "<!-- {n}x{replicas}: {detail} -->")?;
        println!("appended to {path}");
    }
    for s in &mut servers {
        let _ = writeln!(s.input, "exit");
    }
    clients.stop();
    for s in servers {
        s.stop();
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The 1-minute load average.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_string()
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// Peak resident memory (VmHWM) of `pid`.
fn hwm_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// User and system CPU seconds of `pid` so far.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}
