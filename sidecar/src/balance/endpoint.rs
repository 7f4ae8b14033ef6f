//! One endpoint's live state: in-flight attempts, a decaying failure estimate
//! that weighs endpoint choice, and passive health.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use http::uri::Authority;
use reprise_crds::{Endpoint, PassiveHealth};

mod timer;

pub(crate) use self::timer::TimerPool;
use super::client::EndpointClient;
use crate::clock;

/// How far each attempt's outcome moves the failure estimate toward 1 (failed)
/// or 0 (answered): a quarter, so two failures in a row already halve an
/// endpoint's share while one stray failure does not.
const FAILURE_WEIGHT: f64 = 0.25;

/// The failure estimate halves every this many milliseconds without new
/// outcomes, so an endpoint that stopped getting traffic is tried again soon.
const FAILURE_HALF_LIFE_MS: f64 = 1_000.0;

/// An estimate below this reads as 0: the endpoint is as good as one that never
/// failed. Without it an endpoint avoided while its peers are idle would never
/// be tried again (nothing new would ever be recorded to bring it to 0). One
/// failure (0.25) falls below it in about 3.6 s.
const NEGLIGIBLE_FAILURE: f64 = 0.02;

/// The lowest success estimate used in the cost, so an endpoint failing
/// everything still costs a finite amount (when all fail alike, load decides).
const MIN_SUCCESS: f64 = 0.05;

/// Live state of one endpoint, shared by every request and kept across reloads
/// while the endpoint stays in the configuration.
#[derive(Debug)]
pub(crate) struct EndpointState {
    /// The configured endpoint.
    pub endpoint: Endpoint,
    /// Pooled connections to it.
    pub client: EndpointClient,

    /// `address:port`, pre-built for request URIs.
    pub authority: Authority,
    /// The name logs give it: the configured name (the pod), else `address:port`.
    pub label: String,
    in_flight: AtomicU32,
    /// Failure estimate as f64 bits, as of `failure_at_ms`.
    failure_bits: AtomicU64,
    failure_at_ms: AtomicU64,
    consecutive_failures: AtomicU32,
    ejected_until_ms: AtomicU64,
    ejections: AtomicU64,
    /// Attempt timers kept for the next attempts.
    pub(crate) timers: TimerPool,
}

/// Decrements the endpoint's in-flight count when the attempt ends.
#[derive(Debug)]
pub(crate) struct InFlight<'a>(&'a EndpointState);

impl EndpointState {
    /// Fresh state for `endpoint`.
    pub(crate) fn new(endpoint: Endpoint, client: EndpointClient) -> Self {
        let authority = Authority::try_from(endpoint.addr.to_string().as_str())
            .unwrap_or_else(|_| Authority::from_static("invalid"));
        let label = endpoint
            .name
            .as_deref()
            .map_or_else(|| endpoint.addr.to_string(), str::to_owned);
        Self {
            endpoint,
            client,
            authority,
            label,

            in_flight: AtomicU32::new(0),
            failure_bits: AtomicU64::new(0),
            failure_at_ms: AtomicU64::new(0),
            consecutive_failures: AtomicU32::new(0),
            ejected_until_ms: AtomicU64::new(0),
            ejections: AtomicU64::new(0),
            timers: TimerPool::default(),
        }
    }

    /// Attempts currently waiting on this endpoint.
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Marks an attempt started; the guard marks it ended.
    pub(crate) fn start(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    /// The share of recent attempts that failed (a retryable status, a
    /// transport error, a timeout), weighted toward the latest and decaying
    /// toward 0 with time: 0 for an endpoint with no recent failures.
    pub(crate) fn failure_estimate(&self) -> f64 {
        let bits = self.failure_bits.load(Ordering::Relaxed);
        if bits == 0 {
            return 0.0;
        }
        let age = clock::now_ms().saturating_sub(self.failure_at_ms.load(Ordering::Relaxed));
        let estimate = f64::from_bits(bits) * (-(age as f64) / FAILURE_HALF_LIFE_MS).exp2();
        if estimate < NEGLIGIBLE_FAILURE {
            0.0
        } else {
            estimate
        }
    }

    /// Feeds one attempt's outcome into the failure estimate. Concurrent
    /// updates may lose one another; the estimate only steers choice.
    pub(crate) fn record_outcome(&self, failed: bool) {
        if !failed && self.failure_bits.load(Ordering::Relaxed) == 0 {
            return; // the common case: nothing to decay, no shared write
        }
        let current = self.failure_estimate();
        let target = if failed { 1.0 } else { 0.0 };
        let next = current + FAILURE_WEIGHT * (target - current);
        // 0 (not a tiny value) keeps the fast path above.
        let next = if next < NEGLIGIBLE_FAILURE { 0.0 } else { next };
        self.failure_at_ms.store(clock::now_ms(), Ordering::Relaxed);
        self.failure_bits.store(next.to_bits(), Ordering::Relaxed);
    }

    /// What sending one more attempt here is expected to cost: attempts in
    /// flight (including this one) divided by the squared success estimate,
    /// so an endpoint failing half its attempts counts four times as loaded.
    pub(crate) fn cost(&self) -> f64 {
        let success = (1.0 - self.failure_estimate()).max(MIN_SUCCESS);
        f64::from(self.in_flight() + 1) / (success * success)
    }

    /// True while passive health has this endpoint ejected.
    pub(crate) fn is_ejected(&self) -> bool {
        // 0: never ejected, and no clock read (the picker asks twice a request).
        let until = self.ejected_until_ms.load(Ordering::Relaxed);
        until != 0 && until > clock::now_ms()
    }

    /// Times this endpoint has been ejected.
    pub(crate) fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// Records a success: the consecutive-failure count restarts.
    pub(crate) fn record_success(&self) {
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }

    /// Records a transport failure or mid-stream error; ejects the endpoint when the
    /// consecutive count reaches the threshold. Returns true when this call ejected it.
    pub(crate) fn record_failure(&self, health: &PassiveHealth) -> bool {
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if health.consecutive_failures == 0 || n < health.consecutive_failures {
            return false;
        }
        self.consecutive_failures.store(0, Ordering::Relaxed);
        let until =
            clock::now_ms() + u64::try_from(health.ejection.as_millis()).unwrap_or(u64::MAX / 2);
        self.ejected_until_ms.store(until, Ordering::Relaxed);
        self.ejections.fetch_add(1, Ordering::Relaxed);
        true
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn state() -> EndpointState {
        let addr: std::net::SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let client = crate::balance::client::endpoint_client(
            addr,
            reprise_crds::Protocol::Http1,
            Duration::from_secs(1),
            None,
        );
        EndpointState::new(
            Endpoint {
                addr,
                name: None,
                zone: None,
            },
            client,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn the_failure_estimate_moves_a_quarter_per_outcome_and_halves_every_second() {
        let e = state();
        assert_eq!(e.failure_estimate(), 0.0);
        assert_eq!(e.cost(), 1.0);
        e.record_outcome(true);
        assert!((e.failure_estimate() - 0.25).abs() < 1e-9);
        e.record_outcome(true);
        assert!((e.failure_estimate() - 0.4375).abs() < 1e-9);
        e.record_outcome(false);
        let after_success = 0.4375 * 0.75;
        assert!((e.failure_estimate() - after_success).abs() < 1e-9);
        // cost = (in flight + 1) / success²
        let success: f64 = 1.0 - after_success;
        assert!((e.cost() - 1.0 / (success * success)).abs() < 1e-9);

        tokio::time::advance(Duration::from_secs(1)).await;
        assert!((e.failure_estimate() - after_success / 2.0).abs() < 1e-6);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!((e.failure_estimate() - after_success / 4.0).abs() < 1e-6);
        // Then it reads as 0, so the endpoint is an equal choice again.
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(e.failure_estimate(), 0.0);
        assert_eq!(e.cost(), 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn successes_bring_the_estimate_back_to_exactly_zero() {
        let e = state();
        e.record_outcome(true);
        for _ in 0..40 {
            e.record_outcome(false);
        }
        assert_eq!(e.failure_estimate(), 0.0);
        assert_eq!(e.cost(), 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_endpoint_failing_everything_still_has_a_finite_cost() {
        let e = state();
        (0..100).for_each(|_| e.record_outcome(true));
        assert!(e.cost().is_finite());
        assert!(e.cost() <= 1.0 / (MIN_SUCCESS * MIN_SUCCESS) + 1e-9);
    }
}
