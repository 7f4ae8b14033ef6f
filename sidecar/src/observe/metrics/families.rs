//! The name, kind and HELP text of every metric family the sidecar
//! exposes, in exposition order: the one list `/metrics` renders from and
//! the user guide's metrics reference (`docs/src/reference/metrics.md`) is
//! checked against.

use reprise_telemetry::prometheus::{Family, Kind};

const fn family(name: &'static str, kind: Kind, help: &'static str) -> Family {
    Family { name, kind, help }
}

/// Every family, in exposition order, with its HELP text: names stay stable here.
pub(crate) const FAMILIES: &[Family] = &[
    family(
        "reprise_requests_total",
        Kind::Counter,
        "Logical requests by upstream, outcome (ok, recovered, exhausted, skipped), reason and success of the final answer.",
    ),
    family(
        "reprise_rule_requests_total",
        Kind::Counter,
        "Logical requests by the retry rule (RetryPolicy) that applied, outcome, reason and success of the final answer.",
    ),
    family(
        "reprise_retries_total",
        Kind::Counter,
        "Retries issued, by the error kind of the failed attempt.",
    ),
    family(
        "reprise_retry_budget_refusals_total",
        Kind::Counter,
        "Retries refused by the upstream's retry budget.",
    ),
    family(
        "reprise_retry_budget_remaining",
        Kind::Gauge,
        "Retries the upstream's budget allows at least, in the current window.",
    ),
    family(
        "reprise_hedges_total",
        Kind::Counter,
        "Speculative duplicate attempts sent.",
    ),
    family(
        "reprise_tls_peer_certificate_expiry_seconds",
        Kind::Gauge,
        "When the certificate an endpoint presented in its last TLS handshake expires, in seconds since the Unix epoch.",
    ),
    family(
        "reprise_tls_certificate_failures_total",
        Kind::Counter,
        "Attempts whose endpoint's certificate failed validation, by upstream and reason (unknown_issuer, expired, not_yet_valid, name_mismatch, bad_signature, revoked, invalid_purpose, not_presented, other).",
    ),
    family(
        "reprise_deadlines_received_total",
        Kind::Counter,
        "Requests that came with a deadline from an earlier hop (a reprise-deadline baggage entry), by upstream and result (accepted; ignored as malformed, stale or far_future).",
    ),
    family(
        "reprise_deadline_stops_total",
        Kind::Counter,
        "Attempts a deadline propagated from an earlier hop stopped, by upstream and stop (before_first_attempt: answered 504 at once; retry, hedge: not sent; attempt_cut: its wait cut).",
    ),
    family(
        "reprise_deadlines_not_propagated_total",
        Kind::Counter,
        "Attempts whose baggage could not carry the request's deadline, by upstream and reason (baggage_full: past the W3C limits; baggage_malformed: the application's baggage is not valid); their baggage went out as the application sent it.",
    ),
    family(
        "reprise_response_body_errors_total",
        Kind::Counter,
        "Response bodies that failed mid-stream (never retried).",
    ),
    family(
        "reprise_grpc_responses_total",
        Kind::Counter,
        "gRPC responses passed to clients, by upstream and grpc-status name.",
    ),
    family(
        "reprise_upstream_attempt_duration_seconds",
        Kind::Histogram,
        "Time from sending an attempt to its response headers or failure.",
    ),
    family(
        "reprise_endpoint_in_flight",
        Kind::Gauge,
        "Attempts waiting on each endpoint.",
    ),
    family(
        "reprise_endpoint_ejected",
        Kind::Gauge,
        "1 while passive health has the endpoint ejected.",
    ),
    family(
        "reprise_endpoint_ejections_total",
        Kind::Counter,
        "Times passive health ejected the endpoint.",
    ),
    family(
        "reprise_requests_in_flight",
        Kind::Gauge,
        "Logical requests being handled, each counted once.",
    ),
    family(
        "reprise_replay_buffer_bytes",
        Kind::Gauge,
        "Bytes held by request replay buffers.",
    ),
    family(
        "reprise_replay_buffer_limit_bytes",
        Kind::Gauge,
        "Reservation all replay buffers share.",
    ),
    family(
        "reprise_config_reloads_total",
        Kind::Counter,
        "Configuration loads by result (ok, refused).",
    ),
    family(
        "reprise_tls_file_reloads_total",
        Kind::Counter,
        "Changes of the TLS files the configuration names by result (ok: the new files serve; refused: invalid, the old ones stay).",
    ),
    family(
        "reprise_unknown_upstream_total",
        Kind::Counter,
        "Requests for a host that names no upstream.",
    ),
    family(
        "reprise_h2c_reset_flood_closes_total",
        Kind::Counter,
        "h2c connections closed because their client reset most of its streams before the answer.",
    ),
    family(
        "reprise_rule_cel_errors_total",
        Kind::Counter,
        "Rule CEL conditions that failed to evaluate (each counted as no match), by rule id.",
    ),
    family(
        "reprise_dns_lookups_total",
        Kind::Counter,
        "Lookups of host-named endpoints' DNS names by host and result (resolved; failed: the last addresses are kept).",
    ),
    family(
        "reprise_dns_addresses",
        Kind::Gauge,
        "Addresses a host-named endpoint's DNS name resolved to last, each an endpoint.",
    ),
    family(
        "reprise_captured_connections_total",
        Kind::Counter,
        "Transparently captured connections by how they were served (http1, h2c: the retry path; opaque: relayed as TCP).",
    ),
    family(
        "reprise_captured_refused_total",
        Kind::Counter,
        "Captured connections refused, by reason (loop: the destination is the sidecar's own listener; no_original_destination: not redirected).",
    ),
    family(
        "reprise_opaque_connect_failures_total",
        Kind::Counter,
        "Opaque relays whose destination could not be reached (the client's connection is reset).",
    ),
    family(
        "reprise_opaque_connections_open",
        Kind::Gauge,
        "Opaque relays of captured connections open now.",
    ),
    family(
        "reprise_opaque_bytes_total",
        Kind::Counter,
        "Bytes opaque relays carried, by direction (sent: client to destination; received: back).",
    ),
    family(
        "reprise_connections_open",
        Kind::Gauge,
        "Client connections open, by listener (proxy, transparent, admin, health).",
    ),
    family(
        "reprise_connections_refused_total",
        Kind::Counter,
        "Client connections closed at once because their listener had as many open as its cap, by listener.",
    ),
    family(
        "reprise_trace_spans_exported_total",
        Kind::Counter,
        "Spans the OTLP collector accepted (0 while tracing is off).",
    ),
    family(
        "reprise_trace_spans_dropped_total",
        Kind::Counter,
        "Spans dropped: export queue full, collector unreachable or export timed out.",
    ),
];

#[cfg(test)]
mod tests {
    use super::FAMILIES;

    #[test]
    fn every_family_is_documented_in_the_metrics_reference() {
        // The other direction (every metric the guide names exists) is
        // e2e/tests/docs.rs's, which sees the controller's families too.
        let page = include_str!("../../../../docs/src/reference/metrics.md");
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
}
