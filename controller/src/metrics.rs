//! Controller metrics (`docs/src/reference/metrics.md`): the families, the counters behind them, and the listener
//! that serves them (`/metrics`, with `/healthz` and `/readyz`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reprise_telemetry::prometheus::{Exposition, Family, Histogram, Kind};
use reprise_telemetry::{SpanCounters, Tracing};

use crate::listen::{Closed, Gate, Limits};
use crate::sidecars::SidecarRegistry;
use crate::Error;

/// The plain counters, each one family without labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Reconciles run.
    Reconciles,
    /// Status writes.
    StatusWrites,
    /// Snapshots pushed.
    Pushes,
    /// ACKs received.
    Acks,
    /// NACKs received.
    Nacks,
    /// Pods the webhook injected.
    Injections,
    /// Pods the webhook left as they were (opted out, already injected).
    InjectionSkips,
    /// Pods the webhook refused (an invalid override annotation).
    InjectionRefusals,
    /// Pushes sent as deltas (counted in [`Counter::Pushes`] too).
    DeltaPushes,
    /// Bytes written on push streams: snapshot and delta lines and
    /// heartbeats, before TLS.
    PushBytes,
    /// Group snapshots computed again after a change.
    SnapshotComputations,
    /// Group snapshots whose version changed, published to their streams.
    SnapshotPublications,
}

/// How many [`Counter`]s there are.
const COUNTERS: usize = 12;

/// Counters with one label, whose values are fixed names (never text from
/// a request), each its own family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Labelled {
    /// Sidecars' traffic reports, by what became of them (`result`).
    TrafficReports,
    /// What was dropped from recorded reports (`what`: unknown fields,
    /// names, policies never sent to the pod).
    TrafficDropped,
    /// Push requests' authentications, by result.
    PushAuthentications,
    /// Lines sidecars sent on their streams that were read past (`reason`).
    SidecarLinesIgnored,
    /// Admission requests the webhook could not answer (`reason`).
    WebhookFailedOpen,
}

impl Labelled {
    fn family(self) -> &'static str {
        match self {
            Labelled::TrafficReports => TRAFFIC_REPORTS,
            Labelled::TrafficDropped => TRAFFIC_DROPPED,
            Labelled::PushAuthentications => PUSH_AUTHENTICATIONS,
            Labelled::SidecarLinesIgnored => SIDECAR_LINES_IGNORED,
            Labelled::WebhookFailedOpen => WEBHOOK_FAILED_OPEN,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Labelled::TrafficReports => "result",
            Labelled::TrafficDropped => "what",
            Labelled::PushAuthentications => "result",
            Labelled::SidecarLinesIgnored => "reason",
            Labelled::WebhookFailedOpen => "reason",
        }
    }
}

const TRAFFIC_REPORTS: &str = "reprise_controller_traffic_reports_total";
const TRAFFIC_DROPPED: &str = "reprise_controller_traffic_report_dropped_total";
const PUSH_AUTHENTICATIONS: &str = "reprise_controller_push_authentications_total";
const SIDECAR_LINES_IGNORED: &str = "reprise_controller_sidecar_lines_ignored_total";
const WEBHOOK_FAILED_OPEN: &str = "reprise_controller_webhook_failed_open_total";
const LISTENER_CONNECTIONS: &str = "reprise_controller_listener_connections";
const LISTENER_CLOSED: &str = "reprise_controller_listener_closed_total";

const RECONCILE_ERRORS: &str = "reprise_controller_reconcile_errors_total";
const CONNECTED_SIDECARS: &str = "reprise_controller_connected_sidecars";
const SIDECARS_OUT_OF_SYNC: &str = "reprise_controller_sidecars_out_of_sync";
const SPANS_EXPORTED: &str = "reprise_controller_trace_spans_exported_total";
const SPANS_DROPPED: &str = "reprise_controller_trace_spans_dropped_total";
const PUSH_LATENCY: &str = "reprise_controller_push_latency_seconds";
const SNAPSHOT_GROUPS: &str = "reprise_controller_snapshot_groups";

/// Every family the controller exposes, in exposition order. The first
/// [`COUNTERS`] are the plain counters, in [`Counter`] order.
const FAMILIES: &[Family] = &[
    counter(
        "reprise_controller_reconciles_total",
        "RetryPolicy reconciles.",
    ),
    counter(
        "reprise_controller_status_writes_total",
        "Status patches written.",
    ),
    counter(
        "reprise_controller_pushes_total",
        "Snapshots pushed to sidecars.",
    ),
    counter("reprise_controller_acks_total", "Snapshot ACKs received."),
    counter("reprise_controller_nacks_total", "Snapshot NACKs received."),
    counter(
        "reprise_controller_injections_total",
        "Pods the webhook injected with the sidecar.",
    ),
    counter(
        "reprise_controller_injection_skips_total",
        "Pods the webhook admitted unchanged (opted out or already injected).",
    ),
    counter(
        "reprise_controller_injection_refusals_total",
        "Pods the webhook refused for an invalid override annotation.",
    ),
    counter(
        "reprise_controller_delta_pushes_total",
        "Pushes sent as deltas (also counted in reprise_controller_pushes_total).",
    ),
    counter(
        "reprise_controller_push_bytes_total",
        "Bytes written to sidecars on push streams (snapshot and delta lines and heartbeats, before TLS).",
    ),
    counter(
        "reprise_controller_snapshot_computations_total",
        "Group snapshots computed again after a change (groups the change may affect).",
    ),
    counter(
        "reprise_controller_snapshot_publications_total",
        "Group snapshots whose version changed, published to the group's sidecars.",
    ),
    counter(
        RECONCILE_ERRORS,
        "Failed reconciles, by what failed (`error`).",
    ),
    Family {
        name: CONNECTED_SIDECARS,
        kind: Kind::Gauge,
        help: "Sidecars connected to this replica.",
    },
    Family {
        name: SIDECARS_OUT_OF_SYNC,
        kind: Kind::Gauge,
        help: "Sidecars connected to this replica that have not ACKed the snapshot last sent to them (NACKed, or the answer awaited).",
    },
    counter(
        SPANS_EXPORTED,
        "Spans the OTLP collector accepted (0 while tracing is off).",
    ),
    counter(
        SPANS_DROPPED,
        "Spans dropped: export queue full, collector unreachable or export timed out.",
    ),
    Family {
        name: PUSH_LATENCY,
        kind: Kind::Histogram,
        help: "Time from sending a snapshot to the sidecar's ACK.",
    },
    Family {
        name: SNAPSHOT_GROUPS,
        kind: Kind::Gauge,
        help: "Groups of alike sidecars (namespace, labels, capabilities) sharing one snapshot on this replica.",
    },
    counter(
        TRAFFIC_REPORTS,
        "Sidecars' traffic reports by what became of them (`result`: recorded; invalid, too_soon, after_final, not_connected: refused whole).",
    ),
    counter(
        TRAFFIC_DROPPED,
        "What recorded traffic reports carried that was dropped (`what`: field, name this controller does not know; policy never sent to the pod).",
    ),
    counter(
        PUSH_AUTHENTICATIONS,
        "Push requests' authentications by `result`: accepted; refused (no, a forged or another pod's token); rate_limited (a source address that failed too often, answered 429 before any TokenReview); busy (too many token checks in flight, or one pod's too often); unavailable (the API server did not answer).",
    ),
    counter(
        SIDECAR_LINES_IGNORED,
        "Lines sidecars sent on their streams that were read past (`reason`: unsolicited, an ACK, NACK or resync when no push awaited one).",
    ),
    counter(
        WEBHOOK_FAILED_OPEN,
        "Admission requests the webhook could not answer, by `reason` (over_capacity, timeout, too_large, unreadable): under failurePolicy Ignore each one's Pod was created without the sidecar.",
    ),
    Family {
        name: LISTENER_CONNECTIONS,
        kind: Kind::Gauge,
        help: "Connections open on each controller listener (`listener`: push, webhook, metrics).",
    },
    counter(
        LISTENER_CLOSED,
        "Connections a controller listener closed (`listener`) by `reason`: over_capacity, over_source_capacity (at accept), handshake_timeout, idle (no byte moved for the idle timeout).",
    ),
];

const fn counter(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        kind: Kind::Counter,
        help,
    }
}

/// Upper bounds of the push latency histogram, in seconds.
const PUSH_LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// What the controller counts. The connected sidecars and their sync are not
/// counted here: the [`SidecarRegistry`] holds them, each for as long as its
/// stream's registration guard lives.
#[derive(Debug)]
pub struct Metrics {
    counters: [AtomicU64; COUNTERS],
    /// Failed reconciles by [`Error::metric_label`].
    reconcile_errors: Mutex<BTreeMap<&'static str, u64>>,
    /// Time from sending a snapshot to its ACK.
    push_latency: Histogram<12>,
    /// Live snapshot groups.
    groups: AtomicU64,
    /// The [`Labelled`] counters, by label value.
    labelled: Mutex<BTreeMap<(Labelled, &'static str), u64>>,
    /// The listeners whose connections are counted.
    gates: Mutex<Vec<Arc<Gate>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            counters: [const { AtomicU64::new(0) }; COUNTERS],
            reconcile_errors: Mutex::default(),
            push_latency: Histogram::new(PUSH_LATENCY_BUCKETS),
            groups: AtomicU64::new(0),
            labelled: Mutex::default(),
            gates: Mutex::default(),
        }
    }
}

impl Metrics {
    /// Adds one to `counter`.
    pub(crate) fn add(&self, counter: Counter) {
        self.counters[counter as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n` to `counter`.
    pub(crate) fn add_n(&self, counter: Counter, n: u64) {
        self.counters[counter as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Counts the connections of the listener `gate` holds.
    pub(crate) fn listener(&self, gate: &Arc<Gate>) {
        self.gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::clone(gate));
    }

    /// Adds `n` to `counter` under the label value `value`.
    pub(crate) fn count(&self, counter: Labelled, value: &'static str, n: u64) {
        if n > 0 {
            let mut labelled = self.labelled.lock().unwrap_or_else(|e| e.into_inner());
            *labelled.entry((counter, value)).or_insert(0) += n;
        }
    }

    /// The value of `counter` under the label value `value`.
    pub fn counted(&self, counter: Labelled, value: &str) -> u64 {
        let labelled = self.labelled.lock().unwrap_or_else(|e| e.into_inner());
        labelled
            .iter()
            .find(|((c, v), _)| *c == counter && *v == value)
            .map_or(0, |(_, n)| *n)
    }

    /// Counts a batch of changes: `computed` group snapshots computed
    /// again, `published` of them changed.
    pub(crate) fn groups_refreshed(&self, computed: usize, published: usize) {
        self.add_n(Counter::SnapshotComputations, computed as u64);
        self.add_n(Counter::SnapshotPublications, published as u64);
    }

    /// Sets the number of live snapshot groups.
    pub(crate) fn set_groups(&self, n: usize) {
        self.groups.store(n as u64, Ordering::Relaxed);
    }

    /// The value of `counter`.
    pub fn get(&self, counter: Counter) -> u64 {
        self.counters[counter as usize].load(Ordering::Relaxed)
    }

    /// Counts a failed reconcile under its error's label.
    pub(crate) fn reconcile_failed(&self, error: &Error) {
        *self.lock_errors().entry(error.metric_label()).or_insert(0) += 1;
    }

    /// Failed reconciles with the label `error`.
    pub fn reconcile_errors(&self, error: &str) -> u64 {
        self.lock_errors().get(error).copied().unwrap_or(0)
    }

    /// Records the time from sending a snapshot to its ACK.
    pub(crate) fn push_acked(&self, latency: Duration) {
        self.push_latency.observe(latency);
    }

    /// Prometheus text; `sidecars` are the connected sidecars, `traces` the
    /// trace pipeline's counters (`None` while tracing is off).
    pub fn render(&self, sidecars: &SidecarRegistry, traces: Option<&SpanCounters>) -> String {
        let mut out = Exposition::new(FAMILIES);
        for (family, value) in FAMILIES.iter().zip(&self.counters) {
            out.sample(family.name, &[], value.load(Ordering::Relaxed));
        }
        for (label, n) in self.lock_errors().iter() {
            out.sample(RECONCILE_ERRORS, &[("error", label)], n);
        }
        out.sample(CONNECTED_SIDECARS, &[], sidecars.connected());
        out.sample(SIDECARS_OUT_OF_SYNC, &[], sidecars.out_of_sync());
        out.sample(
            SPANS_EXPORTED,
            &[],
            traces.map_or(0, SpanCounters::exported),
        );
        out.sample(SPANS_DROPPED, &[], traces.map_or(0, SpanCounters::dropped));
        self.push_latency.render(&mut out, PUSH_LATENCY, &[]);
        out.sample(SNAPSHOT_GROUPS, &[], self.groups.load(Ordering::Relaxed));
        for ((counter, value), n) in self
            .labelled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            out.sample(counter.family(), &[(counter.label(), value)], n);
        }
        for gate in self.gates.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            out.sample(
                LISTENER_CONNECTIONS,
                &[("listener", gate.name)],
                gate.open(),
            );
            for why in Closed::ALL {
                let n = gate.closed(why);
                out.sample(
                    LISTENER_CLOSED,
                    &[("listener", gate.name), ("reason", why.name())],
                    n,
                );
                // A connection the webhook refused is an admission that failed open.
                if gate.name == "webhook" && why == Closed::OverCapacity && n > 0 {
                    out.sample(WEBHOOK_FAILED_OPEN, &[("reason", "over_capacity")], n);
                }
            }
        }
        out.finish()
    }

    fn lock_errors(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, u64>> {
        self.reconcile_errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// `/debug/sidecars[/NAMESPACE/POD]`: status, body, content type.
fn debug_page(registry: &SidecarRegistry, path: &str, local: bool) -> (u16, String, &'static str) {
    if !local {
        return (
            403,
            "debug pages answer only on loopback: use kubectl reprise sent, or kubectl port-forward\n".into(),
            "text/plain",
        );
    }
    let json = |v: serde_json::Value| {
        let mut text = serde_json::to_string_pretty(&v).unwrap_or_default();
        text.push('\n');
        (200, text, "application/json")
    };
    let Some(rest) = path.strip_prefix("/debug/sidecars") else {
        return (404, String::new(), "text/plain");
    };
    match rest.trim_matches('/').split('/').collect::<Vec<_>>()[..] {
        [""] => json(registry.sent_list()),
        [namespace, pod] => match registry.sent_page(namespace, pod) {
            Some(page) => json(page),
            None => (
                404,
                format!("{namespace}/{pod} has no snapshot stream to this replica\n"),
                "text/plain",
            ),
        },
        _ => (404, String::new(), "text/plain"),
    }
}

/// Serves `/metrics` (the controller's families, the connected sidecars of
/// `registry`, the span counters of `traces`) and `/healthz`, `/readyz` on
/// `addr`, until the process ends. A listener that cannot bind is logged: the
/// controller runs on without metrics.
///
/// `/debug/sidecars` (the sidecars connected here) and
/// `/debug/sidecars/NAMESPACE/POD` (what was last sent to one, and its
/// answer) answer only connections from loopback: Prometheus scrapes the
/// pod IP, while `kubectl reprise sent` comes through the API server's
/// port-forward, which dials the pod's loopback. A snapshot names every
/// endpoint and policy of a namespace: no one else in the cluster reads it.
pub(crate) async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    registry: Arc<SidecarRegistry>,
    traces: Tracing,
    gate: Arc<Gate>,
) {
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%addr, error = %e, "cannot listen for metrics");
            return;
        }
    };
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        // Over a cap: closed here, counted by the gate.
        let Some(slot) = gate.admit(peer) else {
            continue;
        };
        let local = peer.ip().to_canonical().is_loopback();
        let stream = gate.watch(stream, slot);
        let (metrics, registry, traces) =
            (Arc::clone(&metrics), Arc::clone(&registry), traces.clone());
        let limits = gate.limits;
        tokio::spawn(async move {
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                // Prometheus 3 refuses a scrape without a Content-Type.
                let (status, body, content_type) = match req.uri().path() {
                    "/metrics" => (
                        200,
                        metrics.render(&registry, traces.counters()),
                        "text/plain; version=0.0.4; charset=utf-8",
                    ),
                    "/healthz" | "/readyz" => (200, "ok\n".to_string(), "text/plain"),
                    path if path.starts_with("/debug/") => debug_page(&registry, path, local),
                    _ => (404, String::new(), "text/plain"),
                };
                let mut resp = http::Response::new(Full::new(bytes::Bytes::from(body)));
                *resp.status_mut() = http::StatusCode::from_u16(status).unwrap_or_default();
                resp.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static(content_type),
                );
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            // Nothing here reads a body: a request is its head, answered
            // at once; a client not reading its answer is cut as idle.
            crate::listen::serve_http(TokioIo::new(stream), false, &limits, 1, service).await;
        });
    }
}

/// The metrics listener's limits by default: Prometheus, the kubelet's
/// probes and an administrator's port-forward need a handful.
pub const METRICS_LIMITS: Limits = Limits {
    max_connections: 64,
    max_per_source: None,
    header_timeout: Duration::from_secs(10),
    idle_timeout: Duration::from_secs(60),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_debug_pages_show_what_was_last_sent_and_only_on_loopback() {
        use std::collections::{BTreeMap, BTreeSet, HashMap};
        let registry = SidecarRegistry::default();
        let caps: BTreeSet<String> = ["delta".to_string()].into();
        registry.connect("shop", "web-0", BTreeMap::new(), caps, 1);
        let delta = bytes::Bytes::from_static(
            b"{\"delta\":{\"base\":\"a1\",\"version\":\"a2\",\"endpoints\":[]}}\n",
        );
        let bytes = delta.len() - 1;
        registry.pushed(
            "shop",
            "web-0",
            "a2",
            HashMap::from([("shop/reads".to_string(), 3)]),
            Some(delta),
        );
        let (status, body, _) = debug_page(&registry, "/debug/sidecars/shop/web-0", true);
        assert_eq!(status, 200, "{body}");
        let page: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(page["sent"]["kind"], "delta");
        assert_eq!(
            page["sent"]["bytes"], bytes,
            "the line, without its newline"
        );
        assert_eq!(page["sent"]["line"]["delta"]["version"], "a2");
        assert_eq!(page["sent"]["policies"][0]["policy"], "shop/reads");
        assert_eq!(page["inSync"], false, "not answered yet");
        registry.ack("shop", "web-0", "a2");
        let (_, body, _) = debug_page(&registry, "/debug/sidecars/shop/web-0", true);
        assert!(body.contains("\"inSync\": true"), "{body}");
        let (status, body, _) = debug_page(&registry, "/debug/sidecars", true);
        assert_eq!(status, 200);
        assert!(body.contains("\"pod\": \"web-0\""), "{body}");
        let (status, body, _) = debug_page(&registry, "/debug/sidecars/shop/web-1", true);
        assert_eq!(
            (status, body.as_str()),
            (404, "shop/web-1 has no snapshot stream to this replica\n")
        );
        assert_eq!(debug_page(&registry, "/debug/other/x", true).0, 404);
        let (status, body, _) = debug_page(&registry, "/debug/sidecars/shop/web-0", false);
        assert_eq!(status, 403);
        assert!(
            body.starts_with("debug pages answer only on loopback"),
            "{body}"
        );
    }

    /// Every family is in the user guide's metrics reference; the other
    /// direction (every metric the guide names exists) is e2e/tests/docs.rs's.
    #[test]
    fn every_family_is_documented_in_the_metrics_reference() {
        let page = include_str!("../../docs/src/reference/metrics.md");
        let missing: Vec<&str> = FAMILIES
            .iter()
            .map(|f| f.name)
            .filter(|name| !page.contains(&format!("`{name}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "not in docs/src/reference/metrics.md: {missing:?}"
        );
    }

    #[test]
    fn each_counter_is_its_own_family_and_errors_carry_their_label() {
        let m = Metrics::default();
        let names = [
            (Counter::Reconciles, "reprise_controller_reconciles_total"),
            (
                Counter::StatusWrites,
                "reprise_controller_status_writes_total",
            ),
            (Counter::Pushes, "reprise_controller_pushes_total"),
            (Counter::Acks, "reprise_controller_acks_total"),
            (Counter::Nacks, "reprise_controller_nacks_total"),
            (Counter::Injections, "reprise_controller_injections_total"),
            (
                Counter::InjectionSkips,
                "reprise_controller_injection_skips_total",
            ),
            (
                Counter::InjectionRefusals,
                "reprise_controller_injection_refusals_total",
            ),
            (
                Counter::DeltaPushes,
                "reprise_controller_delta_pushes_total",
            ),
            (Counter::PushBytes, "reprise_controller_push_bytes_total"),
            (
                Counter::SnapshotComputations,
                "reprise_controller_snapshot_computations_total",
            ),
            (
                Counter::SnapshotPublications,
                "reprise_controller_snapshot_publications_total",
            ),
        ];
        assert_eq!(names.len(), COUNTERS);
        for (i, (counter, _)) in names.iter().enumerate() {
            for _ in 0..=i {
                m.add(*counter);
            }
        }
        m.reconcile_failed(&Error::MissingNamespace);
        m.reconcile_failed(&Error::MissingNamespace);
        let sidecars = SidecarRegistry::default();
        for (i, pod) in ["a", "b", "c"].into_iter().enumerate() {
            sidecars.connect("shop", pod, Default::default(), Default::default(), 1);
            if i > 0 {
                sidecars.sent("shop", pod, "v1", Default::default());
            }
        }
        sidecars.ack("shop", "b", "v1");
        let text = m.render(&sidecars, None);
        for (i, (counter, name)) in names.iter().enumerate() {
            assert_eq!(m.get(*counter), i as u64 + 1);
            assert!(
                text.contains(&format!("\n{name} {}\n", i + 1)),
                "{name}: {text}"
            );
            assert!(text.contains(&format!("# TYPE {name} counter\n")), "{text}");
        }
        assert!(
            text.contains(
                "reprise_controller_reconcile_errors_total{error=\"missing_namespace\"} 2\n"
            ),
            "{text}"
        );
        assert_eq!(m.reconcile_errors("missing_namespace"), 2);
        assert!(
            text.contains("\nreprise_controller_connected_sidecars 3\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE reprise_controller_sidecars_out_of_sync gauge\nreprise_controller_sidecars_out_of_sync 1\n"),
            "c was sent v1 and has not ACKed it: {text}"
        );
        assert!(
            text.contains("reprise_controller_trace_spans_dropped_total 0\n"),
            "{text}"
        );
        assert!(
            text.contains("reprise_controller_push_latency_seconds_count 0\n"),
            "{text}"
        );
    }
}
