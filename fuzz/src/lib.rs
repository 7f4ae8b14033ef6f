//! The fuzz targets' inputs and invariants, one module per target, each
//! with a `check(&[u8])` that panics when an invariant breaks. libFuzzer
//! drives them from `fuzz/libfuzzer` (its own workspace: nightly flags and
//! the sanitizers); this crate is a member of the main workspace so that
//! `cargo test` replays the committed corpus (`fuzz/corpus/<target>`)
//! through the same functions on every run, without that build.
//!
//! What every target shares: an accepted [`Config`] is within the bounds
//! the product documents promise, whatever the input, so the sidecar never
//! runs a policy that validation would have refused ([`check_config`]).
//! [`wire`] holds what the HTTP/1 targets share.
#![forbid(unsafe_code)]

pub mod classifier;
pub mod config_file;
pub mod http1_request;
pub mod http1_response;
pub mod retry_after;
pub mod snapshot;
pub mod wire;

use std::time::Duration;

use reprise_crds::policy::{MAX_REPLAY_LIMIT_BYTES, MAX_RETRIES, MAX_TOTAL_DEADLINE_MS};
use reprise_crds::{Config, FailureBoundary, RetryPolicy, Rule};

/// Where a policy came from: the rules format (which needs the duplicate-risk
/// acknowledgement for more) or an upstream's gateway `retries` block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A rule (file `rules:` or a snapshot's RetryPolicy).
    Rule,
    /// An upstream's `retries` block.
    Upstream,
}

/// Panics (a fuzz finding) when `cfg` breaks a bound that validation promises.
pub fn check_config(cfg: &Config) {
    for u in &cfg.upstreams {
        check_policy(&u.retries, Origin::Upstream);
        let b = &u.budget;
        assert!(
            b.percent > 0.0 && b.percent <= 100.0,
            "budget percent {}",
            b.percent
        );
        assert!(
            b.window >= Duration::from_secs(1) && b.window <= Duration::from_secs(600),
            "budget window {:?}",
            b.window
        );
        assert!(u.connect_timeout >= Duration::from_millis(1));
        assert!(u.connect_timeout <= Duration::from_secs(600));
        if let Some(read) = u.read_timeout {
            assert!(read >= Duration::from_millis(1) && read <= Duration::from_secs(3600));
        }
        assert!(u.passive_health.consecutive_failures <= 1_000);
        assert!(u.passive_health.ejection <= Duration::from_secs(3600));
        for e in &u.endpoints {
            assert_ne!(e.addr.port(), 0, "port 0 accepted for {}", u.name);
        }
    }
    for pair in cfg.rules.windows(2) {
        assert!(
            (pair[0].priority, &pair[0].id) <= (pair[1].priority, &pair[1].id),
            "rules out of evaluation order"
        );
    }
    for r in &cfg.rules {
        check_rule(r);
    }
    let p = &cfg.proxy;
    assert!(p.replay_reservation_bytes <= 1 << 30);
    assert!(p.drain_timeout <= Duration::from_secs(600));
    assert!((8_192..=1 << 20).contains(&p.max_request_header_bytes));
    // The admin endpoint serves the resolved config as JSON: that must never fail.
    serde_json::to_vec(cfg).expect("a resolved config serializes");
}

/// Panics when a resolved rule breaks a bound.
pub fn check_rule(r: &Rule) {
    check_policy(&r.policy, Origin::Rule);
    assert_eq!(r.methods, r.policy.methods, "rule matches what it retries");
    // A rule needs the duplicate-risk acknowledgement for anything that
    // may duplicate an upstream operation.
    if r.policy.methods.has_unsafe()
        || r.policy.failure_boundary == FailureBoundary::BeforeHeaders
        || !r.policy.retry_statuses.is_empty()
    {
        assert!(
            r.policy.duplicate_risk_acknowledged,
            "rule {} may duplicate an operation without the acknowledgement",
            r.id
        );
    }
}

/// Panics when a resolved policy breaks a bound.
pub fn check_policy(p: &RetryPolicy, origin: Origin) {
    assert!(p.max_retries <= MAX_RETRIES, "attempts {}", p.max_retries);
    assert!(p.backoff_base <= p.backoff_cap, "backoff base > cap");
    assert!(p.backoff_cap <= Duration::from_secs(600));
    assert!(p.replay_limit_bytes <= MAX_REPLAY_LIMIT_BYTES);
    if let Some(d) = p.total_deadline {
        assert!(d >= Duration::from_millis(1));
        assert!(d <= Duration::from_millis(MAX_TOTAL_DEADLINE_MS));
    }
    if let Some(t) = p.attempt_timeout {
        assert!(t >= Duration::from_millis(1) && t <= Duration::from_secs(3600));
    }
    if let Some(h) = p.hedge_delay {
        assert!(h >= Duration::from_millis(1) && h <= Duration::from_secs(600));
    }
    assert!(p.retry_after_max <= Duration::from_secs(600));
    for s in p.retry_statuses.statuses() {
        assert!((400..=599).contains(&s), "status {s} in the retry set");
    }
    for m in ["CONNECT", "TRACE"] {
        assert!(!p.methods.contains(m), "{m} is never retried");
    }
    // PUT, DELETE, PATCH and `*` always need the acknowledgement (POST in an
    // upstream block is acknowledged by `retry_post`, which sets the flag).
    if p.methods.has_unsafe() {
        assert!(
            p.duplicate_risk_acknowledged,
            "{origin:?} policy retries unsafe methods without the acknowledgement"
        );
    }
    // Backoff never exceeds its cap, for any retry number, and never overflows.
    let mut previous = Duration::ZERO;
    for n in 1..=64 {
        let nominal = p.nominal_backoff(n);
        assert!(
            nominal <= p.backoff_cap,
            "nominal backoff {n} above the cap"
        );
        assert!(nominal >= previous, "backoff shrank at retry {n}");
        previous = nominal;
    }
}
