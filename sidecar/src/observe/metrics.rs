//! Counters behind `/metrics`, the catalogue of its metric families, and the
//! read-only [`UpstreamStats`] snapshot that both the Prometheus text (drawn
//! by the admin server) and callers (tests, tools) read, so there is one way
//! to look at what the proxy has done.
//!
//! Hot-path counters are relaxed atomics; the per-reason maps are touched only
//! when an attempt fails or a request is not plainly `ok`/`recovered`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use reprise_telemetry::prometheus::{Exposition, Gauge, Histogram};

use crate::exchange::deadline::{Ignored, NotWritten, Stop};
use crate::exchange::failure::CertificateError;
use crate::exchange::outcome::Outcome;

mod families;
pub(crate) use self::families::FAMILIES;

/// Upper bounds of the attempt latency histogram, in seconds.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Metrics of one upstream; kept across reloads while the upstream exists.
#[derive(Debug)]
pub(crate) struct UpstreamMetrics {
    /// `ok` and `recovered` requests that succeeded (the rest are in the maps).
    ok: AtomicU64,
    recovered: AtomicU64,
    outcomes: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// Of `outcomes`, those whose final answer was not a success.
    failed: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    retries: Mutex<BTreeMap<String, u64>>,
    budget_refusals: AtomicU64,
    hedges: AtomicU64,
    response_body_errors: AtomicU64,
    grpc_statuses: Mutex<BTreeMap<u8, u64>>,
    /// Attempts whose endpoint's certificate failed validation, by reason
    /// (in `CertificateError::ALL`'s order).
    certificate_failures: [AtomicU64; CertificateError::ALL.len()],
    attempt_latency: Histogram<14>,
    /// Deadlines across hops: received, what they stopped, and attempts
    /// that could not carry one.
    deadlines: DeadlineCounts,
}

/// The counters of deadlines across hops, each array in its type's `ALL`
/// order.
#[derive(Debug, Default)]
struct DeadlineCounts {
    /// Requests whose accepted deadline came with them.
    accepted: AtomicU64,
    /// Requests whose deadline entries were all ignored, by reason.
    ignored: [AtomicU64; Ignored::ALL.len()],
    /// Attempts not made or cut by a propagated deadline.
    stops: [AtomicU64; Stop::ALL.len()],
    /// Attempts whose baggage could not carry the deadline, by reason.
    not_written: [AtomicU64; NotWritten::ALL.len()],
}

/// Process-wide metrics.
#[derive(Debug, Default)]
pub(crate) struct ProxyMetrics {
    /// Logical requests being handled now, each counted once however many
    /// attempts it makes; a guard per request, so a cancelled one leaves nothing.
    pub(crate) in_flight: Gauge,
    /// Successful configuration loads.
    pub(crate) reloads_ok: AtomicU64,
    /// Refused configuration loads.
    pub(crate) reloads_refused: AtomicU64,
    /// Changes of the TLS files the configuration names, applied and refused.
    pub(crate) tls_reloads_ok: AtomicU64,
    pub(crate) tls_reloads_refused: AtomicU64,
    /// Requests for a host that names no upstream.
    pub(crate) unknown_upstream: AtomicU64,
    /// h2c connections closed because their client reset most of its
    /// streams before they were answered (rapid reset).
    pub(crate) h2c_reset_floods: AtomicU64,
    /// CEL conditions that failed to evaluate (each counted as no match), by rule.
    cel_errors: Mutex<BTreeMap<String, u64>>,
    /// Transparently captured connections.
    pub(crate) captured: CapturedMetrics,
    /// Each listener's open and refused connections.
    connections: [ConnectionCount; Listener::ALL.len()],
}

/// The sidecar's listeners, as the connection metrics name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Listener {
    /// The explicit proxy listener.
    Proxy,
    /// The transparent listeners (IPv4 and IPv6 together).
    Transparent,
    /// The admin listener.
    Admin,
    /// The health listener.
    Health,
}

impl Listener {
    /// Every listener, in exposition order.
    pub(crate) const ALL: [Listener; 4] = [
        Listener::Proxy,
        Listener::Transparent,
        Listener::Admin,
        Listener::Health,
    ];

    /// The `listener` label's value.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Listener::Proxy => "proxy",
            Listener::Transparent => "transparent",
            Listener::Admin => "admin",
            Listener::Health => "health",
        }
    }
}

/// One listener's connections: open now, and refused over its cap.
#[derive(Debug, Default)]
pub(crate) struct ConnectionCount {
    open: AtomicU64,
    refused: AtomicU64,
}

impl ConnectionCount {
    /// Counts one more open connection unless `cap` are open already, in
    /// which case it counts a refusal and returns false. A true must be
    /// matched by one [`ConnectionCount::close`].
    pub(crate) fn open(&self, cap: u64) -> bool {
        // fetch_update, not add-then-undo: the gauge never reads above the cap.
        let opened = self
            .open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < cap).then_some(n + 1)
            })
            .is_ok();
        if !opened {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        opened
    }

    /// One connection counted by [`ConnectionCount::open`] has closed.
    pub(crate) fn close(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Open now.
    pub(crate) fn open_now(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// Refused so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// Transparently captured connections: how each was served, and the opaque
/// ones' bytes.
#[derive(Debug, Default)]
pub(crate) struct CapturedMetrics {
    /// Served as HTTP/1.x through the retry path.
    pub(crate) http1: AtomicU64,
    /// Served as h2c through the retry path.
    pub(crate) h2c: AtomicU64,
    /// Relayed as opaque TCP.
    pub(crate) opaque: AtomicU64,
    /// Refused: the original destination is one of the sidecar's own listeners.
    pub(crate) refused_loop: AtomicU64,
    /// Refused: no original destination (the connection was not redirected).
    pub(crate) refused_no_destination: AtomicU64,
    /// Opaque relays whose destination could not be reached.
    pub(crate) opaque_connect_failures: AtomicU64,
    /// Opaque relays open now.
    pub(crate) opaque_open: Gauge,
    /// Bytes the opaque relays carried from clients to destinations.
    pub(crate) opaque_bytes_sent: AtomicU64,
    /// Bytes the opaque relays carried from destinations back to clients.
    pub(crate) opaque_bytes_received: AtomicU64,
}

impl ProxyMetrics {
    /// The connections of `listener`.
    pub(crate) fn connections(&self, listener: Listener) -> &ConnectionCount {
        let i = match listener {
            Listener::Proxy => 0,
            Listener::Transparent => 1,
            Listener::Admin => 2,
            Listener::Health => 3,
        };
        &self.connections[i]
    }

    /// CEL evaluation failures so far, by rule.
    pub(crate) fn cel_errors(&self) -> BTreeMap<String, u64> {
        self.cel_errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Counts a CEL condition of rule `rule` that failed to evaluate.
    pub(crate) fn record_cel_error(&self, rule: &str) {
        let mut map = self.cel_errors.lock().unwrap_or_else(|e| e.into_inner());
        match map.get_mut(rule) {
            Some(n) => *n += 1,
            None => {
                map.insert(rule.to_string(), 1);
            }
        }
    }
}

/// What one upstream has done so far, read at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct UpstreamStats {
    /// Finished requests by outcome and reason (`ok` and `recovered` have no reason).
    pub outcomes: BTreeMap<(&'static str, &'static str), u64>,
    /// Of them, those whose final answer was not a success (a status of
    /// 500 or more, 429, a gRPC status other than `OK`, a local failure).
    pub failed: BTreeMap<(&'static str, &'static str), u64>,
    /// Retries issued, by the failure kind that caused them.
    pub retries: BTreeMap<String, u64>,
    /// Requests the retry budget counts in its window.
    pub budget_requests: u64,
    /// Retries the retry budget counts in its window.
    pub budget_retries: u64,
    /// Retries the budget still allows in its window.
    pub budget_remaining: u64,
    /// Retries and hedges the budget refused.
    pub budget_refusals: u64,
    /// Speculative duplicates sent.
    pub hedges: u64,
    /// Response bodies that failed after their headers went to the client.
    pub response_body_errors: u64,
    /// gRPC responses passed to clients, by `grpc-status` code.
    pub grpc_statuses: BTreeMap<u8, u64>,
    /// Attempts whose endpoint's certificate failed validation, by reason
    /// (`unknown_issuer`, `expired`, ...); reasons never seen are absent.
    pub certificate_failures: BTreeMap<&'static str, u64>,
    /// Requests that came with a deadline, by result (`accepted`,
    /// `malformed`, `stale`, `far_future`); results never seen are absent.
    pub deadlines_received: BTreeMap<&'static str, u64>,
    /// Attempts a propagated deadline stopped (`before_first_attempt`,
    /// `retry`, `hedge`, `attempt_cut`); stops never seen are absent.
    pub deadline_stops: BTreeMap<&'static str, u64>,
    /// Attempts whose baggage could not carry the deadline
    /// (`baggage_full`, `baggage_malformed`); reasons never seen are absent.
    pub deadlines_not_propagated: BTreeMap<&'static str, u64>,
    /// Each endpoint, in configuration order.
    pub endpoints: Vec<EndpointStats>,
}

/// One endpoint's state, read at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointStats {
    /// Its address.
    pub addr: SocketAddr,
    /// Its name (the pod, in Kubernetes).
    pub name: Option<String>,
    /// Attempts waiting on it now.
    pub in_flight: u32,
    /// True while passive health has it ejected.
    pub ejected: bool,
    /// Times passive health ejected it.
    pub ejections: u64,
    /// The share of recent attempts that failed, decayed (0 when none did).
    pub failure_estimate: f64,
    /// When the certificate it presented last expires (seconds since the
    /// epoch), over TLS.
    pub certificate_expiry: Option<i64>,
}

impl Default for UpstreamMetrics {
    fn default() -> Self {
        Self {
            ok: AtomicU64::new(0),
            recovered: AtomicU64::new(0),
            outcomes: Mutex::default(),
            failed: Mutex::default(),
            retries: Mutex::default(),
            budget_refusals: AtomicU64::new(0),
            hedges: AtomicU64::new(0),
            response_body_errors: AtomicU64::new(0),
            grpc_statuses: Mutex::default(),
            certificate_failures: Default::default(),
            attempt_latency: Histogram::new(LATENCY_BUCKETS),
            deadlines: DeadlineCounts::default(),
        }
    }
}

impl UpstreamMetrics {
    /// Counts a finished logical request, whose final answer was a
    /// `success` or not.
    pub(crate) fn record_outcome(&self, outcome: Outcome, success: bool) {
        match (outcome, success) {
            (Outcome::Ok, true) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
            }
            (Outcome::Recovered, true) => {
                self.recovered.fetch_add(1, Ordering::Relaxed);
            }
            (other, success) => {
                let key = (other.name(), other.reason());
                let mut map = self.outcomes.lock().unwrap_or_else(|e| e.into_inner());
                *map.entry(key).or_default() += 1;
                drop(map);
                if !success {
                    let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
                    *failed.entry(key).or_default() += 1;
                }
            }
        }
    }

    /// Counts a retry issued after a failure of `kind`.
    pub(crate) fn record_retry(&self, kind: &str) {
        let mut map = self.retries.lock().unwrap_or_else(|e| e.into_inner());
        match map.get_mut(kind) {
            Some(n) => *n += 1,
            None => {
                map.insert(kind.to_string(), 1);
            }
        }
    }

    /// Counts a retry or hedge the budget refused.
    pub(crate) fn record_budget_refusal(&self) {
        self.budget_refusals.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a hedge sent.
    pub(crate) fn record_hedge(&self) {
        self.hedges.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an attempt whose endpoint's certificate failed `reason`.
    pub(crate) fn record_certificate_failure(&self, reason: CertificateError) {
        self.certificate_failures[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a response body that failed mid-stream.
    pub(crate) fn record_response_body_error(&self) {
        self.response_body_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a gRPC response that reached the client with `code` (in its
    /// headers or its trailers).
    pub(crate) fn record_grpc_status(&self, code: u8) {
        let mut map = self.grpc_statuses.lock().unwrap_or_else(|e| e.into_inner());
        *map.entry(code).or_default() += 1;
    }

    /// Counts a request that came with a deadline: accepted, or `ignored`
    /// and why.
    pub(crate) fn record_deadline_received(&self, ignored: Option<Ignored>) {
        match ignored {
            None => &self.deadlines.accepted,
            Some(why) => &self.deadlines.ignored[why.index()],
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an attempt a propagated deadline stopped.
    pub(crate) fn record_deadline_stop(&self, stop: Stop) {
        self.deadlines.stops[stop.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an attempt whose baggage could not carry the deadline.
    pub(crate) fn record_deadline_not_written(&self, why: NotWritten) {
        self.deadlines.not_written[why.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Records one attempt's time to response headers (or failure).
    pub(crate) fn record_attempt(&self, elapsed: Duration) {
        self.attempt_latency.observe(elapsed);
    }

    /// Writes the attempt latency histogram as `name` with `labels`.
    pub(crate) fn render_latency(&self, out: &mut Exposition, name: &str, labels: &[(&str, &str)]) {
        self.attempt_latency.render(out, name, labels);
    }
}

impl UpstreamStats {
    /// The counters of `m`, with `endpoints`' state; the budget's figures
    /// are the caller's to fill in (the budget is composed a floor above).
    pub(crate) fn counted(m: &UpstreamMetrics, endpoints: Vec<EndpointStats>) -> Self {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut outcomes = m.outcomes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        *outcomes.entry(("ok", "")).or_default() += load(&m.ok);
        *outcomes.entry(("recovered", "")).or_default() += load(&m.recovered);
        Self {
            outcomes,
            failed: m.failed.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            retries: m.retries.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            budget_requests: 0,
            budget_retries: 0,
            budget_remaining: 0,
            budget_refusals: load(&m.budget_refusals),
            hedges: load(&m.hedges),
            response_body_errors: load(&m.response_body_errors),
            grpc_statuses: m
                .grpc_statuses
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            certificate_failures: CertificateError::ALL
                .iter()
                .map(|r| (r.name(), load(&m.certificate_failures[r.index()])))
                .filter(|(_, n)| *n > 0)
                .collect(),
            deadlines_received: std::iter::once(("accepted", load(&m.deadlines.accepted)))
                .chain(
                    Ignored::ALL
                        .iter()
                        .map(|r| (r.name(), load(&m.deadlines.ignored[r.index()]))),
                )
                .filter(|(_, n)| *n > 0)
                .collect(),
            deadline_stops: Stop::ALL
                .iter()
                .map(|s| (s.name(), load(&m.deadlines.stops[s.index()])))
                .filter(|(_, n)| *n > 0)
                .collect(),
            deadlines_not_propagated: NotWritten::ALL
                .iter()
                .map(|r| (r.name(), load(&m.deadlines.not_written[r.index()])))
                .filter(|(_, n)| *n > 0)
                .collect(),
            endpoints,
        }
    }

    /// Requests finished so far with outcome `name` (e.g. `recovered`), any reason.
    pub fn outcome(&self, name: &str) -> u64 {
        self.outcomes
            .iter()
            .filter(|((n, _), _)| *n == name)
            .map(|(_, v)| v)
            .sum()
    }
}
