//! What each retry rule's requests came to: one [`RuleTraffic`] per rule,
//! kept across reloads while the rule exists, behind
//! `reprise_rule_requests_total` and the reports a sidecar sends its
//! controller (the RetryPolicy's `status.traffic`).
//!
//! A request that succeeded on its first attempt costs one relaxed atomic
//! add and a latency bucket's; the maps are touched only by requests that
//! failed or were retried.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use reprise_crds::traffic::{latency_bucket, TrafficCounts, LATENCY_BOUNDS_MS};

use crate::exchange::failure::FailureKind;
use crate::exchange::outcome::Outcome;
use crate::exchange::report::Report;

/// Latency buckets: one per bound and one for the rest.
const BUCKETS: usize = LATENCY_BOUNDS_MS.len() + 1;

/// One rule's counts since the sidecar started.
#[derive(Debug, Default)]
pub(crate) struct RuleTraffic {
    /// Answered on the first attempt, successfully.
    ok_success: AtomicU64,
    /// Recovered by a retry, successfully.
    recovered_success: AtomicU64,
    /// Final responses by latency bucket.
    latency: [AtomicU64; BUCKETS],
    /// Everything else.
    rare: Mutex<Rare>,
    /// The counts as the last report took them.
    reported: Mutex<TrafficCounts>,
}

#[derive(Debug, Default)]
struct Rare {
    /// Requests by outcome, reason and success, but for the two above.
    outcomes: BTreeMap<(&'static str, &'static str, bool), u64>,
    /// Retries and hedges sent.
    retries: u64,
    /// First failures by kind.
    failures: BTreeMap<String, u64>,
}

/// A finished request, as a rule counts it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Finished {
    /// What the retry layer did.
    pub(crate) outcome: Outcome,
    /// Whether the client's final answer was a success.
    pub(crate) success: bool,
    /// Attempts made.
    pub(crate) attempts: u32,
    /// The first failure's kind, if any.
    pub(crate) first_error: Option<FailureKind>,
    /// Time to the final answer's headers.
    pub(crate) elapsed: Duration,
}

impl Finished {
    /// `report`'s request, answered `success`fully or not after `elapsed`.
    pub(crate) fn of(report: &Report, success: bool, elapsed: Duration) -> Self {
        Finished {
            outcome: report.outcome,
            success,
            attempts: report.attempts,
            first_error: report.first_error,
            elapsed,
        }
    }
}

impl RuleTraffic {
    /// Counts one finished request.
    pub(crate) fn record(&self, f: &Finished) {
        let ms = u64::try_from(f.elapsed.as_millis()).unwrap_or(u64::MAX);
        self.latency[latency_bucket(ms).min(BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
        match (f.outcome, f.success) {
            (Outcome::Ok, true) if f.attempts <= 1 => {
                self.ok_success.fetch_add(1, Ordering::Relaxed);
                return;
            }
            (Outcome::Recovered, true) => {
                self.recovered_success.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        let mut rare = lock(&self.rare);
        if !matches!((f.outcome, f.success), (Outcome::Recovered, true)) {
            *rare
                .outcomes
                .entry((f.outcome.name(), f.outcome.reason(), f.success))
                .or_default() += 1;
        }
        rare.retries += u64::from(f.attempts.saturating_sub(1));
        if let Some(kind) = f.first_error {
            *rare.failures.entry(kind.name().into_owned()).or_default() += 1;
        }
    }

    /// Requests so far by outcome, reason and success.
    pub(crate) fn outcomes(&self) -> BTreeMap<(&'static str, &'static str, bool), u64> {
        let mut out = lock(&self.rare).outcomes.clone();
        // A hedged request its first attempt answered is `ok` in the map too.
        *out.entry(("ok", "", true)).or_default() += self.ok_success.load(Ordering::Relaxed);
        *out.entry(("recovered", "", true)).or_default() +=
            self.recovered_success.load(Ordering::Relaxed);
        out
    }

    /// Everything counted so far, as a report carries it.
    pub(crate) fn counts(&self) -> TrafficCounts {
        let rare = lock(&self.rare);
        let ok = self.ok_success.load(Ordering::Relaxed);
        let recovered = self.recovered_success.load(Ordering::Relaxed);
        let mut c = TrafficCounts {
            requests: ok + recovered,
            first_try_success: ok,
            success: ok + recovered,
            retries: rare.retries,
            recovered,
            latency: self
                .latency
                .iter()
                .map(|n| n.load(Ordering::Relaxed))
                .collect(),
            failures: rare.failures.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            ..TrafficCounts::default()
        };
        for (&(name, reason, success), &n) in &rare.outcomes {
            c.requests += n;
            if success {
                c.success += n;
                if name == "ok" {
                    c.first_try_success += n;
                }
            }
            match name {
                "recovered" => c.recovered += n,
                "exhausted" => *c.exhausted.entry(reason.to_string()).or_default() += n,
                "skipped" => *c.skipped.entry(reason.to_string()).or_default() += n,
                _ => {}
            }
            if (name, reason) == ("exhausted", "budget") {
                c.budget_refusals += n;
            }
        }
        c
    }

    /// Whether it counted anything [`RuleTraffic::take_since_report`] has
    /// not taken yet.
    pub(crate) fn has_unreported(&self) -> bool {
        self.counts() != *lock(&self.reported)
    }

    /// What was counted since the last call (everything, the first time).
    pub(crate) fn take_since_report(&self) -> TrafficCounts {
        let now = self.counts();
        let mut reported = lock(&self.reported);
        let delta = minus(&now, &reported);
        *reported = now;
        delta
    }
}

/// `a - b`, field by field (counters only grow, so never below zero).
fn minus(a: &TrafficCounts, b: &TrafficCounts) -> TrafficCounts {
    let map = |a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
        a.iter()
            .map(|(k, v)| (k.clone(), v.saturating_sub(b.get(k).copied().unwrap_or(0))))
            .filter(|(_, v)| *v > 0)
            .collect()
    };
    let latency: Vec<u64> = a
        .latency
        .iter()
        .enumerate()
        .map(|(i, v)| v.saturating_sub(b.latency.get(i).copied().unwrap_or(0)))
        .collect();
    TrafficCounts {
        requests: a.requests.saturating_sub(b.requests),
        first_try_success: a.first_try_success.saturating_sub(b.first_try_success),
        success: a.success.saturating_sub(b.success),
        retries: a.retries.saturating_sub(b.retries),
        recovered: a.recovered.saturating_sub(b.recovered),
        exhausted: map(&a.exhausted, &b.exhausted),
        skipped: map(&a.skipped, &b.skipped),
        budget_refusals: a.budget_refusals.saturating_sub(b.budget_refusals),
        failures: map(&a.failures, &b.failures),
        latency: if latency.iter().any(|n| *n > 0) {
            latency
        } else {
            Vec::new()
        },
        unknown: Default::default(),
    }
}

/// Whether a final answer is a success: an HTTP status under 500 other
/// than 429 and, for gRPC, status `OK` (`grpc`: the code, when known).
pub(crate) fn is_success(status: http::StatusCode, grpc: Option<u8>) -> bool {
    status.as_u16() < 500
        && status != http::StatusCode::TOO_MANY_REQUESTS
        && grpc.is_none_or(|c| c == 0)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::outcome::{ExhaustedBy, SkipReason};

    fn finished(outcome: Outcome, success: bool, attempts: u32, ms: u64) -> Finished {
        Finished {
            outcome,
            success,
            attempts,
            first_error: (attempts > 1 || !success).then_some(FailureKind::UpstreamStatus(503)),
            elapsed: Duration::from_millis(ms),
        }
    }

    #[test]
    fn counts_say_first_try_and_effective_success_apart() {
        let t = RuleTraffic::default();
        for _ in 0..7 {
            t.record(&finished(Outcome::Ok, true, 1, 3));
        }
        t.record(&finished(Outcome::Recovered, true, 2, 30));
        t.record(&finished(Outcome::Recovered, true, 2, 30));
        t.record(&finished(
            Outcome::Exhausted(ExhaustedBy::Budget),
            false,
            1,
            4,
        ));
        // A 4xx is a success; a 500 the policy does not retry is not.
        t.record(&finished(
            Outcome::Skipped(SkipReason::NotRetryable),
            false,
            1,
            2,
        ));
        let c = t.counts();
        assert_eq!(c.requests, 11);
        assert_eq!(c.first_try_success, 7);
        assert_eq!(c.success, 9);
        assert_eq!(c.recovered, 2);
        assert_eq!(c.retries, 2);
        assert_eq!(c.exhausted["budget"], 1);
        assert_eq!(c.skipped["not_retryable"], 1);
        assert_eq!(c.budget_refusals, 1);
        assert_eq!(c.failures["upstream_status_503"], 4);
        assert_eq!(c.latency_quantile_ms(0.5), Some(5));
        assert_eq!(c.latency_quantile_ms(0.99), Some(50));
        // A hedge was sent, and the first attempt answered anyway.
        t.record(&finished(Outcome::Ok, true, 2, 3));
        let c = t.counts();
        assert_eq!((c.requests, c.first_try_success, c.retries), (12, 8, 3));
        let outcomes = t.outcomes();
        assert_eq!(outcomes[&("ok", "", true)], 8);
        assert_eq!(outcomes[&("recovered", "", true)], 2);
        assert_eq!(outcomes[&("skipped", "not_retryable", false)], 1);
    }

    #[test]
    fn a_report_takes_what_came_since_the_last() {
        let t = RuleTraffic::default();
        t.record(&finished(Outcome::Ok, true, 1, 3));
        t.record(&finished(
            Outcome::Exhausted(ExhaustedBy::Attempts),
            false,
            3,
            3,
        ));
        let first = t.take_since_report();
        assert_eq!((first.requests, first.retries), (2, 2));
        assert_eq!(first.exhausted["attempts"], 1);
        assert_eq!(t.take_since_report(), TrafficCounts::default());
        t.record(&finished(Outcome::Recovered, true, 2, 3));
        let second = t.take_since_report();
        assert_eq!(
            (second.requests, second.recovered, second.retries),
            (1, 1, 1)
        );
        assert!(second.exhausted.is_empty());
    }

    #[test]
    fn success_is_under_500_but_429_and_grpc_ok() {
        use http::StatusCode;
        assert!(is_success(StatusCode::OK, None));
        assert!(is_success(StatusCode::NOT_FOUND, None));
        assert!(!is_success(StatusCode::TOO_MANY_REQUESTS, None));
        assert!(!is_success(StatusCode::BAD_GATEWAY, None));
        assert!(is_success(StatusCode::OK, Some(0)));
        assert!(!is_success(StatusCode::OK, Some(14)));
    }
}
