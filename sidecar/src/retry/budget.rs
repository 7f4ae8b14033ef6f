//! The retry budget: a rolling, lock-free share of an upstream's requests that
//! may be retries.

use reprise_crds::BudgetSettings;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Instant;

/// Buckets the window is split into; a bucket older than the window no longer counts.
const BUCKETS: usize = 10;

/// A retry is allowed while `(retries + 1) * 100 <= percent * requests` over the
/// rolling window (plus `min_retries_per_second * window` when configured),
/// where `requests` counts every request the upstream received, retries and
/// hedges included: `percent` is the share of the upstream's traffic that may
/// be retries, so 100 sets no limit and 10 bounds a full outage's
/// amplification at 1 / (1 - 0.10) ≈ 1.11. Shared by every in-flight request
/// to one upstream; every operation is a few relaxed atomic loads and adds,
/// never a lock.
#[derive(Debug)]
pub(crate) struct RetryBudget {
    origin: Instant,
    bucket_ms: u64,
    window_secs: f64,
    /// `percent` as f64 bits, so a reload can change it in place.
    percent_bits: AtomicU64,
    /// `min_retries_per_second` as f64 bits (it may be below one).
    min_per_second_bits: AtomicU64,
    buckets: [Bucket; BUCKETS],
}

#[derive(Debug, Default)]
struct Bucket {
    tick: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
}

impl RetryBudget {
    /// A budget with `settings`, empty.
    pub(crate) fn new(settings: &BudgetSettings) -> Self {
        let window_ms = u64::try_from(settings.window.as_millis())
            .unwrap_or(u64::MAX)
            .max(BUCKETS as u64);
        Self {
            origin: Instant::now(),
            bucket_ms: window_ms / BUCKETS as u64,
            window_secs: settings.window.as_secs_f64(),
            percent_bits: AtomicU64::new(settings.percent.to_bits()),
            min_per_second_bits: AtomicU64::new(settings.min_retries_per_second.to_bits()),
            buckets: Default::default(),
        }
    }

    /// True when this budget's window matches `settings` (so a reload can keep its counts).
    pub(crate) fn same_window(&self, settings: &BudgetSettings) -> bool {
        (self.window_secs - settings.window.as_secs_f64()).abs() < 1e-9
    }

    /// Applies a reloaded percentage and floor without losing the window's counts.
    pub(crate) fn update(&self, settings: &BudgetSettings) {
        self.percent_bits
            .store(settings.percent.to_bits(), Ordering::Relaxed);
        self.min_per_second_bits
            .store(settings.min_retries_per_second.to_bits(), Ordering::Relaxed);
    }

    /// Counts one logical request's first attempt (retries are counted by
    /// [`RetryBudget::try_withdraw`]).
    #[cfg(test)]
    pub(crate) fn record_request(&self) {
        self.record_request_at(Instant::now());
    }

    /// Counts one logical request's first attempt, sent at `now` (retries are
    /// counted by [`RetryBudget::try_withdraw`]):
    /// the proxy passes the time it already read for the request (a clock
    /// read is not free: measured in
    /// `e2e/bench/results/2026-12-04-issue18-clocks-and-copies.md`).
    pub(crate) fn record_request_at(&self, now: Instant) {
        self.current_at(now)
            .requests
            .fetch_add(1, Ordering::Relaxed);
    }

    /// True when one more retry would be within budget. Does not charge it.
    pub(crate) fn has_room(&self) -> bool {
        let (requests, retries) = self.totals();
        self.allows(requests, retries + 1)
    }

    /// Charges one retry if it is within budget, counting it as a request to
    /// the upstream too; false (and nothing charged) if not. Concurrent callers
    /// each see their own charge, so the budget is never overdrawn.
    pub(crate) fn try_withdraw(&self) -> bool {
        let bucket = self.current();
        bucket.retries.fetch_add(1, Ordering::Relaxed);
        let (requests, retries) = self.totals();
        if self.allows(requests, retries) {
            bucket.requests.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            bucket.retries.fetch_sub(1, Ordering::Relaxed);
            false
        }
    }

    /// Retries allowed in the current window at least (for metrics): each one
    /// granted also counts as a request, so more may follow.
    pub(crate) fn remaining(&self) -> u64 {
        let (requests, retries) = self.totals();
        let allowed = (self.percent() * requests as f64 / 100.0 + self.floor()).floor();
        (allowed as u64).saturating_sub(retries)
    }

    /// Requests and retries counted in the window.
    pub(crate) fn totals(&self) -> (u64, u64) {
        let now = self.tick();
        let oldest = now.saturating_sub(BUCKETS as u64 - 1);
        let mut requests = 0;
        let mut retries = 0;
        for b in &self.buckets {
            let t = b.tick.load(Ordering::Acquire);
            if t >= oldest && t <= now {
                requests += b.requests.load(Ordering::Relaxed);
                retries += b.retries.load(Ordering::Relaxed);
            }
        }
        (requests, retries)
    }

    fn allows(&self, requests: u64, retries_after: u64) -> bool {
        retries_after as f64 * 100.0 <= self.percent() * requests as f64 + self.floor() * 100.0
    }

    fn percent(&self) -> f64 {
        f64::from_bits(self.percent_bits.load(Ordering::Relaxed))
    }

    fn floor(&self) -> f64 {
        f64::from_bits(self.min_per_second_bits.load(Ordering::Relaxed)) * self.window_secs
    }

    fn tick(&self) -> u64 {
        self.tick_at(Instant::now())
    }

    fn tick_at(&self, now: Instant) -> u64 {
        // +1 so that tick 0 never occurs and a zeroed bucket is never "current".
        let since = now.saturating_duration_since(self.origin);
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX) / self.bucket_ms + 1
    }

    fn current(&self) -> &Bucket {
        self.current_at(Instant::now())
    }

    fn current_at(&self, now: Instant) -> &Bucket {
        let tick = self.tick_at(now);
        let bucket = &self.buckets[(tick % BUCKETS as u64) as usize];
        let seen = bucket.tick.load(Ordering::Acquire);
        if seen != tick
            && bucket
                .tick
                .compare_exchange(seen, tick, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            // We own the rotation. Counts added by racers in this instant may be
            // lost: the budget is approximate at bucket edges by design.
            bucket.requests.store(0, Ordering::Relaxed);
            bucket.retries.store(0, Ordering::Relaxed);
        }
        bucket
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn budget(percent: f64, min: u32) -> RetryBudget {
        RetryBudget::new(&BudgetSettings {
            percent,
            window: Duration::from_secs(10),
            min_retries_per_second: f64::from(min),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn ten_percent_allows_one_retry_per_ten_requests() {
        let b = budget(10.0, 0);
        for _ in 0..9 {
            b.record_request();
        }
        // (0 + 1) * 100 <= 10 * 9 is false.
        assert!(!b.has_room());
        assert!(!b.try_withdraw());
        b.record_request();
        assert!(b.has_room());
        assert!(b.try_withdraw());
        // The retry is a request too: (1 + 1) * 100 <= 10 * 11 is false.
        assert_eq!(b.totals(), (11, 1));
        assert!(!b.try_withdraw());
        for _ in 0..9 {
            b.record_request();
        }
        // (1 + 1) * 100 <= 10 * 20.
        assert!(b.try_withdraw());
        assert_eq!(b.totals(), (21, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn counts_leave_the_window() {
        let b = budget(50.0, 0);
        for _ in 0..10 {
            b.record_request();
        }
        // (r + 1) * 100 <= 50 * (10 + r) holds up to r = 8: nine retries.
        for _ in 0..9 {
            assert!(b.try_withdraw());
        }
        assert!(!b.try_withdraw());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(b.totals(), (19, 9), "still inside the 10 s window");
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(b.totals(), (0, 0), "the window rolled past them");
        assert!(!b.try_withdraw(), "no requests, no retries");
        b.record_request();
        b.record_request();
        assert!(b.try_withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn floor_allows_retries_at_low_traffic() {
        let b = budget(10.0, 1);
        b.record_request();
        // Floor: 1 retry/s over a 10 s window = 10 retries, and the 10% of
        // the requests those retries make: eleven in all.
        for _ in 0..11 {
            assert!(b.try_withdraw());
        }
        assert!(!b.try_withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn update_keeps_counts() {
        let b = budget(10.0, 0);
        for _ in 0..10 {
            b.record_request();
        }
        assert!(b.try_withdraw());
        assert!(!b.try_withdraw());
        b.update(&BudgetSettings {
            percent: 100.0,
            window: Duration::from_secs(10),
            min_retries_per_second: 0.0,
        });
        assert_eq!(b.remaining(), 10);
        assert!(b.try_withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn a_hundred_percent_sets_no_limit() {
        let b = budget(100.0, 0);
        b.record_request();
        for _ in 0..1000 {
            assert!(b.try_withdraw());
        }
        assert_eq!(b.totals(), (1001, 1000));
    }

    #[tokio::test(start_paused = true)]
    async fn ten_percent_bounds_a_full_outage_at_one_point_one_one() {
        // Every request fails and asks for up to ten retries, one after another.
        let b = budget(10.0, 0);
        for _ in 0..10_000 {
            b.record_request();
            while b.try_withdraw() {}
        }
        let (requests, retries) = b.totals();
        let amplification = requests as f64 / 10_000.0;
        assert!(
            retries * 100 <= 10 * requests,
            "a tenth of the traffic at most"
        );
        assert!(
            (1.10..=1.112).contains(&amplification),
            "1 / (1 - 0.10) = 1.111: {amplification}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_floor_below_one_a_second_and_a_zero_percent_allow_only_the_floor() {
        // Gateway API's minRetryRate of one per ten seconds, over a 10 s window:
        // exactly one retry in the window, whatever the requests.
        let b = RetryBudget::new(&BudgetSettings {
            percent: 0.0,
            window: Duration::from_secs(10),
            min_retries_per_second: 0.1,
        });
        for _ in 0..1_000 {
            b.record_request();
        }
        assert!(b.try_withdraw());
        assert!(
            !b.try_withdraw(),
            "a zero percent adds nothing to the floor"
        );
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(b.try_withdraw(), "the window moved on");
    }
}
