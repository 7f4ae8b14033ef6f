//! The retry loop: attempts, failure gates, backoff, deadline and hedging.
//!
//! Every failed attempt passes the gates in order: classify (is it retryable at
//! all, and did it fail inside the policy's failure boundary), body (can it be
//! sent again), attempts, alternate endpoint, budget, backoff, deadline. Only
//! then is the budget charged, so a deadline-aborted retry costs nothing. All of
//! it happens before response headers reach the client: a retryable response is
//! dropped unseen.

use std::time::Duration;

use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use hyper::body::Incoming;
use rand::Rng;
use reprise_crds::{FailureBoundary, RetryPolicy};
use tokio::time::Instant;

use crate::endpoint_picker::{EndpointPicker, Tried};
use crate::failure::{self, classify_client_error, Failure, FailureKind, Phase};
use crate::outcome::{ExhaustedBy, Outcome, SkipReason};
use crate::replay_body::{AttemptBody, ReplayBody};
use crate::telemetry::{AttemptSpan, RequestSpan};
use crate::upstream::UpstreamState;

/// The parts of the client's request every attempt repeats.
#[derive(Debug)]
pub struct RequestTemplate {
    /// Method.
    pub method: Method,
    /// Path and query.
    pub path_and_query: PathAndQuery,
    /// Version towards the endpoint.
    pub version: Version,
    /// End-to-end headers (hop-by-hop ones already removed).
    pub headers: HeaderMap,
    /// Attempts built so far (numbers the attempt header).
    pub attempts_sent: u32,
    /// The host the client addressed: HTTP/2's `:authority` towards the endpoint
    /// (the connector dials the endpoint whatever it says). `None` uses the endpoint's address.
    pub authority: Option<http::uri::Authority>,
}

/// Request header carrying the attempt number (1 for the first) on retryable requests.
pub const ATTEMPT_HEADER: http::HeaderName = http::HeaderName::from_static("x-reprise-attempt");

/// Where the request body comes from.
#[derive(Debug)]
pub enum BodySource {
    /// The client's body, sent once as it streams.
    Direct(Option<Incoming>),
    /// A body prepared for replay.
    Replay(ReplayBody),
}

/// What the loop may do for this request.
#[derive(Clone, Copy, Debug)]
pub struct Plan<'a> {
    /// The policy, when one applies.
    pub policy: Option<&'a RetryPolicy>,
    /// Set when a failure must not be retried for a reason known up front
    /// (no policy, method not retried, upgrade).
    pub skip: Option<SkipReason>,
}

/// How the request ended.
#[derive(Debug)]
pub enum Final {
    /// An upstream response to pass on, from endpoint `endpoint`.
    Upstream {
        /// The response.
        response: Response<Incoming>,
        /// Index of the endpoint that sent it.
        endpoint: usize,
    },
    /// No usable response: the sidecar answers for this failure.
    Local(FailureKind),
    /// The upstream has no endpoints.
    NoEndpoint,
}

/// What happened, for the log event, metrics and traces.
#[derive(Debug)]
pub struct Report {
    /// The outcome.
    pub outcome: Outcome,
    /// Attempts made, the first included.
    pub attempts: u32,
    /// Endpoints tried, in order.
    pub tried: Tried,
    /// The first failure's kind.
    pub first_error: Option<FailureKind>,
    /// The delays slept before each retry.
    pub backoffs: Vec<Duration>,
    /// True when a hedge was sent.
    pub hedged: bool,
}

/// One finished attempt.
struct Attempted {
    endpoint: usize,
    result: Result<Response<Incoming>, (FailureKind, Phase)>,
    span: AttemptSpan,
}

enum Classified {
    Final(Response<Incoming>, usize),
    Failed(Failure<Incoming>, usize),
}

enum Gate {
    Retry { delay: Duration, endpoint: usize },
    Stop(Outcome),
}

/// Runs the request to its final answer. `trace` gets a CLIENT span per
/// attempt and an event per retry decision.
pub async fn run(
    up: &UpstreamState,
    mut template: RequestTemplate,
    mut body: BodySource,
    plan: Plan<'_>,
    trace: &RequestSpan,
) -> (Final, Report) {
    let start = Instant::now();
    let policy = plan.policy;
    let deadline = policy.and_then(|p| p.total_deadline).map(|d| start + d);
    let base_timeout = policy
        .and_then(|p| p.attempt_timeout)
        .or(up.config.read_timeout);
    let single = plan.skip.is_some() || policy.is_none_or(|p| !p.enabled());
    let mut report = Report {
        outcome: Outcome::Ok,
        attempts: 0,
        tried: Tried::default(),
        first_error: None,
        backoffs: Vec::new(),
        hedged: false,
    };
    let Some(mut endpoint) = EndpointPicker::pick(&up.endpoints, &report.tried, false) else {
        report.outcome = Outcome::Exhausted(ExhaustedBy::NoAlternate);
        return (Final::NoEndpoint, report);
    };
    let mut retries = 0u32;
    loop {
        report.tried.insert(endpoint);
        report.attempts += 1;
        let timeout = attempt_timeout(base_timeout, deadline);
        let hedge = policy
            .and_then(|p| {
                p.hedge_delay
                    .filter(|_| !report.hedged && retries < p.attempts)
            })
            .filter(|_| matches!(&body, BodySource::Replay(b) if b.is_buffered()));
        let attempted = match hedge {
            Some(delay) => {
                // Boxed: the hedge race is the largest state in this loop
                // (two attempts and a timer); inline, it would be copied
                // with every enclosing future on every request, hedged or not.
                let (attempted, earlier) = Box::pin(race_with_hedge(
                    up,
                    &mut template,
                    &body,
                    endpoint,
                    timeout,
                    delay,
                    deadline,
                    policy,
                    &mut report,
                    &mut retries,
                    trace,
                ))
                .await;
                if let Some(earlier) = earlier {
                    // The loser failed first; its failure still counts for health and reporting.
                    let _ = classify(up, earlier, policy, &mut report);
                }
                attempted
            }
            None => {
                let (request, span) =
                    template.request(up, endpoint, next_body(&mut body), single, trace, false);
                attempt(up, endpoint, request, span, timeout).await
            }
        };
        let failure = match classify(up, attempted, policy, &mut report) {
            Classified::Final(response, endpoint) => {
                report.outcome = if report.first_error.is_some() {
                    Outcome::Recovered
                } else {
                    Outcome::Ok
                };
                return (Final::Upstream { response, endpoint }, report);
            }
            Classified::Failed(f, from) => (f, from),
        };
        let (failure, last_endpoint) = failure;
        match gate(up, &failure, &body, plan, retries, deadline, &report) {
            Gate::Stop(outcome) => {
                report.outcome = outcome;
                trace.stopped(outcome);
                if matches!(outcome, Outcome::Exhausted(ExhaustedBy::Budget)) {
                    up.metrics
                        .budget_refusals
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                return match failure.response {
                    Some(response) => (
                        Final::Upstream {
                            response,
                            endpoint: last_endpoint,
                        },
                        report,
                    ),
                    None => (Final::Local(failure.kind), report),
                };
            }
            Gate::Retry {
                delay,
                endpoint: next,
            } => {
                // The retryable response (if any) is dropped here: its headers and
                // body never reach the client.
                drop(failure.response);
                up.metrics.record_retry(&failure.kind.name());
                report.backoffs.push(delay);
                trace.backoff(delay);
                tokio::time::sleep(delay).await;
                retries += 1;
                endpoint = next;
            }
        }
    }
}

/// Decides, for a failed attempt, whether and when to retry.
fn gate(
    up: &UpstreamState,
    f: &Failure<Incoming>,
    body: &BodySource,
    plan: Plan<'_>,
    retries: u32,
    deadline: Option<Instant>,
    report: &Report,
) -> Gate {
    if let Some(reason) = plan.skip {
        return Gate::Stop(Outcome::Skipped(reason));
    }
    let Some(p) = plan.policy.filter(|p| p.enabled()) else {
        return Gate::Stop(Outcome::Skipped(SkipReason::RetriesOff));
    };
    match f.kind {
        FailureKind::RequestBodyError => {
            return Gate::Stop(Outcome::Skipped(SkipReason::NotRetryable))
        }
        FailureKind::DeadlineExceeded => {
            return Gate::Stop(Outcome::Exhausted(ExhaustedBy::Deadline))
        }
        _ => {}
    }
    if f.phase != Phase::Response {
        if !p.retry_transport {
            return Gate::Stop(Outcome::Skipped(SkipReason::TransportOff));
        }
        if f.phase == Phase::AfterWrite && p.failure_boundary == FailureBoundary::Connect {
            return Gate::Stop(Outcome::Skipped(SkipReason::FailureBoundary));
        }
    }
    let replayable = match body {
        BodySource::Direct(_) => false,
        BodySource::Replay(b) => b.is_replayable(),
    };
    if !replayable {
        return Gate::Stop(Outcome::Skipped(SkipReason::BodyConsumed));
    }
    if retries >= p.attempts {
        return Gate::Stop(Outcome::Exhausted(ExhaustedBy::Attempts));
    }
    let Some(endpoint) = EndpointPicker::pick(&up.endpoints, &report.tried, p.reuse_endpoints)
    else {
        return Gate::Stop(Outcome::Exhausted(ExhaustedBy::NoAlternate));
    };
    if !up.budget.has_room() {
        return Gate::Stop(Outcome::Exhausted(ExhaustedBy::Budget));
    }
    let delay = match f.retry_after {
        Some(wait) if wait > p.retry_after_max => {
            return Gate::Stop(Outcome::Exhausted(ExhaustedBy::RetryAfterTooLong))
        }
        Some(wait) => wait,
        None => full_jitter(p.nominal_backoff(retries + 1)),
    };
    if let Some(deadline) = deadline {
        // A retry that would start at or after the deadline is not made, and not charged.
        if Instant::now() + delay >= deadline {
            return Gate::Stop(Outcome::Exhausted(ExhaustedBy::Deadline));
        }
    }
    if !up.budget.try_withdraw() {
        return Gate::Stop(Outcome::Exhausted(ExhaustedBy::Budget));
    }
    Gate::Retry { delay, endpoint }
}

/// Turns an attempt into a final response or a failure, feeding passive health.
/// (A `Result` would do, but its error side is large and this runs per attempt.)
fn classify(
    up: &UpstreamState,
    attempted: Attempted,
    policy: Option<&RetryPolicy>,
    report: &mut Report,
) -> Classified {
    let state = &up.endpoints[attempted.endpoint];
    let span = attempted.span;
    match attempted.result {
        Ok(response) => {
            // Any response proves the transport works; statuses never eject (rules document).
            state.record_success();
            let status = response.status().as_u16();
            let retryable = policy.is_some_and(|p| p.retry_statuses.contains(status));
            // A retryable status weighs the endpoint's choice, never its health.
            state.record_outcome(retryable);
            if retryable {
                let kind = FailureKind::UpstreamStatus(status);
                span.failed(kind, Some(status));
                report.first_error.get_or_insert(kind);
                return Classified::Failed(
                    Failure {
                        kind,
                        phase: Phase::Response,
                        retry_after: failure::retry_after(response.headers()),
                        response: Some(response),
                    },
                    attempted.endpoint,
                );
            }
            span.responded(status);
            Classified::Final(response, attempted.endpoint)
        }
        Err((kind, phase)) => {
            span.failed(kind, None);
            if kind.is_transport() {
                state.record_outcome(true);
                state.record_failure(&up.config.passive_health);
            }
            report.first_error.get_or_insert(kind);
            Classified::Failed(
                Failure {
                    kind,
                    phase,
                    response: None,
                    retry_after: None,
                },
                attempted.endpoint,
            )
        }
    }
}

/// Sends the first attempt and, if no response headers arrive within `delay`,
/// one speculative duplicate to another endpoint. The first final answer wins
/// and the other attempt is cancelled (dropped). Returns the deciding attempt
/// and, when both failed, the one that failed first.
#[allow(clippy::too_many_arguments)]
async fn race_with_hedge(
    up: &UpstreamState,
    template: &mut RequestTemplate,
    body: &BodySource,
    endpoint: usize,
    timeout: Option<(Duration, FailureKind)>,
    delay: Duration,
    deadline: Option<Instant>,
    policy: Option<&RetryPolicy>,
    report: &mut Report,
    retries: &mut u32,
    trace: &RequestSpan,
) -> (Attempted, Option<Attempted>) {
    let BodySource::Replay(replay) = body else {
        unreachable!("hedging needs a buffered body");
    };
    let (request, span) = template.request(up, endpoint, replay.for_attempt(), false, trace, false);
    let first = attempt(up, endpoint, request, span, timeout);
    tokio::pin!(first);
    tokio::select! {
        done = &mut first => return (done, None),
        () = tokio::time::sleep(delay) => {}
    }
    let deadline_left = deadline.is_none_or(|d| Instant::now() < d);
    let second_endpoint = EndpointPicker::pick(&up.endpoints, &report.tried, false);
    let Some(second_endpoint) = second_endpoint.filter(|_| deadline_left) else {
        return (first.await, None);
    };
    if !up.budget.try_withdraw() {
        up.metrics
            .budget_refusals
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        trace.budget_refused();
        return (first.await, None);
    }
    report.tried.insert(second_endpoint);
    report.attempts += 1;
    report.hedged = true;
    *retries += 1;
    up.metrics
        .hedges
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    trace.hedge_launched(delay);
    let timeout = attempt_timeout(
        policy
            .and_then(|p| p.attempt_timeout)
            .or(up.config.read_timeout),
        deadline,
    );
    let (request, span) = template.request(
        up,
        second_endpoint,
        replay.for_attempt(),
        false,
        trace,
        true,
    );
    let second = attempt(up, second_endpoint, request, span, timeout);
    tokio::pin!(second);
    let is_final = |a: &Attempted| match &a.result {
        Ok(r) => !policy.is_some_and(|p| p.retry_statuses.contains(r.status().as_u16())),
        Err(_) => false,
    };
    let (done, rest) = tokio::select! {
        a = &mut first => (a, Either::Second),
        b = &mut second => (b, Either::First),
    };
    if is_final(&done) {
        return (done, None);
    }
    let other = match rest {
        Either::First => first.await,
        Either::Second => second.await,
    };
    (other, Some(done))
}

enum Either {
    First,
    Second,
}

/// Sends one attempt and waits for its response headers.
async fn attempt(
    up: &UpstreamState,
    endpoint: usize,
    request: Request<AttemptBody>,
    span: AttemptSpan,
    timeout: Option<(Duration, FailureKind)>,
) -> Attempted {
    let state = &up.endpoints[endpoint];
    let _in_flight = state.start();
    let started = Instant::now();
    let response = state.client.request(request);
    let result = match timeout {
        Some((limit, kind)) => match tokio::time::timeout(limit, response).await {
            Ok(r) => r.map_err(|e| classify_client_error(&e)),
            Err(_) => Err((kind, Phase::AfterWrite)),
        },
        None => response.await.map_err(|e| classify_client_error(&e)),
    };
    up.metrics.record_attempt(started.elapsed());
    Attempted {
        endpoint,
        result,
        span,
    }
}

/// The per-attempt timeout, shortened to what is left of the deadline.
fn attempt_timeout(
    base: Option<Duration>,
    deadline: Option<Instant>,
) -> Option<(Duration, FailureKind)> {
    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    match (base, left) {
        (Some(b), Some(l)) if l < b => Some((l, FailureKind::DeadlineExceeded)),
        (Some(b), _) => Some((b, FailureKind::ReadTimeout)),
        (None, Some(l)) => Some((l, FailureKind::DeadlineExceeded)),
        (None, None) => None,
    }
}

/// Full jitter: uniform in `[0, nominal]`.
pub fn full_jitter(nominal: Duration) -> Duration {
    let nanos = u64::try_from(nominal.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(rand::rng().random_range(0..=nanos))
}

fn next_body(body: &mut BodySource) -> AttemptBody {
    match body {
        BodySource::Direct(incoming) => incoming
            .take()
            .map_or(AttemptBody::Empty, AttemptBody::Direct),
        BodySource::Replay(replay) => replay.for_attempt(),
    }
}

impl RequestTemplate {
    /// The request for one attempt to `endpoint`, and the attempt's CLIENT
    /// span under `trace`, whose context it carries. `last` lets the only
    /// attempt take the headers instead of copying them.
    fn request(
        &mut self,
        up: &UpstreamState,
        endpoint: usize,
        body: AttemptBody,
        last: bool,
        trace: &RequestSpan,
        hedge: bool,
    ) -> (Request<AttemptBody>, AttemptSpan) {
        self.attempts_sent += 1;
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(Scheme::HTTP);
        parts.authority = Some(
            self.authority
                .clone()
                .unwrap_or_else(|| up.endpoints[endpoint].authority.clone()),
        );

        parts.path_and_query = Some(self.path_and_query.clone());
        let mut request = Request::new(body);
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = Uri::from_parts(parts).unwrap_or_default();
        *request.version_mut() = self.version;
        // Like Envoy's x-envoy-attempt-count: lets an upstream see a retry for
        // what it is. The first attempt's number goes into the template, so
        // that each copy already has the entry and a retry only overwrites its
        // value (inserting a new name into a fresh copy would grow it).
        *request.headers_mut() = if last {
            std::mem::take(&mut self.headers)
        } else {
            if self.attempts_sent == 1 {
                self.headers.insert(ATTEMPT_HEADER, attempt_number(1));
            }
            let mut headers = self.headers.clone();
            if self.attempts_sent > 1 {
                headers.insert(ATTEMPT_HEADER, attempt_number(self.attempts_sent));
            }
            headers
        };
        let span = trace.attempt(
            &up.endpoints[endpoint].endpoint,
            &mut request,
            self.attempts_sent - 1,
            hedge,
        );
        (request, span)
    }
}

/// The attempt header's value; the usual numbers without an allocation.
fn attempt_number(n: u32) -> http::HeaderValue {
    const SMALL: [&str; 10] = ["1", "2", "3", "4", "5", "6", "7", "8", "9", "10"];
    match n.checked_sub(1).and_then(|i| SMALL.get(i as usize)) {
        Some(s) => http::HeaderValue::from_static(s),
        None => http::HeaderValue::from(n),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use reprise_crds::file::parse;

    use super::*;

    fn upstream(retries: &str) -> UpstreamState {
        let yaml = format!(
            "upstreams:\n  - name: api\n    endpoints: [{{ address: 127.0.0.1, port: 1 }}, {{ address: 127.0.0.1, port: 2 }}, {{ address: 127.0.0.1, port: 3 }}]\n    retries: {retries}\n"
        );
        let config = parse(&yaml, "t").expect("valid");
        UpstreamState::new(config.upstreams[0].clone(), None)
    }

    fn failure(
        kind: FailureKind,
        phase: Phase,
        retry_after: Option<Duration>,
    ) -> Failure<Incoming> {
        Failure {
            kind,
            phase,
            response: None,
            retry_after,
        }
    }

    fn empty_body() -> BodySource {
        BodySource::Replay(ReplayBody::Buffered {
            data: Bytes::new(),
            trailers: None,
            reserved: None,
        })
    }

    fn report(tried: &[usize]) -> Report {
        let mut t = Tried::default();
        tried.iter().for_each(|i| t.insert(*i));
        Report {
            outcome: Outcome::Ok,
            attempts: 1,
            tried: t,
            first_error: None,
            backoffs: Vec::new(),
            hedged: false,
        }
    }

    fn plan(up: &UpstreamState) -> Plan<'_> {
        Plan {
            policy: Some(&up.config.retries),
            skip: None,
        }
    }

    fn delay(g: Gate) -> Duration {
        match g {
            Gate::Retry { delay, .. } => delay,
            Gate::Stop(o) => panic!("expected a retry, got {o:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_is_full_jitter_under_the_exponential_nominal() {
        let up = upstream("{ attempts: 10, backoff_base_ms: 100, backoff_cap_ms: 400, budget_percent: 100, budget_min_retries_per_second: 100000 }");
        let f = failure(FailureKind::UpstreamStatus(503), Phase::Response, None);
        for (retry, nominal_ms) in [(0u32, 100u64), (1, 200), (2, 400), (3, 400), (9, 400)] {
            let samples: Vec<Duration> = (0..200)
                .map(|_| {
                    delay(gate(
                        &up,
                        &f,
                        &empty_body(),
                        plan(&up),
                        retry,
                        None,
                        &report(&[0]),
                    ))
                })
                .collect();
            let nominal = Duration::from_millis(nominal_ms);
            assert!(
                samples.iter().all(|d| *d <= nominal),
                "retry {}: over {nominal:?}",
                retry + 1
            );
            assert!(
                samples.iter().any(|d| *d >= nominal * 8 / 10),
                "retry {}: never near {nominal:?}",
                retry + 1
            );
            assert!(
                samples.iter().any(|d| *d <= nominal * 2 / 10),
                "retry {}: never near 0",
                retry + 1
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_crossing_the_deadline_is_refused_and_not_charged() {
        let up = upstream("{ attempts: 3, budget_percent: 100 }");
        up.budget.record_request();
        let deadline = Some(Instant::now() + Duration::from_millis(300));
        tokio::time::advance(Duration::from_millis(250)).await;
        let slow = failure(
            FailureKind::UpstreamStatus(503),
            Phase::Response,
            Some(Duration::from_millis(100)),
        );
        let g = gate(
            &up,
            &slow,
            &empty_body(),
            plan(&up),
            0,
            deadline,
            &report(&[0]),
        );
        assert!(matches!(
            g,
            Gate::Stop(Outcome::Exhausted(ExhaustedBy::Deadline))
        ));
        assert_eq!(up.budget.totals(), (1, 0), "not charged");
        let quick = failure(
            FailureKind::UpstreamStatus(503),
            Phase::Response,
            Some(Duration::from_millis(10)),
        );
        assert_eq!(
            delay(gate(
                &up,
                &quick,
                &empty_body(),
                plan(&up),
                0,
                deadline,
                &report(&[0])
            )),
            Duration::from_millis(10)
        );
        assert_eq!(
            up.budget.totals(),
            (1, 1),
            "charged once the retry is certain"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn gates_in_order() {
        let up = upstream("{ attempts: 2, budget_percent: 10, failure_boundary: connect }");
        let status = failure(FailureKind::UpstreamStatus(503), Phase::Response, None);
        // Budget: 9 requests do not allow a 10% retry; 10 do.
        (0..9).for_each(|_| up.budget.record_request());
        assert!(matches!(
            gate(
                &up,
                &status,
                &empty_body(),
                plan(&up),
                0,
                None,
                &report(&[0])
            ),
            Gate::Stop(Outcome::Exhausted(ExhaustedBy::Budget))
        ));
        up.budget.record_request();
        assert!(matches!(
            gate(
                &up,
                &status,
                &empty_body(),
                plan(&up),
                0,
                None,
                &report(&[0])
            ),
            Gate::Retry { .. }
        ));
        // Attempt cap, then alternate endpoint.
        assert!(matches!(
            gate(
                &up,
                &status,
                &empty_body(),
                plan(&up),
                2,
                None,
                &report(&[0])
            ),
            Gate::Stop(Outcome::Exhausted(ExhaustedBy::Attempts))
        ));
        assert!(matches!(
            gate(
                &up,
                &status,
                &empty_body(),
                plan(&up),
                0,
                None,
                &report(&[0, 1, 2])
            ),
            Gate::Stop(Outcome::Exhausted(ExhaustedBy::NoAlternate))
        ));
        // Boundary: a reset after writing is outside `connect`; a refused connect is inside.
        let reset = failure(FailureKind::ConnectionReset, Phase::AfterWrite, None);
        assert!(matches!(
            gate(
                &up,
                &reset,
                &empty_body(),
                plan(&up),
                0,
                None,
                &report(&[0])
            ),
            Gate::Stop(Outcome::Skipped(SkipReason::FailureBoundary))
        ));
        // Body: a direct (streaming, consumed) body cannot be replayed.
        let refused = failure(FailureKind::ConnectRefused, Phase::Connect, None);
        assert!(matches!(
            gate(
                &up,
                &refused,
                &BodySource::Direct(None),
                plan(&up),
                0,
                None,
                &report(&[0])
            ),
            Gate::Stop(Outcome::Skipped(SkipReason::BodyConsumed))
        ));
        // The client's own body failing is never retried.
        let body_err = failure(FailureKind::RequestBodyError, Phase::AfterWrite, None);
        assert!(matches!(
            gate(
                &up,
                &body_err,
                &empty_body(),
                plan(&up),
                0,
                None,
                &report(&[0])
            ),
            Gate::Stop(Outcome::Skipped(SkipReason::NotRetryable))
        ));
        // A reason known up front wins.
        let skip = Plan {
            policy: Some(&up.config.retries),
            skip: Some(SkipReason::Method),
        };
        assert!(matches!(
            gate(&up, &status, &empty_body(), skip, 0, None, &report(&[0])),
            Gate::Stop(Outcome::Skipped(SkipReason::Method))
        ));
    }

    #[test]
    fn jitter_stays_within_nominal() {
        let nominal = Duration::from_millis(100);
        let samples: Vec<_> = (0..2000).map(|_| full_jitter(nominal)).collect();
        assert!(samples.iter().all(|d| *d <= nominal));
        let below_half = samples.iter().filter(|d| **d < nominal / 2).count();
        // Uniform: about half below the midpoint (the bound is loose, not flaky).
        assert!((700..1300).contains(&below_half), "{below_half}");
        assert_eq!(full_jitter(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn attempt_timeout_is_clamped_by_the_deadline() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("rt");
        rt.block_on(async {
            let now = Instant::now();
            let t = attempt_timeout(
                Some(Duration::from_secs(3)),
                Some(now + Duration::from_secs(1)),
            );
            assert_eq!(
                t,
                Some((Duration::from_secs(1), FailureKind::DeadlineExceeded))
            );
            let t = attempt_timeout(
                Some(Duration::from_secs(3)),
                Some(now + Duration::from_secs(10)),
            );
            assert_eq!(t, Some((Duration::from_secs(3), FailureKind::ReadTimeout)));
            assert_eq!(attempt_timeout(None, None), None);
        });
    }

    #[test]
    fn attempt_numbers_read_as_decimal_from_zero_to_past_the_table() {
        for n in [0, 1, 2, 9, 10, 11, 4_000_000_000] {
            assert_eq!(
                super::attempt_number(n).to_str().ok(),
                Some(n.to_string().as_str())
            );
        }
    }
}
