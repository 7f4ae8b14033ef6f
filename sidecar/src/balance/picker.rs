//! Chooses the endpoint for each attempt: power of two choices on a cost that
//! combines in-flight attempts with recent failures, among endpoints this
//! request has not tried and passive health has not ejected.

use std::sync::Arc;

use super::endpoint::EndpointState;
use crate::exchange::report::Tried;
use crate::random::Random;

/// Picks an endpoint index, or `None` when no endpoint is left.
///
/// Preference: untried and healthy; then untried even if ejected (every
/// endpoint ejected must not mean no traffic at all); then, only when
/// `allow_reuse`, a tried one.
pub(crate) fn pick(
    endpoints: &[Arc<EndpointState>],
    tried: &Tried,
    allow_reuse: bool,
    random: &mut dyn Random,
) -> Option<usize> {
    let untried_healthy = |i: usize, e: &EndpointState| !tried.contains(i) && !e.is_ejected();
    let untried = |i: usize, _: &EndpointState| !tried.contains(i);
    let any = |_: usize, _: &EndpointState| true;
    p2c(endpoints, untried_healthy, random)
        .or_else(|| p2c(endpoints, untried, random))
        .or_else(|| allow_reuse.then(|| p2c(endpoints, any, random)).flatten())
}

/// Two distinct eligible endpoints drawn at random; the cheaper wins (the
/// first drawn on a tie).
fn p2c(
    endpoints: &[Arc<EndpointState>],
    eligible: impl Fn(usize, &EndpointState) -> bool,
    random: &mut dyn Random,
) -> Option<usize> {
    let n = endpoints
        .iter()
        .enumerate()
        .filter(|(i, e)| eligible(*i, e))
        .count();
    let nth = |k: u64| {
        endpoints
            .iter()
            .enumerate()
            .filter(|(i, e)| eligible(*i, e))
            .nth(usize::try_from(k).unwrap_or(usize::MAX))
            .map(|(i, _)| i)
    };
    match n {
        0 => None,
        1 => nth(0),
        _ => {
            let n = n as u64;
            let a = random.up_to(n - 1);
            let mut b = random.up_to(n - 2);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use reprise_crds::{Endpoint, PassiveHealth};

    use super::*;
    use crate::random::scripted::Scripted;
    use crate::random::ThreadRandom;

    fn endpoints(n: u16) -> Vec<Arc<EndpointState>> {
        (1..=n)
            .map(|p| {
                let addr: std::net::SocketAddr = format!("127.0.0.1:{p}").parse().expect("addr");
                let client = crate::balance::client::endpoint_client(
                    addr,
                    reprise_crds::Protocol::Http1,
                    Duration::from_secs(1),
                    None,
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

    /// What P2C picks when the draw is the pair (a, b) of eligible positions.
    fn pick_pair(eps: &[Arc<EndpointState>], tried: &Tried, a: u64, b: u64) -> Option<usize> {
        // The second draw indexes the eligible endpoints without `a`.
        let second = if b > a { b - 1 } else { b };
        pick(eps, tried, false, &mut Scripted::new(&[a, second]))
    }

    /// Every ordered pair of the first three endpoints and what it picks.
    fn picks(eps: &[Arc<EndpointState>]) -> Vec<((u64, u64), usize)> {
        let mut out = Vec::new();
        for a in 0..3 {
            for b in (0..3).filter(|b| *b != a) {
                out.push((
                    (a, b),
                    pick_pair(eps, &Tried::default(), a, b).expect("some"),
                ));
            }
        }
        out
    }

    #[test]
    fn never_picks_a_tried_endpoint_unless_reuse_is_allowed() {
        let eps = endpoints(3);
        let mut tried = Tried::default();
        for _ in 0..3 {
            let i = pick(&eps, &tried, false, &mut ThreadRandom).expect("one left");
            assert!(!tried.contains(i));
            tried.insert(i);
        }
        assert_eq!(pick(&eps, &tried, false, &mut ThreadRandom), None);
        assert!(pick(&eps, &tried, true, &mut ThreadRandom).is_some());
    }

    #[test]
    fn the_draws_name_the_pair_and_the_first_wins_a_tie() {
        let eps = endpoints(3);
        for ((a, b), picked) in picks(&eps) {
            assert_eq!(picked as u64, a, "pair ({a}, {b}) at equal cost");
        }
    }

    #[test]
    fn prefers_the_less_loaded_of_two() {
        let eps = endpoints(2);
        let _busy: Vec<_> = (0..5).map(|_| eps[0].start()).collect();
        assert_eq!(pick_pair(&eps, &Tried::default(), 0, 1), Some(1));
        assert_eq!(pick_pair(&eps, &Tried::default(), 1, 0), Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn an_endpoint_that_fails_gets_less_traffic_until_its_failures_age() {
        let eps = endpoints(3);
        // Warm the clock so "now" is past its origin.
        tokio::time::advance(Duration::from_millis(10)).await;
        eps[2].record_outcome(true);
        eps[2].record_outcome(false);
        eps[2].record_outcome(true);
        for ((a, b), picked) in picks(&eps) {
            if a == 2 || b == 2 {
                assert_ne!(
                    picked, 2,
                    "pair ({a}, {b}): an idle peer beats a failing one"
                );
            }
        }

        // A busy healthy endpoint can still lose to one that fails now and then.
        let busy: Vec<_> = (0..4).map(|_| eps[0].start()).collect();
        let mut tried = Tried::default();
        tried.insert(1);
        assert_eq!(pick_pair(&eps, &tried, 0, 1), Some(2));
        drop(busy);

        // Once the failures have aged (one half-life a second) it is an equal choice again.
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(eps[2].failure_estimate(), 0.0);
        assert_eq!(pick_pair(&eps, &Tried::default(), 2, 0), Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn when_every_endpoint_fails_alike_load_decides() {
        let eps = endpoints(3);
        for e in &eps {
            (0..20).for_each(|_| e.record_outcome(true));
        }
        let _busy: Vec<_> = (0..3).map(|_| eps[1].start()).collect();
        for ((a, b), picked) in picks(&eps) {
            if a == 1 || b == 1 {
                assert_ne!(picked, 1, "pair ({a}, {b}): the loaded one loses");
            } else {
                assert_eq!(picked as u64, a, "pair ({a}, {b}): a tie");
            }
        }
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
        // Only endpoint 1 is eligible, whatever the draws.
        assert_eq!(pick_pair(&eps, &Tried::default(), 0, 1), Some(1));
        assert_eq!(
            pick(&eps, &Tried::default(), false, &mut ThreadRandom),
            Some(1)
        );
        let mut tried = Tried::default();
        tried.insert(1);
        assert_eq!(
            pick(&eps, &tried, false, &mut ThreadRandom),
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
