//! Chooses the endpoint for each attempt: power of two choices on a cost that
//! combines in-flight attempts with recent failures, among endpoints this
//! request has not tried and passive health has not ejected.

use std::sync::Arc;

use rand::Rng;

use crate::endpoint::EndpointState;

/// Most attempts one request can make: 10 retries, the first attempt and a hedge.
pub const MAX_TRIED: usize = 12;

/// Endpoints one request has tried, by index, without allocating.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tried {
    len: usize,
    idx: [usize; MAX_TRIED],
}

/// Picks endpoints for one upstream.
#[derive(Debug)]
pub struct EndpointPicker;

impl Tried {
    /// Records that `i` was tried.
    pub fn insert(&mut self, i: usize) {
        if !self.contains(i) && self.len < MAX_TRIED {
            self.idx[self.len] = i;
            self.len += 1;
        }
    }

    /// True when `i` was tried.
    pub fn contains(&self, i: usize) -> bool {
        self.idx[..self.len].contains(&i)
    }

    /// Indexes tried, in order.
    pub fn as_slice(&self) -> &[usize] {
        &self.idx[..self.len]
    }
}

impl EndpointPicker {
    /// Picks an endpoint index, or `None` when no endpoint is left.
    ///
    /// Preference: untried and healthy; then untried even if ejected (every
    /// endpoint ejected must not mean no traffic at all); then, only when
    /// `allow_reuse`, a tried one.
    pub fn pick(
        endpoints: &[Arc<EndpointState>],
        tried: &Tried,
        allow_reuse: bool,
    ) -> Option<usize> {
        let untried_healthy = |i: usize, e: &EndpointState| !tried.contains(i) && !e.is_ejected();
        let untried = |i: usize, _: &EndpointState| !tried.contains(i);
        let any = |_: usize, _: &EndpointState| true;
        Self::p2c(endpoints, untried_healthy)
            .or_else(|| Self::p2c(endpoints, untried))
            .or_else(|| {
                if allow_reuse {
                    Self::p2c(endpoints, any)
                } else {
                    None
                }
            })
    }

    /// True when an endpoint other than those tried exists.
    pub fn has_alternate(endpoints: &[Arc<EndpointState>], tried: &Tried) -> bool {
        (0..endpoints.len()).any(|i| !tried.contains(i))
    }

    fn p2c(
        endpoints: &[Arc<EndpointState>],
        eligible: impl Fn(usize, &EndpointState) -> bool,
    ) -> Option<usize> {
        let n = endpoints
            .iter()
            .enumerate()
            .filter(|(i, e)| eligible(*i, e))
            .count();
        let nth = |k: usize| {
            endpoints
                .iter()
                .enumerate()
                .filter(|(i, e)| eligible(*i, e))
                .nth(k)
                .map(|(i, _)| i)
        };
        match n {
            0 => None,
            1 => nth(0),
            _ => {
                let mut rng = rand::rng();
                let a = rng.random_range(0..n);
                let mut b = rng.random_range(0..n - 1);
                if b >= a {
                    b += 1;
                }
                let (a, b) = (nth(a)?, nth(b)?);
                if endpoints[b].cost() < endpoints[a].cost() {
                    Some(b)
                } else {
                    Some(a)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use reprise_crds::{Endpoint, PassiveHealth};

    use super::*;

    fn endpoints(n: u16) -> Vec<Arc<EndpointState>> {
        (1..=n)
            .map(|p| {
                let addr: std::net::SocketAddr = format!("127.0.0.1:{p}").parse().expect("addr");
                let client = crate::upstream::endpoint_client(
                    addr,
                    reprise_crds::Protocol::Http1,
                    Duration::from_secs(1),
                );
                Arc::new(EndpointState::new(
                    Endpoint {
                        addr,
                        name: None,
                        zone: None,
                    },
                    client,
                ))
            })
            .collect()
    }

    #[test]
    fn never_picks_a_tried_endpoint_unless_reuse_is_allowed() {
        let eps = endpoints(3);
        let mut tried = Tried::default();
        for _ in 0..3 {
            let i = EndpointPicker::pick(&eps, &tried, false).expect("one left");
            assert!(!tried.contains(i));
            tried.insert(i);
        }
        assert_eq!(EndpointPicker::pick(&eps, &tried, false), None);
        assert!(EndpointPicker::pick(&eps, &tried, true).is_some());
        assert!(!EndpointPicker::has_alternate(&eps, &tried));
    }

    #[test]
    fn prefers_the_less_loaded_of_two() {
        let eps = endpoints(2);
        let _busy: Vec<_> = (0..5).map(|_| eps[0].start()).collect();
        for _ in 0..50 {
            assert_eq!(
                EndpointPicker::pick(&eps, &Tried::default(), false),
                Some(1)
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_endpoint_that_fails_gets_less_traffic_until_its_failures_age() {
        let eps = endpoints(3);
        // Warm the clock so "now" is past its origin.
        tokio::time::advance(Duration::from_millis(10)).await;
        let count = |eps: &[Arc<EndpointState>]| {
            let mut n = [0usize; 3];
            for _ in 0..600 {
                n[EndpointPicker::pick(eps, &Tried::default(), false).expect("some")] += 1;
            }
            n
        };
        let even = count(&eps);
        assert!(
            even.iter().all(|&n| n > 120),
            "no failures: spread evenly, got {even:?}"
        );

        eps[2].record_outcome(true);
        eps[2].record_outcome(false);
        eps[2].record_outcome(true);
        let shifted = count(&eps);
        assert_eq!(
            shifted[2], 0,
            "idle peers beat a failing endpoint: {shifted:?}"
        );

        // A busy healthy endpoint can still lose to one that fails now and then.
        let _busy: Vec<_> = (0..4).map(|_| eps[0].start()).collect();
        let mut tried = Tried::default();
        tried.insert(1);
        assert_eq!(EndpointPicker::pick(&eps, &tried, false), Some(2));
        drop(_busy);

        // Once the failures have aged (one half-life a second) traffic evens out again.
        tokio::time::advance(Duration::from_secs(6)).await;
        let recovered = count(&eps);
        assert!(recovered[2] > 120, "recovered: {recovered:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn when_every_endpoint_fails_alike_load_decides() {
        let eps = endpoints(3);
        for e in &eps {
            (0..20).for_each(|_| e.record_outcome(true));
        }
        let _busy: Vec<_> = (0..3).map(|_| eps[1].start()).collect();
        let mut n = [0usize; 3];
        for _ in 0..600 {
            n[EndpointPicker::pick(&eps, &Tried::default(), false).expect("some")] += 1;
        }
        assert!(n[0] > 150 && n[2] > 150, "{n:?}");
        assert!(n[1] < n[0] / 2, "the loaded one is picked less: {n:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn ejected_endpoints_are_avoided_until_nothing_else_is_left() {
        let eps = endpoints(2);
        let health = PassiveHealth {
            consecutive_failures: 2,
            ejection: Duration::from_secs(30),
        };
        assert!(!eps[0].record_failure(&health));
        assert!(eps[0].record_failure(&health));
        for _ in 0..50 {
            assert_eq!(
                EndpointPicker::pick(&eps, &Tried::default(), false),
                Some(1)
            );
        }
        let mut tried = Tried::default();
        tried.insert(1);
        assert_eq!(
            EndpointPicker::pick(&eps, &tried, false),
            Some(0),
            "ejected beats nothing"
        );
        tokio::time::advance(Duration::from_secs(31)).await;
        assert!(!eps[0].is_ejected());
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let eps = endpoints(1);
        let health = PassiveHealth {
            consecutive_failures: 2,
            ejection: Duration::from_secs(30),
        };
        assert!(!eps[0].record_failure(&health));
        eps[0].record_success();
        assert!(!eps[0].record_failure(&health));
        assert!(!eps[0].is_ejected());
    }
}
