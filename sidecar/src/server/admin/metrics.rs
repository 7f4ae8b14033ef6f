//! The `/metrics` page: the Prometheus text of every upstream's counters,
//! the proxy's own and the trace pipeline's, in the order of the family
//! catalogue (`observe::metrics`), which the guide's metrics reference is
//! checked against.

use std::sync::atomic::{AtomicU64, Ordering};

use reprise_telemetry::prometheus::Exposition;

use crate::observe::metrics::{Listener, UpstreamStats, FAMILIES};
use crate::proxy::route::Routes;
use crate::proxy::Proxy;
use crate::retry::upstream::UpstreamState;

/// The `/metrics` text of `proxy`.
pub fn metrics_text(proxy: &Proxy) -> String {
    let routes = proxy.routes();
    let mut out = Exposition::new(FAMILIES);
    // By configured name only: aliases point at the same state.
    let mut names: Vec<&String> = routes.config.upstreams.iter().map(|u| &u.name).collect();
    names.sort();
    for name in names {
        if let Some(up) = routes.upstreams.get(name) {
            upstream_samples(&mut out, name, up);
        }
    }
    rule_samples(&mut out, &routes);
    proxy_samples(
        &mut out,
        proxy,
        routes.config.proxy.replay_reservation_bytes,
    );
    captured_samples(&mut out, proxy);
    connection_samples(&mut out, proxy);
    trace_samples(&mut out, proxy);
    out.finish()
}

/// One upstream's outcomes, retries, budget, gRPC statuses, attempt latency
/// and endpoints.
fn upstream_samples(out: &mut Exposition, name: &str, up: &UpstreamState) {
    let stats: UpstreamStats = up.stats();
    let upstream = [("upstream", name)];
    // `ok` and `recovered` first, then the rest in order, as before.
    let ordered = [("ok", ""), ("recovered", "")].into_iter().chain(
        stats
            .outcomes
            .keys()
            .copied()
            .filter(|(o, _)| !matches!(*o, "ok" | "recovered")),
    );
    for key in ordered {
        let all = stats.outcomes.get(&key).copied().unwrap_or(0);
        let failed = stats.failed.get(&key).copied().unwrap_or(0);
        // The successful series always, as `ok` and `recovered` always were;
        // the failed one once it has counted something.
        if all - failed > 0 || matches!(key.0, "ok" | "recovered") {
            outcome_sample(out, name, key, "true", all - failed);
        }
        if failed > 0 {
            outcome_sample(out, name, key, "false", failed);
        }
    }
    for (kind, n) in &stats.retries {
        out.sample(
            "reprise_retries_total",
            &[("upstream", name), ("kind", kind)],
            n,
        );
    }
    out.sample(
        "reprise_retry_budget_refusals_total",
        &upstream,
        stats.budget_refusals,
    );
    out.sample("reprise_hedges_total", &upstream, stats.hedges);
    out.sample(
        "reprise_response_body_errors_total",
        &upstream,
        stats.response_body_errors,
    );
    for (reason, n) in &stats.certificate_failures {
        out.sample(
            "reprise_tls_certificate_failures_total",
            &[("upstream", name), ("reason", reason)],
            n,
        );
    }
    let labelled = [
        (
            "reprise_deadlines_received_total",
            "result",
            &stats.deadlines_received,
        ),
        (
            "reprise_deadline_stops_total",
            "stop",
            &stats.deadline_stops,
        ),
        (
            "reprise_deadlines_not_propagated_total",
            "reason",
            &stats.deadlines_not_propagated,
        ),
    ];
    for (family, label, counts) in labelled {
        for (value, n) in counts {
            out.sample(family, &[("upstream", name), (label, value)], n);
        }
    }
    for (code, n) in &stats.grpc_statuses {
        let status = reprise_crds::grpc::name_of(*code);
        out.sample(
            "reprise_grpc_responses_total",
            &[("upstream", name), ("grpc_status", &status)],
            n,
        );
    }
    up.metrics
        .render_latency(out, "reprise_upstream_attempt_duration_seconds", &upstream);
    out.sample(
        "reprise_retry_budget_remaining",
        &upstream,
        stats.budget_remaining,
    );
    for e in &stats.endpoints {
        let addr = e.addr.to_string();
        let labels = [
            ("upstream", name),
            ("endpoint", addr.as_str()),
            ("pod", e.name.as_deref().unwrap_or("")),
        ];
        out.sample("reprise_endpoint_in_flight", &labels, e.in_flight);
        out.sample("reprise_endpoint_ejected", &labels, u8::from(e.ejected));
        out.sample("reprise_endpoint_ejections_total", &labels, e.ejections);
        if let Some(expiry) = e.certificate_expiry {
            out.sample(
                "reprise_tls_peer_certificate_expiry_seconds",
                &labels,
                expiry,
            );
        }
    }
}

/// The proxy's own counters: requests in flight, replay memory, reloads,
/// unknown hosts, CEL errors.
fn proxy_samples(out: &mut Exposition, proxy: &Proxy, replay_limit: u64) {
    let m = &proxy.metrics;
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    out.sample("reprise_requests_in_flight", &[], m.in_flight.get());
    out.sample(
        "reprise_replay_buffer_bytes",
        &[],
        proxy.reservation().in_use(),
    );
    out.sample("reprise_replay_buffer_limit_bytes", &[], replay_limit);
    out.sample(
        "reprise_config_reloads_total",
        &[("result", "ok")],
        load(&m.reloads_ok),
    );
    out.sample(
        "reprise_config_reloads_total",
        &[("result", "refused")],
        load(&m.reloads_refused),
    );
    out.sample(
        "reprise_tls_file_reloads_total",
        &[("result", "ok")],
        load(&m.tls_reloads_ok),
    );
    out.sample(
        "reprise_tls_file_reloads_total",
        &[("result", "refused")],
        load(&m.tls_reloads_refused),
    );
    out.sample(
        "reprise_unknown_upstream_total",
        &[],
        load(&m.unknown_upstream),
    );
    out.sample(
        "reprise_h2c_reset_flood_closes_total",
        &[],
        load(&m.h2c_reset_floods),
    );
    for (rule, n) in &m.cel_errors() {
        out.sample("reprise_rule_cel_errors_total", &[("rule", rule)], n);
    }
    for (host, name) in proxy.dns.names() {
        for (result, n) in [("resolved", name.resolved), ("failed", name.failed)] {
            out.sample(
                "reprise_dns_lookups_total",
                &[("host", &host), ("result", result)],
                n,
            );
        }
        out.sample(
            "reprise_dns_addresses",
            &[("host", &host)],
            name.addresses.len(),
        );
    }
}

/// Transparent mode: captured connections by protocol, refusals, and the
/// opaque relays' failures, open count and bytes.
fn captured_samples(out: &mut Exposition, proxy: &Proxy) {
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let c = &proxy.metrics.captured;
    for (protocol, n) in [("http1", &c.http1), ("h2c", &c.h2c), ("opaque", &c.opaque)] {
        out.sample(
            "reprise_captured_connections_total",
            &[("protocol", protocol)],
            load(n),
        );
    }
    for (reason, n) in [
        ("loop", &c.refused_loop),
        ("no_original_destination", &c.refused_no_destination),
    ] {
        out.sample(
            "reprise_captured_refused_total",
            &[("reason", reason)],
            load(n),
        );
    }
    out.sample(
        "reprise_opaque_connect_failures_total",
        &[],
        load(&c.opaque_connect_failures),
    );
    out.sample("reprise_opaque_connections_open", &[], c.opaque_open.get());
    for (direction, n) in [
        ("sent", &c.opaque_bytes_sent),
        ("received", &c.opaque_bytes_received),
    ] {
        out.sample(
            "reprise_opaque_bytes_total",
            &[("direction", direction)],
            load(n),
        );
    }
}

/// Each listener's open connections and those refused over its cap.
fn connection_samples(out: &mut Exposition, proxy: &Proxy) {
    for listener in Listener::ALL {
        let c = proxy.metrics.connections(listener);
        let labels = [("listener", listener.label())];
        out.sample("reprise_connections_open", &labels, c.open_now());
        out.sample("reprise_connections_refused_total", &labels, c.refused());
    }
}

/// The trace pipeline's exported and dropped spans.
fn trace_samples(out: &mut Exposition, proxy: &Proxy) {
    let spans = proxy.tracing().counters();
    out.sample(
        "reprise_trace_spans_exported_total",
        &[],
        spans.map_or(0, |c| c.exported()),
    );
    out.sample(
        "reprise_trace_spans_dropped_total",
        &[],
        spans.map_or(0, |c| c.dropped()),
    );
}

fn outcome_sample(out: &mut Exposition, upstream: &str, key: (&str, &str), success: &str, n: u64) {
    out.sample(
        "reprise_requests_total",
        &[
            ("upstream", upstream),
            ("outcome", key.0),
            ("reason", key.1),
            ("success", success),
        ],
        n,
    );
}

/// Each retry rule's requests, by outcome, reason and success.
fn rule_samples(out: &mut Exposition, routes: &Routes) {
    for (rule, traffic) in routes.config.rules.iter().zip(&routes.traffic) {
        for ((outcome, reason, success), n) in traffic.outcomes() {
            out.sample(
                "reprise_rule_requests_total",
                &[
                    ("rule", rule.id.as_str()),
                    ("outcome", outcome),
                    ("reason", reason),
                    ("success", if success { "true" } else { "false" }),
                ],
                n,
            );
        }
    }
}
