//! What the sidecars connected to this replica report of each policy's
//! traffic, kept over a rolling [`WINDOW`] in [`BUCKET_SECS`] buckets, and
//! the `status.traffic` it comes to. Reports are counts since the sidecar's
//! last one, so a sidecar that stops reporting simply ages out, and counts
//! from several replicas add up.
//!
//! The book is bounded whatever the pods send: a report reaches it only
//! checked ([`TrafficReport::check`]: known names, bounded integers) and
//! paced ([`Pace`]: one per report interval per pod, a burst of
//! [`REPORT_BURST`], a final report exempt), under the policies the pod was
//! sent. So it holds, per policy, at most one bucket per [`BUCKET_SECS`] of
//! the window, each with the fixed vocabulary's keys and at most
//! [`BOOK_FAILURE_KINDS`] failure kinds, and one timestamp per reporting pod.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use reprise_crds::resource::TrafficStatus;
use reprise_crds::traffic::{TrafficCounts, TrafficReport};
use serde::{Deserialize, Serialize};

/// The window `status.traffic` covers, in seconds.
pub const WINDOW_SECS: i64 = 300;
/// The window as `status.traffic.window` writes it.
pub const WINDOW: &str = "5m";
/// Reports falling in one bucket are added together.
pub const BUCKET_SECS: i64 = 10;

/// Reports a pod may send back to back before the pace of one per report
/// interval holds: a report delayed on the network arrives close to the
/// next one, and neither is lost.
pub const REPORT_BURST: u64 = 3;

/// Distinct failure kinds one policy's bucket keeps; further kinds are
/// added to `other` (the status names only the top one).
pub const BOOK_FAILURE_KINDS: usize = 64;

/// One pod's report pace (a GCRA): a report is taken when the pod has not
/// sent more than [`REPORT_BURST`] within as many intervals; a final report
/// (the pod is stopping) is taken once per interval whatever the pace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pace {
    /// When the pod's next report would be on time (ms, the caller's clock).
    due_ms: u64,
    /// When its last final report was taken.
    last_final_ms: Option<u64>,
}

impl Pace {
    /// Whether a report (`last`: a final one) at `now_ms` is taken, with
    /// reports due every `interval_ms`; updates the pace when it is.
    pub fn take(&mut self, now_ms: u64, interval_ms: u64, last: bool) -> bool {
        if last
            && self
                .last_final_ms
                .is_none_or(|t| now_ms >= t.saturating_add(interval_ms))
        {
            self.last_final_ms = Some(now_ms);
            return true;
        }
        let slack = interval_ms.saturating_mul(REPORT_BURST - 1);
        if self.due_ms > now_ms.saturating_add(slack) {
            return false;
        }
        self.due_ms = self.due_ms.max(now_ms).saturating_add(interval_ms);
        true
    }

    /// True when the pace is as a pod's that never reported: forgetting it
    /// changes nothing.
    pub fn is_rested(&self, now_ms: u64, interval_ms: u64) -> bool {
        self.due_ms <= now_ms
            && self
                .last_final_ms
                .is_none_or(|t| now_ms >= t.saturating_add(interval_ms))
    }
}

/// One policy's counts over the window, and how many sidecars reported them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowTotal {
    /// The counts.
    pub counts: TrafficCounts,
    /// Sidecars whose reports are in the window.
    pub sidecars: u64,
}

impl WindowTotal {
    /// Adds `other` in (another replica's sidecars).
    pub fn add(&mut self, other: &WindowTotal) {
        self.counts.add(&other.counts);
        self.sidecars += other.sidecars;
    }
}

/// Reports of this replica's sidecars, by policy (`namespace/name`).
#[derive(Debug, Default)]
pub struct TrafficBook {
    policies: Mutex<HashMap<String, PolicyWindow>>,
}

#[derive(Debug, Default)]
struct PolicyWindow {
    /// Bucket start (Unix seconds) and its counts, oldest first.
    buckets: VecDeque<(i64, TrafficCounts)>,
    /// When each sidecar (`namespace/pod`) last reported on the policy.
    reporters: HashMap<String, i64>,
}

impl PolicyWindow {
    fn prune(&mut self, now: i64) {
        let oldest = now - WINDOW_SECS;
        while self
            .buckets
            .front()
            .is_some_and(|(start, _)| *start <= oldest)
        {
            self.buckets.pop_front();
        }
        self.reporters.retain(|_, at| *at > oldest);
    }

    fn total(&self) -> WindowTotal {
        let mut counts = TrafficCounts::default();
        for (_, c) in &self.buckets {
            counts.add(c);
        }
        WindowTotal {
            counts,
            sidecars: self.reporters.len() as u64,
        }
    }
}

impl TrafficBook {
    /// Adds the report of sidecar `sidecar` (`namespace/pod`) received at
    /// `now` (Unix seconds). A sidecar reports only on policies its
    /// snapshot holds, so its policy names are taken as they come; a name
    /// the cache does not know is never read back.
    pub fn record(&self, sidecar: &str, report: &TrafficReport, now: i64) {
        let bucket = now - now.rem_euclid(BUCKET_SECS);
        let mut policies = lock(&self.policies);
        for (policy, counts) in &report.traffic {
            let w = policies.entry(policy.clone()).or_default();
            match w.buckets.back_mut() {
                Some((start, c)) if *start == bucket => c.add(counts),
                _ => w.buckets.push_back((bucket, counts.clone())),
            }
            if let Some((_, c)) = w.buckets.back_mut() {
                fold_failures(c);
            }
            w.reporters.insert(sidecar.to_string(), now);
            w.prune(now);
        }
    }

    /// `policy`'s total over the window ending `now`, if any sidecar reported.
    pub fn window(&self, policy: &str, now: i64) -> Option<WindowTotal> {
        let mut policies = lock(&self.policies);
        let w = policies.get_mut(policy)?;
        w.prune(now);
        Some(w.total())
    }

    /// Every policy's total over the window ending `now` (what a replica
    /// publishes for the leader); policies with nothing left are forgotten.
    pub fn all(&self, now: i64) -> BTreeMap<String, WindowTotal> {
        let mut policies = lock(&self.policies);
        policies.retain(|_, w| {
            w.prune(now);
            !w.buckets.is_empty()
        });
        policies
            .iter()
            .map(|(id, w)| (id.clone(), w.total()))
            .collect()
    }
}

/// Keeps at most [`BOOK_FAILURE_KINDS`] failure kinds in `c`, the most
/// counted; the others' counts go to `other`.
fn fold_failures(c: &mut TrafficCounts) {
    if c.failures.len() <= BOOK_FAILURE_KINDS {
        return;
    }
    let mut kinds: Vec<(String, u64)> = std::mem::take(&mut c.failures).into_iter().collect();
    kinds.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let rest: u64 = kinds
        .drain(BOOK_FAILURE_KINDS - 1..)
        .map(|(_, n)| n)
        .fold(0, u64::saturating_add);
    c.failures = kinds.into_iter().collect();
    let other = c.failures.entry("other".to_string()).or_default();
    *other = other.saturating_add(rest);
}

/// The `status.traffic` of `total`, observed at `observed_at` (RFC 3339).
pub fn status(total: &WindowTotal, observed_at: String) -> TrafficStatus {
    let c = &total.counts;
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let map = |m: &BTreeMap<String, u64>| -> BTreeMap<String, i64> {
        m.iter().map(|(k, v)| (k.clone(), count(*v))).collect()
    };
    let latency = |q| c.latency_quantile_ms(q).map(|ms| format!("{ms}ms"));
    TrafficStatus {
        window: WINDOW.to_string(),
        observed_at,
        requests: count(c.requests),
        first_try_success: percent(c.first_try_success, c.requests),
        effective_success: percent(c.success, c.requests),
        retries: count(c.retries),
        recovered: count(c.recovered),
        exhausted: map(&c.exhausted),
        exhausted_total: count(c.exhausted.values().sum()),
        skipped: map(&c.skipped),
        budget_refusals: count(c.budget_refusals),
        top_failure: c.top_failure().map(str::to_string),
        latency_p50: latency(0.5),
        latency_p99: latency(0.99),
        sidecars: count(total.sidecars),
    }
}

/// True when `a` and `b` say the same but for when they were observed.
pub fn same_traffic(a: &TrafficStatus, b: &TrafficStatus) -> bool {
    TrafficStatus {
        observed_at: String::new(),
        ..a.clone()
    } == TrafficStatus {
        observed_at: String::new(),
        ..b.clone()
    }
}

/// `part` of `whole` with two decimals and a percent sign (integers only:
/// Kubernetes APIs avoid floats); `-` of nothing.
fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_string();
    }
    // Hundredths of a percent, rounded half up.
    let bp = (u128::from(part) * 20_000 / u128::from(whole)).div_ceil(2);
    format!("{}.{:02}%", bp / 100, bp % 100)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(policy: &str, requests: u64, success: u64) -> TrafficReport {
        TrafficReport {
            traffic: [(
                policy.to_string(),
                TrafficCounts {
                    requests,
                    success,
                    first_try_success: success.saturating_sub(1),
                    ..TrafficCounts::default()
                },
            )]
            .into(),
            ..TrafficReport::default()
        }
    }

    #[test]
    fn reports_add_up_over_the_window_and_age_out() {
        let book = TrafficBook::default();
        book.record("ns/a", &report("ns/p", 10, 9), 1_000);
        book.record("ns/b", &report("ns/p", 5, 5), 1_005);
        book.record("ns/a", &report("ns/p", 10, 10), 1_100);
        let t = book.window("ns/p", 1_100).expect("reported");
        assert_eq!(
            (t.counts.requests, t.counts.success, t.sidecars),
            (25, 24, 2)
        );
        // The first two buckets leave the window; b has not reported since.
        let t = book
            .window("ns/p", 1_000 + WINDOW_SECS + 5)
            .expect("reported");
        assert_eq!((t.counts.requests, t.sidecars), (10, 1));
        assert!(book.window("ns/other", 1_100).is_none());
        assert!(book.all(1_100 + WINDOW_SECS).is_empty(), "all aged out");
    }

    #[test]
    fn the_status_writes_counts_as_integers_and_ratios_as_strings() {
        let mut counts = TrafficCounts {
            requests: 2_000,
            first_try_success: 1_900,
            success: 1_999,
            retries: 110,
            recovered: 99,
            exhausted: [("budget".to_string(), 1)].into(),
            failures: [("upstream_status_503".to_string(), 100)].into(),
            ..TrafficCounts::default()
        };
        counts.latency = vec![0; 16];
        counts.latency[3] = 2_000;
        let s = status(
            &WindowTotal {
                counts,
                sidecars: 3,
            },
            "2026-12-06T10:00:00Z".into(),
        );
        assert_eq!(s.window, "5m");
        assert_eq!(s.first_try_success, "95.00%");
        assert_eq!(s.effective_success, "99.95%");
        assert_eq!((s.requests, s.retries, s.recovered), (2_000, 110, 99));
        assert_eq!(s.exhausted_total, 1);
        assert_eq!(s.top_failure.as_deref(), Some("upstream_status_503"));
        assert_eq!(s.latency_p50.as_deref(), Some("10ms"));
        assert_eq!(s.sidecars, 3);
        assert_eq!(percent(2, 3), "66.67%");
        assert_eq!(percent(0, 0), "-");
        assert_eq!(percent(5, 5), "100.00%");
    }

    #[test]
    fn a_pod_reports_once_an_interval_after_a_short_burst_and_finally_once_more() {
        let mut pace = Pace::default();
        let every = 10_000;
        // A burst of three (a delayed report arriving beside the next one).
        assert!(pace.take(0, every, false));
        assert!(pace.take(100, every, false));
        assert!(pace.take(200, every, false));
        assert!(!pace.take(300, every, false), "a fourth within the burst");
        assert!(!pace.take(9_000, every, false));
        assert!(
            pace.take(10_000, every, false),
            "one interval later: one more"
        );
        assert!(!pace.take(10_500, every, false));
        // The final report is taken whatever the pace, once an interval.
        assert!(pace.take(10_600, every, true));
        assert!(!pace.take(10_700, every, true), "a second final is paced");
        assert!(!pace.is_rested(10_700, every));
        assert!(pace.is_rested(100_000, every));
        // A rested pace takes a burst again.
        assert!(pace.take(100_000, every, false));
    }

    #[test]
    fn a_policys_failure_kinds_are_bounded_in_the_book() {
        let book = TrafficBook::default();
        for i in 0..200u64 {
            let mut r = report("ns/p", 10, 10);
            if let Some(c) = r.traffic.get_mut("ns/p") {
                c.failures = [(format!("upstream_status_{}", 400 + i), i + 1)].into();
            }
            book.record(&format!("ns/pod-{i}"), &r, 1_000);
        }
        let t = book.window("ns/p", 1_000).expect("reported");
        assert_eq!(t.counts.failures.len(), BOOK_FAILURE_KINDS);
        let total: u64 = t.counts.failures.values().sum();
        assert_eq!(total, (1..=200).sum::<u64>(), "folded, not lost");
        assert_eq!(t.counts.top_failure(), Some("other"));
        assert_eq!(t.counts.failures.get("upstream_status_599"), Some(&200));
    }

    #[test]
    fn only_the_observation_time_may_differ_for_the_same_traffic() {
        let t = WindowTotal::default();
        let a = status(&t, "2026-12-06T10:00:00Z".into());
        let b = status(&t, "2026-12-06T10:01:00Z".into());
        assert!(same_traffic(&a, &b));
        let mut c = b.clone();
        c.requests = 1;
        assert!(!same_traffic(&a, &c));
    }
}
