//! The retry engine: one logical request's attempts, from the first to the
//! final answer.
//!
//! The contract (`docs/src/concepts/retries.md`): every failed attempt,
//! and a slow one when hedging is on, passes the same gates in order
//! ([`gate`]); the first that says no ends the retries and the client gets the
//! last response unchanged, or a local answer naming the failure. All of it
//! happens before response headers reach the client: a retryable response is
//! dropped unseen. The budget is charged only once a retry is certain, so a
//! deadline-aborted retry costs nothing.
//!
//! The pieces, in the order a request meets them: [`attempt`] builds and
//! sends one attempt; [`verdict`] classifies its result (pure) and observes it
//! in one step (passive health, spans, metrics); [`gate`] decides whether and
//! when to go again; [`hedge`] races a speculative duplicate; [`backoff`],
//! [`budget`] and [`failure`] are the parts the gates read. [`upstream`]
//! composes one upstream's endpoints with its budget and metrics. The
//! bodies, failure kinds, outcomes and report the loop speaks in are the
//! crate's vocabulary (`exchange`).

pub(crate) mod attempt;
pub(crate) mod backoff;
pub(crate) mod budget;
pub(crate) mod failure;
mod gate;
mod hedge;
pub(crate) mod upstream;
pub(crate) mod verdict;

use std::time::Duration;

use http::Response;
use reprise_crds::RetryPolicy;
use tokio::time::Instant;

use self::attempt::{KeptFields, RequestTemplate, UpstreamBody};
pub use self::backoff::full_jitter;
pub use self::failure::{retry_after, retry_after_at, RETRY_AFTER_MAX_SECS};
use self::gate::{Decision, Trigger};
use self::upstream::UpstreamState;
use self::verdict::Verdict;
use crate::balance::picker;
use crate::exchange::body::replay::{AttemptBody, ReplayBody};
use crate::exchange::body::ClientBody;
use crate::exchange::deadline::{Hops, Stop as DeadlineStop};
pub use crate::exchange::failure::FailureKind;
use crate::exchange::outcome::{ExhaustedBy, Outcome, SkipReason};
use crate::exchange::report::{Report, Tried};
use crate::exchange::request::RequestHead;
use crate::observe::spans::RequestSpan;
pub use crate::random::{Random, ThreadRandom};

/// Where the request body comes from.
#[derive(Debug)]
pub(crate) enum BodySource {
    /// The client's body, sent once as it streams.
    Direct(Option<ClientBody>),
    /// A body prepared for replay.
    Replay(ReplayBody),
}

/// What the loop may do for this request, as the admit phase decided.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan<'a> {
    /// The policy, when one applies.
    pub(crate) policy: Option<&'a RetryPolicy>,
    /// Set when a failure must not be retried for a reason known up front
    /// (no policy, method not retried, upgrade).
    pub(crate) skip: Option<SkipReason>,
}

/// How the request ended.
#[derive(Debug)]
pub(crate) enum Final {
    /// An upstream response to pass on, from endpoint `endpoint`.
    Upstream {
        /// The response.
        response: Response<UpstreamBody>,
        /// Index of the endpoint that sent it.
        endpoint: usize,
    },
    /// No usable response: the sidecar answers for this failure.
    Local(FailureKind),
    /// The upstream has no endpoints.
    NoEndpoint,
}

/// Where a request's deadline came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeadlineSource {
    /// The policy's total deadline.
    Policy,
    /// The client's `grpc-timeout`.
    Grpc,
    /// An earlier hop's, in the `baggage` the application forwarded.
    Propagated,
}

impl DeadlineSource {
    /// The source's name in spans.
    pub(crate) fn name(self) -> &'static str {
        match self {
            DeadlineSource::Policy => "policy",
            DeadlineSource::Grpc => "grpc",
            DeadlineSource::Propagated => "propagated",
        }
    }
}

/// One request's retry state: what every gate reads and every step updates.
#[derive(Debug)]
pub(crate) struct RetryState<'a> {
    up: &'a UpstreamState,
    plan: Plan<'a>,
    /// When the request's deadline ends: the earliest of the policy's total
    /// deadline, the client's `grpc-timeout` and a propagated deadline.
    deadline: Option<Instant>,
    /// Which of them `deadline` is.
    source: DeadlineSource,
    /// Per-attempt limit before the deadline shortens it.
    attempt_limit: Option<Duration>,
    /// Retries and hedges sent so far.
    retries: u32,
    /// A gRPC request: its `grpc-status` can be a failure.
    grpc: bool,
    /// Await each response's first frame: a gRPC request whose policy
    /// retries gRPC statuses.
    first_frame: bool,
    report: Report,
}

/// Runs the request to its final answer, its attempts starting `now` (the
/// caller's clock reading: the first attempt's start, its timeout's and the
/// total deadline's origin). `trace` gets a CLIENT span per attempt and an
/// event per retry decision; `random` draws the jitter and the endpoint pairs.
pub(crate) async fn run(
    up: &UpstreamState,
    mut template: RequestTemplate,
    mut body: BodySource,
    plan: Plan<'_>,
    now: Instant,
    trace: &RequestSpan,
    random: &mut dyn Random,
) -> (Final, Report) {
    let mut state = RetryState::new(up, plan, || now);
    state.for_grpc(template.grpc, template.grpc_deadline);
    if let Some(hops) = template.hops.as_deref() {
        state.for_hops(hops);
    }
    let fin = 'run: {
        // A deadline already past: no attempt, nothing counted by the budget.
        if state.deadline.is_some_and(|d| d <= now) {
            state.report.first_error = Some(FailureKind::DeadlineExceeded);
            state.stop(Outcome::Exhausted(ExhaustedBy::Deadline), trace);
            state.deadline_stop(DeadlineStop::BeforeFirstAttempt, trace);
            break 'run Final::Local(FailureKind::DeadlineExceeded);
        }
        up.budget.record_request_at(now);
        let Some(mut endpoint) = picker::pick(&up.endpoints, &state.report.tried, false, random)
        else {
            state.report.outcome = Outcome::Exhausted(ExhaustedBy::NoAlternate);
            break 'run Final::NoEndpoint;
        };
        // With nothing to retry the only attempt may take the template's headers.
        let single = plan.skip.is_some() || plan.policy.is_none_or(|p| !p.enabled());
        if !single {
            template.number_attempts();
        }
        // The first attempt starts at the caller's reading; each later one
        // reads the clock after its backoff (a hedge's race reads its own).
        let mut first = Some(now);
        // The head's fields while an attempt has its header map.
        let mut kept: Option<KeptFields> = None;
        loop {
            template.restore_head(&mut kept);
            let caller_reading = first.take();
            state.begin(endpoint);
            let attempted = match state.hedge_delay(&body) {
                // Boxed: the hedge race is the largest state in this loop (two
                // attempts and a timer); inline, it would be copied with every
                // enclosing future on every request, hedged or not.
                Some(delay) => {
                    Box::pin(hedge::race(
                        &mut state, &template, &body, endpoint, delay, trace, random,
                    ))
                    .await
                }
                None => {
                    let started = caller_reading.unwrap_or_else(Instant::now);
                    let timeout = state.attempt_timeout(started);
                    let until = state.attempt_until(started, template.propagates());
                    let (request, span) = if single {
                        template.only_request(up, endpoint, body.next(), trace, until)
                    } else {
                        template.sole_request(&mut kept, up, endpoint, body.next(), trace, until)
                    };
                    let first_frame = state.first_frame;
                    attempt::send(up, endpoint, request, span, started, timeout, first_frame).await
                }
            };
            let from = attempted.endpoint;
            let failure = match verdict::settle(&mut state, attempted) {
                Verdict::Final(response) => {
                    state.report.outcome = if state.report.first_error.is_some() {
                        Outcome::Recovered
                    } else {
                        Outcome::Ok
                    };
                    break 'run Final::Upstream {
                        response,
                        endpoint: from,
                    };
                }
                Verdict::Failed(failure) => failure,
            };
            match gate::decide(Trigger::Failed(&failure), &state, &body, random) {
                Decision::Stop(outcome) => {
                    state.stop(outcome, trace);
                    if failure.kind == FailureKind::DeadlineExceeded {
                        state.deadline_stop(DeadlineStop::AttemptCut, trace);
                    } else if outcome == Outcome::Exhausted(ExhaustedBy::Deadline) {
                        state.deadline_stop(DeadlineStop::Retry, trace);
                    }
                    // A route's request timeout answers for itself (Gateway
                    // API's 504); a RetryPolicy's deadline leaves the last answer.
                    if outcome == Outcome::Exhausted(ExhaustedBy::Deadline)
                        && plan.policy.is_some_and(|p| p.deadline_answers_timeout)
                    {
                        break 'run Final::Local(FailureKind::DeadlineExceeded);
                    }
                    break 'run match failure.response {
                        Some(response) => Final::Upstream {
                            response,
                            endpoint: from,
                        },
                        None => Final::Local(failure.kind),
                    };
                }
                Decision::Go {
                    delay,
                    endpoint: next,
                } => {
                    // The retryable response (if any) is dropped here: its headers and
                    // body never reach the client.
                    drop(failure.response);
                    state.retrying(failure.kind, delay, trace, &template.head);
                    tokio::time::sleep(delay).await;
                    endpoint = next;
                }
            }
        }
    };
    state.finish(&template, trace);
    (fin, state.report)
}

impl<'a> RetryState<'a> {
    /// The state of a request whose attempts start at `start()`, read only
    /// when a total deadline counts from it (a clock read per request saved).
    fn new(up: &'a UpstreamState, plan: Plan<'a>, start: impl FnOnce() -> Instant) -> Self {
        let policy = plan.policy;
        Self {
            up,
            plan,
            deadline: policy.and_then(|p| p.total_deadline).map(|d| start() + d),
            source: DeadlineSource::Policy,
            // Zero turns the limit off altogether (a route's `backendRequest: 0s`).
            attempt_limit: match policy.and_then(|p| p.attempt_timeout) {
                Some(Duration::ZERO) => None,
                Some(limit) => Some(limit),
                None => up.config.read_timeout,
            },
            retries: 0,
            grpc: false,
            first_frame: false,
            report: Report {
                outcome: Outcome::Ok,
                attempts: 0,
                tried: Tried::default(),
                first_error: None,
                error_detail: None,
                backoffs: Vec::new(),
                hedged: false,
                elapsed: Duration::ZERO,
                detail: None,
            },
        }
    }

    /// A gRPC request: its statuses may be retried, and the client's
    /// `grpc-timeout` (`deadline`) bounds the retries like a total deadline.
    fn for_grpc(&mut self, grpc: bool, deadline: Option<Instant>) {
        self.grpc = grpc;
        self.first_frame = grpc
            && self.plan.skip.is_none()
            && self
                .enabled_policy()
                .is_some_and(|p| !p.grpc_statuses.is_empty());
        if let Some(d) = deadline {
            self.earlier(d, DeadlineSource::Grpc);
        }
    }

    /// A deadline propagated from an earlier hop bounds the retries like a
    /// total deadline.
    fn for_hops(&mut self, hops: &Hops) {
        if let Some(d) = hops.incoming() {
            self.earlier(d, DeadlineSource::Propagated);
        }
    }

    /// `d`, from `source`, is the request's deadline if it is earlier.
    fn earlier(&mut self, d: Instant, source: DeadlineSource) {
        if self.deadline.is_none_or(|own| d < own) {
            self.deadline = Some(d);
            self.source = source;
        }
    }

    /// The deadline an attempt starting at `started` carries to the next hop
    /// when the request `propagates` one: the request's, or the attempt's own
    /// timeout under the policy when that ends first. The upstream's read
    /// timeout, a default, is not sent: with no deadline set anywhere nothing
    /// travels.
    fn attempt_until(&self, started: Instant, propagates: bool) -> Option<Instant> {
        if !propagates {
            return None;
        }
        let own = self
            .plan
            .policy
            .and_then(|p| p.attempt_timeout)
            .map(|t| started + t);
        match (self.deadline, own) {
            (Some(d), Some(o)) => Some(d.min(o)),
            (d, o) => d.or(o),
        }
    }

    /// A propagated deadline stopped an attempt: counted, and on the span,
    /// when the request's deadline is the propagated one.
    fn deadline_stop(&self, stop: DeadlineStop, trace: &RequestSpan) {
        if self.source == DeadlineSource::Propagated {
            self.up.metrics.record_deadline_stop(stop);
            trace.deadline_stopped(stop.name());
        }
    }

    /// The policy, when one applies and has retries.
    fn enabled_policy(&self) -> Option<&'a RetryPolicy> {
        self.plan.policy.filter(|p| p.enabled())
    }

    /// An attempt to `endpoint` starts (the first, a retry or a hedge).
    fn begin(&mut self, endpoint: usize) {
        self.report.tried.insert(endpoint);
        self.report.attempts += 1;
    }

    /// The timeout of an attempt starting `now`: the per-attempt limit,
    /// shortened to what is left of the deadline.
    fn attempt_timeout(&self, now: Instant) -> Option<(Duration, FailureKind)> {
        let left = self.deadline.map(|d| d.saturating_duration_since(now));
        match (self.attempt_limit, left) {
            (Some(b), Some(l)) if l < b => Some((l, FailureKind::DeadlineExceeded)),
            (Some(b), _) => Some((b, FailureKind::ReadTimeout)),
            (None, Some(l)) => Some((l, FailureKind::DeadlineExceeded)),
            (None, None) => None,
        }
    }

    /// How long to wait for this attempt's headers before hedging, when a
    /// hedge may follow it: the policy hedges, none was sent yet, a retry is
    /// left, and the body is in memory (a duplicate needs the whole body).
    fn hedge_delay(&self, body: &BodySource) -> Option<Duration> {
        let p = self.plan.policy?;
        let delay = p.hedge_delay?;
        let buffered = matches!(body, BodySource::Replay(b) if b.is_buffered());
        (buffered && !self.report.hedged && self.retries < p.max_retries).then_some(delay)
    }

    /// A retry of `head` after a `kind` failure will be sent after `delay`.
    fn retrying(
        &mut self,
        kind: FailureKind,
        delay: Duration,
        trace: &RequestSpan,
        head: &RequestHead,
    ) {
        self.retries += 1;
        self.up.metrics.record_retry(&kind.name());
        self.report.backoffs.push(delay);
        self.report.elapsed += delay;
        trace.second_attempt(&self.up.config.name, head);
        trace.backoff(delay);
    }

    /// A hedge of `head` to `endpoint` goes out after the first attempt took `delay`.
    fn hedging(
        &mut self,
        endpoint: usize,
        delay: Duration,
        trace: &RequestSpan,
        head: &RequestHead,
    ) {
        self.retries += 1;
        self.begin(endpoint);
        self.report.hedged = true;
        self.up.metrics.record_hedge();
        trace.second_attempt(&self.up.config.name, head);
        trace.hedge_launched(delay);
    }

    /// The request ends: a request that did not end `ok` keeps its method
    /// and path for the diagnostics, and one that made more than one
    /// attempt records the spans of those made before it started recording.
    fn finish(&mut self, template: &RequestTemplate, trace: &RequestSpan) {
        if self.report.outcome != Outcome::Ok {
            let head = &template.head;
            self.report
                .keep_request(head.method.clone(), head.path_and_query.clone());
        }
        if self.report.attempts > 1 {
            for record in self.report.history() {
                let state = &self.up.endpoints[record.endpoint];
                let authority = template.authority.as_ref().unwrap_or(&state.authority);
                trace.record_earlier_attempt(
                    record,
                    &state.endpoint,
                    authority.as_str(),
                    &template.head.method,
                    template.head.path_and_query.path(),
                );
            }
        }
    }

    /// A gate refused to go again (a retry or a hedge); a budget refusal is
    /// counted and marked the same way for both.
    fn refused(&self, outcome: Outcome, trace: &RequestSpan) {
        if outcome == Outcome::Exhausted(ExhaustedBy::Budget) {
            self.up.metrics.record_budget_refusal();
            trace.budget_refused();
        }
    }

    /// The retries end with `outcome`.
    fn stop(&mut self, outcome: Outcome, trace: &RequestSpan) {
        self.report.outcome = outcome;
        self.refused(outcome, trace);
        if outcome == Outcome::Exhausted(ExhaustedBy::Deadline) {
            trace.deadline_exceeded(self.source.name());
        }
    }
}

impl BodySource {
    /// The body of the next attempt.
    fn next(&mut self) -> AttemptBody {
        match self {
            BodySource::Direct(incoming) => incoming
                .take()
                .map_or(AttemptBody::Empty, AttemptBody::Direct),
            BodySource::Replay(replay) => replay.for_attempt(),
        }
    }

    /// True when another attempt can send this body in full.
    fn is_replayable(&self) -> bool {
        match self {
            BodySource::Direct(_) => false,
            BodySource::Replay(b) => b.is_replayable(),
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Fixtures for the engine's unit tests: an upstream of three endpoints
    //! that are never dialled, built from typed configuration.

    use reprise_crds::file::ConfigFile;
    use reprise_crds::file::{EndpointSpec, RetriesSpec, UpstreamSpec};

    use crate::retry::upstream::UpstreamState;

    /// An upstream `api` of three endpoints with `retries`.
    pub(crate) fn upstream(retries: RetriesSpec) -> UpstreamState {
        let file = ConfigFile {
            upstreams: vec![UpstreamSpec {
                name: "api".into(),
                endpoints: (1..=3)
                    .map(|port| EndpointSpec {
                        address: "127.0.0.1".into(),
                        port,
                        ..EndpointSpec::default()
                    })
                    .collect(),
                retries,
                ..UpstreamSpec::default()
            }],
            ..ConfigFile::default()
        };
        let config = file.resolve().expect("a valid test configuration");
        UpstreamState::new(config.upstreams[0].clone(), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_attempt_timeout_is_clamped_by_the_deadline() {
        let up = testing::upstream(Default::default());
        let mut policy = up.config.retries.clone();
        policy.attempt_timeout = Some(Duration::from_secs(3));
        let plan = Plan {
            policy: Some(&policy),
            skip: None,
        };
        let now = Instant::now();
        let mut state = RetryState::new(&up, plan, || now);
        state.deadline = Some(now + Duration::from_secs(1));
        assert_eq!(
            state.attempt_timeout(now),
            Some((Duration::from_secs(1), FailureKind::DeadlineExceeded))
        );
        state.deadline = Some(now + Duration::from_secs(10));
        assert_eq!(
            state.attempt_timeout(now),
            Some((Duration::from_secs(3), FailureKind::ReadTimeout))
        );
        state.deadline = None;
        state.attempt_limit = None;
        assert_eq!(state.attempt_timeout(now), None);
    }

    fn head() -> RequestHead {
        RequestHead {
            method: http::Method::GET,
            path_and_query: http::uri::PathAndQuery::from_static("/"),
            headers: http::HeaderMap::new(),
        }
    }

    const WALL: u64 = 1_796_601_600_000;

    #[tokio::test(start_paused = true)]
    async fn a_propagated_deadline_caps_the_request_and_each_attempt_and_is_named_its_source() {
        let up = testing::upstream(Default::default());
        let mut policy = up.config.retries.clone();
        policy.total_deadline = Some(Duration::from_secs(5));
        policy.attempt_timeout = Some(Duration::from_secs(3));
        let plan = Plan {
            policy: Some(&policy),
            skip: None,
        };
        let now = Instant::now();
        let mut state = RetryState::new(&up, plan, || now);
        // Later than the policy's: the policy's stays.
        state.for_hops(&Hops::new(WALL, now, Some(WALL + 9_000), true));
        assert_eq!(state.deadline, Some(now + Duration::from_secs(5)));
        assert_eq!(state.source, DeadlineSource::Policy);
        // Earlier: it caps the total deadline and the attempt's timeout.
        state.for_hops(&Hops::new(WALL, now, Some(WALL + 1_200), true));
        assert_eq!(state.deadline, Some(now + Duration::from_millis(1_200)));
        assert_eq!(state.source, DeadlineSource::Propagated);
        assert_eq!(
            state.attempt_timeout(now),
            Some((Duration::from_millis(1_200), FailureKind::DeadlineExceeded))
        );
        // A client's grpc-timeout earlier still takes over.
        state.for_grpc(true, Some(now + Duration::from_millis(700)));
        assert_eq!(state.source, DeadlineSource::Grpc);
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_carries_the_earlier_of_the_request_deadline_and_its_own_timeout() {
        let up = testing::upstream(Default::default());
        let mut policy = up.config.retries.clone();
        policy.attempt_timeout = Some(Duration::from_secs(2));
        let plan = Plan {
            policy: Some(&policy),
            skip: None,
        };
        let now = Instant::now();
        let mut state = RetryState::new(&up, plan, || now);
        assert_eq!(state.attempt_until(now, false), None, "not propagating");
        assert_eq!(
            state.attempt_until(now, true),
            Some(now + Duration::from_secs(2)),
            "the policy's attempt timeout alone"
        );
        state.for_hops(&Hops::new(WALL, now, Some(WALL + 1_500), true));
        assert_eq!(
            state.attempt_until(now, true),
            Some(now + Duration::from_millis(1_500))
        );
        let later = now + Duration::from_millis(1_000);
        assert_eq!(
            state.attempt_until(later, true),
            Some(now + Duration::from_millis(1_500)),
            "a later attempt still ends at the request's deadline"
        );
        // No deadline and no attempt timeout under the policy: the
        // upstream's read timeout, a default, does not travel.
        policy.attempt_timeout = None;
        let plan = Plan {
            policy: Some(&policy),
            skip: None,
        };
        let state = RetryState::new(&up, plan, || now);
        assert!(state.attempt_limit.is_some(), "the upstream's read timeout");
        assert_eq!(state.attempt_until(now, true), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_already_past_is_answered_at_once_without_an_attempt_or_a_budget_charge() {
        let up = testing::upstream(reprise_crds::file::RetriesSpec {
            attempts: Some(2),
            ..Default::default()
        });
        let plan = Plan {
            policy: Some(&up.config.retries),
            skip: None,
        };
        let now = Instant::now();
        let mut template = RequestTemplate::new(head(), http::Version::HTTP_11, None, false);
        template.hops = Some(Box::new(Hops::new(WALL, now, Some(WALL - 5), true)));
        let body = BodySource::Direct(None);
        let trace = RequestSpan::off();
        let (fin, report) = run(
            &up,
            template,
            body,
            plan,
            now,
            &trace,
            &mut crate::random::scripted::Scripted::default(),
        )
        .await;
        assert!(
            matches!(fin, Final::Local(FailureKind::DeadlineExceeded)),
            "{fin:?}"
        );
        assert_eq!(report.attempts, 0);
        assert_eq!(report.outcome, Outcome::Exhausted(ExhaustedBy::Deadline));
        assert_eq!(up.budget.totals(), (0, 0), "neither a request nor a retry");
        let stats = up.stats();
        assert_eq!(
            stats.deadline_stops.get("before_first_attempt"),
            Some(&1),
            "{stats:?}"
        );
        assert!(stats.endpoints.iter().all(|e| e.in_flight == 0));
    }
}
