//! The gates: whether, when and where one more attempt goes.
//!
//! A failed attempt passes them in order: up-front skip, policy, the
//! failure's kind, failure boundary, body, attempt cap, alternate endpoint,
//! budget room, backoff (or `Retry-After`), deadline, budget charge. A slow
//! attempt under hedging passes the same gates from the attempt cap on, with
//! no backoff (its delay has already elapsed), never back to a tried
//! endpoint, and only with its delay still left before the deadline. The first gate that says no decides the outcome; the budget is
//! charged only by the last, so a retry the deadline refuses costs nothing.
//!
//! The decision reads the request's state, the upstream's budget and endpoint
//! health; the only thing it changes is the budget charge on `Go`.

use std::time::Duration;

use reprise_crds::FailureBoundary;
use tokio::time::Instant;

use super::attempt::UpstreamBody;
use super::backoff::full_jitter;
use super::failure::{Failure, Wait};
use super::{BodySource, RetryState};
use crate::balance::picker;
use crate::exchange::failure::{FailureKind, Stage};
use crate::exchange::outcome::{ExhaustedBy, Outcome, SkipReason};
use crate::random::Random;

/// What asks for another attempt.
#[derive(Debug)]
pub(crate) enum Trigger<'f> {
    /// An attempt failed.
    Failed(&'f Failure<UpstreamBody>),
    /// An attempt has waited the hedge delay without response headers.
    Slow,
}

/// The gates' answer.
#[derive(Debug, PartialEq)]
pub(crate) enum Decision {
    /// Send another attempt to `endpoint` after `delay` (the budget is charged).
    Go {
        /// The sleep before it.
        delay: Duration,
        /// Where it goes.
        endpoint: usize,
    },
    /// No more attempts: the request ends with this outcome.
    Stop(Outcome),
}

/// Runs the gates for `trigger`.
pub(crate) fn decide(
    trigger: Trigger<'_>,
    state: &RetryState<'_>,
    body: &BodySource,
    random: &mut dyn Random,
) -> Decision {
    use Decision::Stop;
    if let Some(reason) = state.plan.skip {
        return Stop(Outcome::Skipped(reason));
    }
    let Some(p) = state.enabled_policy() else {
        return Stop(Outcome::Skipped(SkipReason::RetriesOff));
    };
    let failure = match trigger {
        Trigger::Failed(f) => Some(f),
        Trigger::Slow => None,
    };
    if let Some(f) = failure {
        match f.kind {
            // Another endpoint would fail the same way: the sidecar itself
            // ran out of descriptors or memory.
            // A certificate that failed validation is never retried: another
            // attempt would only hide it (the rules document).
            FailureKind::RequestBodyError
            | FailureKind::LocalResources
            | FailureKind::TlsCertificate(_) => {
                return Stop(Outcome::Skipped(SkipReason::NotRetryable))
            }
            FailureKind::DeadlineExceeded => {
                return Stop(Outcome::Exhausted(ExhaustedBy::Deadline))
            }
            _ => {}
        }
        if f.stage != Stage::Response {
            if !p.retry_transport {
                return Stop(Outcome::Skipped(SkipReason::TransportOff));
            }
            if f.stage == Stage::AfterWrite && p.failure_boundary == FailureBoundary::Connect {
                return Stop(Outcome::Skipped(SkipReason::FailureBoundary));
            }
        }
        if !body.is_replayable() {
            return Stop(Outcome::Skipped(SkipReason::BodyConsumed));
        }
    }
    if state.retries >= p.max_retries {
        return Stop(Outcome::Exhausted(ExhaustedBy::Attempts));
    }
    // A hedge runs beside the attempt it duplicates: it never goes back to a tried endpoint.
    let reuse = failure.is_some() && p.reuse_endpoints;
    let up = state.up;
    let Some(endpoint) = picker::pick(&up.endpoints, &state.report.tried, reuse, random) else {
        return Stop(Outcome::Exhausted(ExhaustedBy::NoAlternate));
    };
    if !up.budget.has_room() {
        return Stop(Outcome::Exhausted(ExhaustedBy::Budget));
    }
    let delay = match failure.map(|f| f.wait) {
        None => Duration::ZERO,
        Some(Wait::Refused) => return Stop(Outcome::Skipped(SkipReason::Pushback)),
        Some(Wait::For(wait)) if wait > p.retry_after_max => {
            return Stop(Outcome::Exhausted(ExhaustedBy::RetryAfterTooLong))
        }
        Some(Wait::For(wait)) => wait,
        Some(Wait::Backoff) => full_jitter(p.nominal_backoff(state.retries + 1), random),
    };
    if let Some(deadline) = state.deadline {
        // An attempt that would start at or after the deadline is not made,
        // and not charged. A hedge needs its own delay left at least: with
        // less it cannot answer before the attempt it duplicates has had as
        // long as it waited so far.
        let needed = match failure {
            Some(_) => delay,
            None => p.hedge_delay.unwrap_or_default(),
        };
        if Instant::now() + needed >= deadline {
            return Stop(Outcome::Exhausted(ExhaustedBy::Deadline));
        }
    }
    if !up.budget.try_withdraw() {
        return Stop(Outcome::Exhausted(ExhaustedBy::Budget));
    }
    Decision::Go { delay, endpoint }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use reprise_crds::file::{HedgeSpec, RetriesSpec};

    use super::*;
    use crate::exchange::body::replay::ReplayBody;
    use crate::random::scripted::Scripted;
    use crate::retry::testing::upstream;
    use crate::retry::{Plan, RetryState};

    fn failure(kind: FailureKind, stage: Stage, retry_after: Option<u64>) -> Failure<UpstreamBody> {
        Failure {
            kind,
            stage,
            response: None,
            wait: retry_after.map_or(Wait::Backoff, |ms| Wait::For(Duration::from_millis(ms))),
        }
    }

    fn empty_body() -> BodySource {
        BodySource::Replay(ReplayBody::Buffered {
            data: Bytes::new(),
            trailers: None,
            _reserved: None,
        })
    }

    /// The retries block every row starts from: two retries, 10% budget,
    /// failures after writing outside the boundary.
    fn base() -> RetriesSpec {
        RetriesSpec {
            attempts: Some(2),
            budget_percent: Some(10.0),
            failure_boundary: Some(FailureBoundary::Connect),
            ..RetriesSpec::default()
        }
    }

    /// One row: the situation and what the gates must answer.
    struct Row {
        name: &'static str,
        retries: RetriesSpec,
        /// Requests counted by the budget before the decision.
        requests: u32,
        skip: Option<SkipReason>,
        trigger: Option<(FailureKind, Stage, Option<u64>)>,
        direct_body: bool,
        retries_sent: u32,
        tried: &'static [usize],
        want: Result<u64, Outcome>,
    }

    fn row(name: &'static str) -> Row {
        Row {
            name,
            retries: base(),
            requests: 10,
            skip: None,
            trigger: Some((FailureKind::UpstreamStatus(503), Stage::Response, None)),
            direct_body: false,
            retries_sent: 0,
            tried: &[0],
            want: Ok(0),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn gates_in_order() {
        use ExhaustedBy::*;
        use SkipReason::*;
        let reset = (FailureKind::ConnectionReset, Stage::AfterWrite, None);
        let refused = (FailureKind::ConnectRefused, Stage::Connect, None);
        let rows = [
            // With every draw scripted to 0, the jitter is 0.
            Row {
                ..row("a 503 within budget is retried")
            },
            Row {
                requests: 9,
                want: Err(Outcome::Exhausted(Budget)),
                ..row("9 requests do not allow a 10% retry")
            },
            Row {
                retries_sent: 2,
                want: Err(Outcome::Exhausted(Attempts)),
                ..row("attempt cap")
            },
            Row {
                tried: &[0, 1, 2],
                want: Err(Outcome::Exhausted(NoAlternate)),
                ..row("no endpoint left untried")
            },
            Row {
                tried: &[0, 1, 2],
                retries: RetriesSpec {
                    reuse_endpoints: Some(true),
                    ..base()
                },
                ..row("reuse allowed when none is left")
            },
            Row {
                trigger: Some(reset),
                want: Err(Outcome::Skipped(FailureBoundary)),
                ..row("a reset after writing is outside `connect`")
            },
            Row {
                trigger: Some(refused),
                ..row("a refused connect is inside `connect`")
            },
            Row {
                trigger: Some(refused),
                retries: RetriesSpec {
                    retry_transport: Some(false),
                    ..base()
                },
                want: Err(Outcome::Skipped(TransportOff)),
                ..row("transport retries off")
            },
            Row {
                trigger: Some(refused),
                direct_body: true,
                want: Err(Outcome::Skipped(BodyConsumed)),
                ..row("a streamed body cannot be replayed")
            },
            Row {
                trigger: Some((FailureKind::RequestBodyError, Stage::AfterWrite, None)),
                want: Err(Outcome::Skipped(NotRetryable)),
                ..row("the client's own body failing is never retried")
            },
            Row {
                trigger: Some((FailureKind::LocalResources, Stage::Connect, None)),
                want: Err(Outcome::Skipped(NotRetryable)),
                ..row("the sidecar out of descriptors is not retried elsewhere")
            },
            Row {
                trigger: Some((
                    FailureKind::TlsCertificate(
                        crate::exchange::failure::CertificateError::UnknownIssuer,
                    ),
                    Stage::Connect,
                    None,
                )),
                want: Err(Outcome::Skipped(NotRetryable)),
                ..row("a certificate that failed validation is never retried")
            },
            Row {
                trigger: Some((FailureKind::TlsHandshake, Stage::Connect, None)),
                ..row("a failed handshake is retried like a refused connect")
            },
            Row {
                trigger: Some((FailureKind::DeadlineExceeded, Stage::AfterWrite, None)),
                want: Err(Outcome::Exhausted(Deadline)),
                ..row("an attempt cut by the deadline ends the retries")
            },
            Row {
                skip: Some(Method),
                want: Err(Outcome::Skipped(Method)),
                ..row("a reason known up front wins")
            },
            Row {
                retries: RetriesSpec {
                    attempts: Some(0),
                    ..base()
                },
                want: Err(Outcome::Skipped(RetriesOff)),
                ..row("no retries configured")
            },
            Row {
                trigger: Some((
                    FailureKind::UpstreamStatus(503),
                    Stage::Response,
                    Some(1500),
                )),
                want: Ok(1500),
                ..row("Retry-After is the delay")
            },
            Row {
                trigger: Some((
                    FailureKind::UpstreamStatus(503),
                    Stage::Response,
                    Some(30_001),
                )),
                want: Err(Outcome::Exhausted(RetryAfterTooLong)),
                ..row("Retry-After over retry_after_max ends the retries")
            },
            Row {
                trigger: Some((
                    FailureKind::UpstreamStatus(503),
                    Stage::Response,
                    Some(10_000),
                )),
                retries: RetriesSpec {
                    total_deadline_ms: Some(10_000),
                    ..base()
                },
                want: Err(Outcome::Exhausted(Deadline)),
                ..row("a retry that would start at the deadline")
            },
            Row {
                trigger: None,
                retries: RetriesSpec {
                    hedge: Some(HedgeSpec::Delay { delay_ms: 100 }),
                    ..base()
                },
                ..row("a hedge: no backoff")
            },
            Row {
                trigger: None,
                retries: RetriesSpec {
                    hedge: Some(HedgeSpec::Delay { delay_ms: 100 }),
                    total_deadline_ms: Some(100),
                    ..base()
                },
                want: Err(Outcome::Exhausted(Deadline)),
                ..row("no hedge with less than its delay left")
            },
            Row {
                trigger: None,
                retries: RetriesSpec {
                    hedge: Some(HedgeSpec::Delay { delay_ms: 100 }),
                    total_deadline_ms: Some(101),
                    ..base()
                },
                ..row("a hedge with its delay left")
            },
            Row {
                trigger: None,
                tried: &[0, 1, 2],
                retries: RetriesSpec {
                    reuse_endpoints: Some(true),
                    ..base()
                },
                want: Err(Outcome::Exhausted(NoAlternate)),
                ..row("a hedge never goes back to a tried endpoint")
            },
            Row {
                trigger: None,
                requests: 9,
                want: Err(Outcome::Exhausted(Budget)),
                ..row("a hedge needs budget like a retry")
            },
            Row {
                trigger: None,
                retries_sent: 2,
                want: Err(Outcome::Exhausted(Attempts)),
                ..row("a hedge counts as a retry")
            },
        ];
        for r in rows {
            let up = upstream(r.retries);
            (0..r.requests).for_each(|_| up.budget.record_request());
            let plan = Plan {
                policy: Some(&up.config.retries),
                skip: r.skip,
            };
            let mut state = RetryState::new(&up, plan, Instant::now);
            state.retries = r.retries_sent;
            r.tried.iter().for_each(|i| state.report.tried.insert(*i));
            let body = if r.direct_body {
                BodySource::Direct(None)
            } else {
                empty_body()
            };
            let f = r
                .trigger
                .map(|(kind, stage, after)| failure(kind, stage, after));
            let trigger = match &f {
                Some(f) => Trigger::Failed(f),
                None => Trigger::Slow,
            };
            let before = up.budget.totals().1;
            let got = decide(trigger, &state, &body, &mut Scripted::new(&[0; 8]));
            let charged = up.budget.totals().1 - before;
            match (got, r.want) {
                (Decision::Go { delay, endpoint }, Ok(ms)) => {
                    assert_eq!(delay, Duration::from_millis(ms), "{}", r.name);
                    assert!(
                        !state.report.tried.contains(endpoint) || r.tried.len() == 3,
                        "{}: went back to {endpoint}",
                        r.name
                    );
                    assert_eq!(charged, 1, "{}: a retry is charged", r.name);
                }
                (Decision::Stop(got), Err(want)) => {
                    assert_eq!(got, want, "{}", r.name);
                    assert_eq!(charged, 0, "{}: a refused retry is not charged", r.name);
                }
                (got, want) => panic!("{}: got {got:?}, want {want:?}", r.name),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_is_full_jitter_under_the_exponential_nominal() {
        let up = upstream(RetriesSpec {
            attempts: Some(10),
            backoff_base_ms: Some(100),
            backoff_cap_ms: Some(400),
            budget_percent: Some(100.0),
            budget_min_retries_per_second: Some(100_000),
            ..RetriesSpec::default()
        });
        let f = failure(FailureKind::UpstreamStatus(503), Stage::Response, None);
        let plan = Plan {
            policy: Some(&up.config.retries),
            skip: None,
        };
        for (retries, nominal_ms) in [(0u32, 100u64), (1, 200), (2, 400), (3, 400), (9, 400)] {
            let mut state = RetryState::new(&up, plan, Instant::now);
            state.retries = retries;
            state.report.tried.insert(0);
            // Draws: the endpoint pair, then the jitter.
            for (jitter, want) in [
                (0, 0),
                (u64::MAX, nominal_ms * 1_000_000),
                (nominal_ms * 250_000, nominal_ms * 250_000),
            ] {
                let got = decide(
                    Trigger::Failed(&f),
                    &state,
                    &empty_body(),
                    &mut Scripted::new(&[0, 0, jitter]),
                );
                let Decision::Go { delay, .. } = got else {
                    panic!("retry {}: {got:?}", retries + 1);
                };
                assert_eq!(delay, Duration::from_nanos(want), "retry {}", retries + 1);
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_crossing_the_deadline_is_refused_and_not_charged() {
        let up = upstream(RetriesSpec {
            attempts: Some(3),
            budget_percent: Some(100.0),
            total_deadline_ms: Some(300),
            ..RetriesSpec::default()
        });
        up.budget.record_request();
        let plan = Plan {
            policy: Some(&up.config.retries),
            skip: None,
        };
        let mut state = RetryState::new(&up, plan, Instant::now);
        state.report.tried.insert(0);
        tokio::time::advance(Duration::from_millis(250)).await;
        let slow = failure(FailureKind::UpstreamStatus(503), Stage::Response, Some(100));
        assert_eq!(
            decide(
                Trigger::Failed(&slow),
                &state,
                &empty_body(),
                &mut Scripted::default()
            ),
            Decision::Stop(Outcome::Exhausted(ExhaustedBy::Deadline))
        );
        assert_eq!(up.budget.totals(), (1, 0), "not charged");
        let quick = failure(FailureKind::UpstreamStatus(503), Stage::Response, Some(10));
        let got = decide(
            Trigger::Failed(&quick),
            &state,
            &empty_body(),
            &mut Scripted::default(),
        );
        assert!(
            matches!(got, Decision::Go { delay, .. } if delay == Duration::from_millis(10)),
            "{got:?}"
        );
        assert_eq!(
            up.budget.totals(),
            (2, 1),
            "charged once the retry is certain, as a retry and a request"
        );
    }
}
