//! The spans of one request: a SERVER span for what the application sent and
//! one CLIENT span per attempt, with the HTTP semantic-convention attributes and
//! the retry loop's decisions. Both types are an empty `Option` when tracing is
//! off, so the proxy calls them unconditionally at no cost.
//!
//! A request the head sampler dropped records nothing, but when the pipeline
//! offers a forced tracer (`REPRISE_TRACE_RETRIED=always`, the default) it
//! keeps its spans' ids, its arrival and its parent. Should a second attempt
//! be made (a retry or a hedge, [`RequestSpan::second_attempt`]) it starts
//! recording then: the SERVER span from the arrival on, under the ids the
//! first attempt's `traceparent` already named, every later span and event
//! as it happens, and the attempts made before
//! ([`RequestSpan::record_earlier_attempt`]) from what the report kept of
//! them. A request answered by its first attempt stays unrecorded.

use std::borrow::Cow;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use http::{Method, Request, StatusCode, Version};
use opentelemetry::trace::{
    Span as _, SpanId, SpanKind, Status, TraceContextExt, TraceId, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, Span};
use opentelemetry_semantic_conventions::attribute::{
    ERROR_TYPE, HTTP_REQUEST_METHOD, HTTP_REQUEST_METHOD_ORIGINAL, HTTP_REQUEST_RESEND_COUNT,
    HTTP_RESPONSE_STATUS_CODE, NETWORK_PROTOCOL_VERSION, SERVER_ADDRESS, SERVER_PORT, URL_FULL,
    URL_PATH, URL_SCHEME,
};
use tokio::time::Instant;

/// OpenTelemetry's RPC conventions (spelled here: the semantic-conventions
/// crate keeps some of them behind its unstable feature).
const RPC_SYSTEM: &str = "rpc.system";
const RPC_SERVICE: &str = "rpc.service";
const RPC_METHOD: &str = "rpc.method";
const RPC_GRPC_STATUS_CODE: &str = "rpc.grpc.status_code";
use reprise_crds::Endpoint;

use crate::exchange::failure::FailureKind;
use crate::exchange::report::PolicySource;
use crate::exchange::report::{AttemptEnd, AttemptRecord, Report};
use crate::exchange::request::RequestHead;
use reprise_telemetry::propagation;
use reprise_telemetry::{ForcedTracer, Tracing};

/// `ok`, `recovered`, `exhausted` or `skipped` (SERVER span).
pub(crate) const OUTCOME: &str = "reprise.outcome";
/// Why `exhausted` or `skipped`, e.g. `budget` or `method` (SERVER span).
pub(crate) const OUTCOME_REASON: &str = "reprise.outcome.reason";
/// `rule:<id>`, `upstream` (the upstream's own retries block) or `none` (SERVER span).
pub(crate) const RULE: &str = "reprise.rule";
/// The upstream the request was routed to (SERVER span).
pub(crate) const UPSTREAM: &str = "reprise.upstream";
/// Attempts made, the first and any hedge included (SERVER span).
pub(crate) const ATTEMPTS: &str = "reprise.attempts";
/// Attempts the policy allows: its retries plus one (SERVER span).
pub(crate) const MAX_ATTEMPTS: &str = "reprise.max_attempts";
/// True when a hedge was sent (SERVER span).
pub(crate) const HEDGED: &str = "reprise.hedged";
/// The endpoint's pod name, when the configuration knows it (CLIENT span).
pub(crate) const ENDPOINT_POD: &str = "reprise.endpoint.pod";
/// True on a speculative duplicate (CLIENT span).
pub(crate) const HEDGE: &str = "reprise.hedge";
/// True on an attempt abandoned because the other one of a hedge answered first (CLIENT span).
pub(crate) const CANCELLED: &str = "reprise.attempt.cancelled";
/// Which check the endpoint's certificate failed, e.g. `unknown_issuer`,
/// on an attempt that failed `tls_certificate` (CLIENT span).
pub(crate) const CERTIFICATE_ERROR: &str = "reprise.tls.certificate_error";
/// The delay slept before a retry, in milliseconds (`backoff` event).
pub(crate) const BACKOFF_MS: &str = "reprise.backoff_ms";
/// The wait before a hedge was sent, in milliseconds (`hedge` event).
pub(crate) const HEDGE_DELAY_MS: &str = "reprise.hedge.delay_ms";
/// A deadline came from an earlier hop: `accepted`, or why it was ignored
/// (`malformed`, `stale`, `far_future`) (SERVER span).
pub(crate) const DEADLINE_RECEIVED: &str = "reprise.deadline.received";
/// What was left of an accepted propagated deadline when the request came,
/// in milliseconds (SERVER span).
pub(crate) const DEADLINE_LEFT_MS: &str = "reprise.deadline.left_ms";
/// What a propagated deadline stopped: `before_first_attempt`, `retry`,
/// `hedge` or `attempt_cut` (SERVER span; the last one).
pub(crate) const DEADLINE_STOPPED: &str = "reprise.deadline.stopped";
/// Which deadline ended the retries: `policy`, `grpc` (the client's
/// `grpc-timeout`) or `propagated` (`deadline_exceeded` event).
pub(crate) const DEADLINE_SOURCE: &str = "reprise.deadline.source";

/// The SERVER span of one request. Boxed, as [`AttemptSpan`] is: it moves
/// with the request's future on every request, traced or not.
#[derive(Debug)]
pub(crate) struct RequestSpan(Option<Box<Inner>>);

#[derive(Debug)]
struct Inner {
    /// Holds the SERVER span; the parent of every attempt.
    cx: Context,
    tracer: SdkTracer,
    /// The span name, `{method}` then `{method} {upstream}`; attempts share it.
    name: Cow<'static, str>,
    /// False when the sampler dropped the trace: attributes are not built.
    recording: bool,
    /// For a gRPC request, `rpc.service` and `rpc.method` from its path.
    rpc: Option<(String, String)>,
    /// Not recording, and the request's spans may yet be forced.
    deferred: Option<Deferred>,
}

/// What an unsampled request keeps to start recording at its second attempt.
#[derive(Debug)]
struct Deferred {
    forced: ForcedTracer,
    /// The application's context: the SERVER span's parent.
    parent: Context,
    /// When the request arrived: the SERVER span's start.
    arrived: Instant,
    /// The client's HTTP version (`network.protocol.version`).
    version: Version,
    /// Set once the second attempt starts: the forced SERVER span.
    started: OnceLock<Forced>,
}

/// The recording SERVER span of a request the sampler dropped.
#[derive(Debug)]
struct Forced {
    /// Holds it; the parent of every later attempt.
    cx: Context,
    /// `{method} {upstream}`.
    name: Cow<'static, str>,
}

/// Where a request's spans are recorded now: the sampled SERVER span, or
/// the forced one.
#[derive(Clone, Copy)]
struct Live<'a> {
    cx: &'a Context,
    tracer: &'a SdkTracer,
    name: &'a Cow<'static, str>,
}

/// The CLIENT span of one attempt. Ends when the attempt's outcome is known;
/// dropped unfinished (a hedge's loser), it ends marked cancelled. Boxed:
/// the SDK's span is large, and an attempt's span moves with it through
/// several futures on every request, traced or not (measured:
/// `e2e/bench/results/2026-12-03-issue18-own-server.md`).
#[derive(Debug)]
pub(crate) struct AttemptSpan(Option<Box<Span>>);

impl RequestSpan {
    /// A span that records nothing.
    pub(crate) fn off() -> Self {
        RequestSpan(None)
    }

    /// True when tracing was off for this request: the span records nothing
    /// and ending it does nothing.
    pub(crate) fn is_off(&self) -> bool {
        self.0.is_none()
    }

    /// Starts the SERVER span of `req` (a child of the application's
    /// `traceparent` when valid); records nothing while `tracing` is off.
    /// Unsampled, it keeps what a later [`RequestSpan::second_attempt`]
    /// needs, when `tracing` can force spans.
    pub(crate) fn start<B>(tracing: &Tracing, req: &Request<B>) -> Self {
        let Some(tracer) = tracing.tracer() else {
            return Self::off();
        };
        let parent = propagation::extract(req.headers());
        let name: Cow<'static, str> = match known_method(req.method()) {
            Some(m) => Cow::Borrowed(m),
            None => Cow::Borrowed("HTTP"),
        };
        let mut attributes = Vec::with_capacity(5);
        method_attributes(req.method(), &mut attributes);
        attributes.push(KeyValue::new(URL_SCHEME, "http"));
        attributes.push(KeyValue::new(URL_PATH, req.uri().path().to_string()));
        attributes.push(KeyValue::new(
            NETWORK_PROTOCOL_VERSION,
            protocol_version(req.version()),
        ));
        let rpc = grpc_service_method(req);
        rpc_attributes(rpc.as_ref(), &mut attributes);
        let span = tracer
            .span_builder(name.clone())
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(tracer, &parent);
        let recording = span.is_recording();
        let cx = parent.with_span(span);
        let deferred = match tracing.forced() {
            Some(forced) if !recording => Some(Deferred {
                forced: forced.clone(),
                parent,
                arrived: Instant::now(),
                version: req.version(),
                started: OnceLock::new(),
            }),
            _ => None,
        };
        RequestSpan(Some(Box::new(Inner {
            cx,
            tracer: tracer.clone(),
            name,
            recording,
            rpc,
            deferred,
        })))
    }

    /// Where spans are recorded now, if anywhere.
    fn live(&self) -> Option<Live<'_>> {
        let inner = self.0.as_ref()?;
        if inner.recording {
            return Some(Live {
                cx: &inner.cx,
                tracer: &inner.tracer,
                name: &inner.name,
            });
        }
        let deferred = inner.deferred.as_ref()?;
        let forced = deferred.started.get()?;
        Some(Live {
            cx: &forced.cx,
            tracer: deferred.forced.tracer(),
            name: &forced.name,
        })
    }

    /// A second attempt of the request routed to `upstream` (`head` its
    /// method and path) is about to start, a retry or a hedge: an unsampled
    /// request that may be forced starts recording now. Its SERVER span
    /// starts when the request arrived, under the ids its first attempt
    /// named upstream, and is sampled whatever the sampler said; under an
    /// application's unsampled `traceparent` it keeps that parent, so the
    /// sidecar's spans are exported as a subtree whose root is missing.
    pub(crate) fn second_attempt(&self, upstream: &str, head: &RequestHead) {
        let Some(inner) = &self.0 else {
            return;
        };
        let Some(deferred) = inner.deferred.as_ref() else {
            return;
        };
        if deferred.started.get().is_some() {
            return;
        }
        let ids = inner.cx.span().span_context().clone();
        let name = format!("{} {upstream}", inner.name);
        let mut attributes = Vec::with_capacity(9);
        method_attributes(&head.method, &mut attributes);
        attributes.push(KeyValue::new(URL_SCHEME, "http"));
        attributes.push(KeyValue::new(
            URL_PATH,
            head.path_and_query.path().to_string(),
        ));
        attributes.push(KeyValue::new(
            NETWORK_PROTOCOL_VERSION,
            protocol_version(deferred.version),
        ));
        rpc_attributes(inner.rpc.as_ref(), &mut attributes);
        attributes.push(KeyValue::new(UPSTREAM, upstream.to_string()));
        let builder = deferred
            .forced
            .tracer()
            .span_builder(name.clone())
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .with_start_time(wall_clock(deferred.arrived));
        let span = deferred.forced.start_with_ids(
            builder,
            &deferred.parent,
            ids.trace_id(),
            ids.span_id(),
        );
        let _ = deferred.started.set(Forced {
            cx: deferred.parent.with_span(span),
            name: Cow::Owned(name),
        });
    }

    /// Records, once the request is recording, the CLIENT span of an
    /// attempt made before it started ([`AttemptRecord::unrecorded_span`]
    /// names the span id it was given): the first attempt, the only one a
    /// request makes before its second (so never a hedge, nor a resend).
    /// `endpoint`, `authority`, `method` and `path` as for
    /// [`RequestSpan::attempt`].
    pub(crate) fn record_earlier_attempt(
        &self,
        record: &AttemptRecord,
        endpoint: &Endpoint,
        authority: &str,
        method: &Method,
        path: &str,
    ) {
        let (Some(inner), Some(span_id)) = (&self.0, record.unrecorded_span) else {
            return;
        };
        let Some(deferred) = inner.deferred.as_ref() else {
            return;
        };
        let Some(forced) = deferred.started.get() else {
            return;
        };
        let mut attributes = Vec::with_capacity(8);
        method_attributes(method, &mut attributes);
        attributes.push(KeyValue::new(URL_FULL, format!("http://{authority}{path}")));
        rpc_attributes(inner.rpc.as_ref(), &mut attributes);
        endpoint_attributes(endpoint, 0, false, &mut attributes);
        let builder = deferred
            .forced
            .tracer()
            .span_builder(forced.name.clone())
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .with_start_time(wall_clock(record.started));
        let span = deferred.forced.start_with_ids(
            builder,
            &forced.cx,
            TraceId::INVALID,
            SpanId::from_bytes(span_id),
        );
        let end = wall_clock(record.started + record.elapsed);
        AttemptSpan(Some(Box::new(span))).ended_at(record.end, end);
    }

    /// The request was routed to `upstream`: names the span after it.
    pub(crate) fn routed(&mut self, upstream: &str) {
        let Some(inner) = self.0.as_mut().filter(|i| i.recording) else {
            return;
        };
        inner.name = Cow::Owned(format!("{} {upstream}", inner.name));
        let span = inner.cx.span();
        span.update_name(inner.name.clone());
        span.set_attribute(KeyValue::new(UPSTREAM, upstream.to_string()));
    }

    /// Starts the CLIENT span of an attempt to `endpoint` for `authority` (the
    /// host the client addressed; an HTTP/1 request's URI has none), and the
    /// trace fields the attempt carries ([`AttemptSpan::trace_fields`]).
    /// `resends` is the number of attempts before this one (hedges included).
    pub(crate) fn attempt(
        &self,
        endpoint: &Endpoint,
        authority: &str,
        method: &Method,
        path: &str,
        resends: u32,
        hedge: bool,
    ) -> AttemptSpan {
        self.client_span(method, authority, path, |attributes| {
            endpoint_attributes(endpoint, resends, hedge, attributes);
        })
    }

    /// Starts the CLIENT span of a request forwarded once to a host outside
    /// every upstream (`authority` as the application addressed it) and puts
    /// its context in `request`'s `traceparent`.
    pub(crate) fn forwarded<B>(&self, authority: &str, request: &mut Request<B>) -> AttemptSpan {
        let span = self.client_span(
            request.method(),
            authority,
            request.uri().path(),
            |attributes| {
                let (host, port) = match authority.rsplit_once(':') {
                    Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                        (h, p.parse::<i64>().unwrap_or(80))
                    }
                    _ => (authority, 80),
                };
                attributes.push(KeyValue::new(
                    SERVER_ADDRESS,
                    host.trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_string(),
                ));
                attributes.push(KeyValue::new(SERVER_PORT, port));
            },
        );
        if let Some(s) = &span.0 {
            propagation::inject(s.span_context(), request.headers_mut());
        }
        span
    }

    /// A CLIENT span under the SERVER span, with the method and `url.full`
    /// (`http://{authority}{path}`) plus what `more` adds. Attributes are
    /// built only when the request is recording (sampled, or forced).
    fn client_span(
        &self,
        method: &Method,
        authority: &str,
        path: &str,
        more: impl FnOnce(&mut Vec<KeyValue>),
    ) -> AttemptSpan {
        let Some(inner) = &self.0 else {
            return AttemptSpan(None);
        };
        let Some(live) = self.live() else {
            // Even an unsampled attempt gets its own span id, so the
            // upstream's spans still hang off this attempt.
            let builder = inner
                .tracer
                .span_builder(inner.name.clone())
                .with_kind(SpanKind::Client);
            return AttemptSpan(Some(Box::new(
                builder.start_with_context(&inner.tracer, &inner.cx),
            )));
        };
        let mut attributes = Vec::with_capacity(8);
        method_attributes(method, &mut attributes);
        // The query is left out: it may carry credentials.
        attributes.push(KeyValue::new(URL_FULL, format!("http://{authority}{path}")));
        rpc_attributes(inner.rpc.as_ref(), &mut attributes);
        more(&mut attributes);
        let builder = live
            .tracer
            .span_builder(live.name.clone())
            .with_kind(SpanKind::Client)
            .with_attributes(attributes);
        AttemptSpan(Some(Box::new(
            builder.start_with_context(live.tracer, live.cx),
        )))
    }

    /// A retry will be sent after `delay`.
    pub(crate) fn backoff(&self, delay: Duration) {
        self.event("backoff", || vec![KeyValue::new(BACKOFF_MS, millis(delay))]);
    }

    /// A hedge was sent after waiting `delay` for the first attempt.
    pub(crate) fn hedge_launched(&self, delay: Duration) {
        self.event("hedge", || {
            vec![KeyValue::new(HEDGE_DELAY_MS, millis(delay))]
        });
    }

    /// The retry budget refused a retry or a hedge.
    pub(crate) fn budget_refused(&self) {
        self.event("budget_refused", Vec::new);
    }

    /// The request's deadline, from `source`, ended the retries.
    pub(crate) fn deadline_exceeded(&self, source: &'static str) {
        self.event("deadline_exceeded", || {
            vec![KeyValue::new(DEADLINE_SOURCE, source)]
        });
    }

    /// A deadline came from an earlier hop: `result` (`accepted`, or why it
    /// was ignored), and for an accepted one the milliseconds `left`.
    pub(crate) fn deadline_received(&self, result: &'static str, left: Option<i64>) {
        let Some(live) = self.live() else {
            return;
        };
        let span = live.cx.span();
        span.set_attribute(KeyValue::new(DEADLINE_RECEIVED, result));
        if let Some(ms) = left {
            span.set_attribute(KeyValue::new(DEADLINE_LEFT_MS, ms));
        }
    }

    /// A propagated deadline stopped an attempt (`stop` names how).
    pub(crate) fn deadline_stopped(&self, stop: &'static str) {
        if let Some(live) = self.live() {
            live.cx
                .span()
                .set_attribute(KeyValue::new(DEADLINE_STOPPED, stop));
        }
    }

    /// Records what the retry loop did: outcome, rule and attempts.
    pub(crate) fn record_outcome(
        &self,
        report: &Report,
        rule: Option<PolicySource<'_>>,
        max_attempts: u32,
    ) {
        let Some(live) = self.live() else {
            return;
        };
        let span = live.cx.span();
        span.set_attribute(KeyValue::new(OUTCOME, report.outcome.name()));
        let reason = report.outcome.reason();
        if !reason.is_empty() {
            span.set_attribute(KeyValue::new(OUTCOME_REASON, reason));
        }
        span.set_attribute(KeyValue::new(
            RULE,
            rule.map_or(Cow::Borrowed("none"), |r| Cow::Owned(r.to_string())),
        ));
        span.set_attribute(KeyValue::new(ATTEMPTS, i64::from(report.attempts)));
        span.set_attribute(KeyValue::new(MAX_ATTEMPTS, i64::from(max_attempts)));
        if report.hedged {
            span.set_attribute(KeyValue::new(HEDGED, true));
        }
    }

    /// The trace id (hex) when this request's spans are recorded (sampled,
    /// or forced by its second attempt), so its log event and diagnostics
    /// entry can point at the trace.
    pub(crate) fn trace_id(&self) -> Option<String> {
        self.live()
            .map(|l| l.cx.span().span_context().trace_id().to_string())
    }

    /// Ends the span with the status sent to the application. `local_error` is
    /// the failure kind when the sidecar answered itself (`x-reprise-error`).
    /// `grpc_status` is the response's `grpc-status` when its headers carry one
    /// (a Trailers-Only response or a local gRPC answer).
    pub(crate) fn end(
        self,
        status: StatusCode,
        local_error: Option<&str>,
        grpc_status: Option<u8>,
    ) {
        let Some(live) = self.live() else {
            // Unrecorded: the span ends holding nothing.
            return;
        };
        let rpc = self.0.as_ref().is_some_and(|i| i.rpc.is_some());
        let span = live.cx.span();
        span.set_attribute(KeyValue::new(
            HTTP_RESPONSE_STATUS_CODE,
            i64::from(status.as_u16()),
        ));
        if let Some(code) = grpc_status.filter(|_| rpc) {
            span.set_attribute(KeyValue::new(RPC_GRPC_STATUS_CODE, i64::from(code)));
            if let Some(kind) = local_error.filter(|_| code != 0) {
                span.set_attribute(KeyValue::new(ERROR_TYPE, kind.to_string()));
                span.set_status(Status::error(kind.to_string()));
            }
        }
        // Semantic conventions: a SERVER span is an error for 5xx only.
        if status.is_server_error() {
            let kind = local_error.map_or_else(|| status.as_str().to_string(), str::to_string);
            span.set_attribute(KeyValue::new(ERROR_TYPE, kind.clone()));
            span.set_status(Status::error(kind));
        }
        span.end();
    }

    fn event(&self, name: &'static str, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(live) = self.live() {
            live.cx.span().add_event(name, attributes());
        }
    }
}

impl AttemptSpan {
    /// The `traceparent` (and `tracestate`) the attempt sends, replacing the
    /// application's; `None` while tracing is off (the application's pass).
    pub(crate) fn trace_fields(&self) -> Option<propagation::TraceFields> {
        propagation::trace_fields(self.0.as_ref()?.span_context())
    }

    /// The id of this attempt's span when it records nothing (an unsampled
    /// trace), for [`RequestSpan::record_earlier_attempt`]; `None` while
    /// tracing is off or the span records.
    pub(crate) fn unrecorded_id(&self) -> Option<[u8; 8]> {
        let span = self.0.as_deref().filter(|s| !s.is_recording())?;
        Some(span.span_context().span_id().to_bytes())
    }

    /// The endpoint answered with a status the policy does not retry;
    /// `grpc_status` when a gRPC response's status is already known.
    pub(crate) fn responded(mut self, status: u16, grpc_status: Option<u8>) {
        if let Some(mut span) = self.0.take() {
            answered(&mut span, status, grpc_status);
            span.end();
        }
    }

    /// The attempt failed with `kind`; `status` when the endpoint answered one.
    pub(crate) fn failed(mut self, kind: FailureKind, status: Option<u16>) {
        if let Some(mut span) = self.0.take() {
            failed(&mut span, kind, status);
            span.end();
        }
    }

    /// Ends the span as `end` says, at `at`.
    fn ended_at(mut self, end: AttemptEnd, at: SystemTime) {
        let Some(mut span) = self.0.take() else {
            return;
        };
        match end {
            AttemptEnd::Answered {
                status,
                grpc_status,
            } => answered(&mut span, status, grpc_status),
            AttemptEnd::Failed { kind, status } => failed(&mut span, kind, status),
            AttemptEnd::Cancelled => span.set_attribute(KeyValue::new(CANCELLED, true)),
        }
        span.end_with_timestamp(at);
    }
}

/// Marks a CLIENT span whose endpoint answered `status` (and `grpc_status`).
fn answered(span: &mut Span, status: u16, grpc_status: Option<u8>) {
    span.set_attribute(KeyValue::new(HTTP_RESPONSE_STATUS_CODE, i64::from(status)));
    if let Some(code) = grpc_status {
        span.set_attribute(KeyValue::new(RPC_GRPC_STATUS_CODE, i64::from(code)));
    }
    // Semantic conventions: a CLIENT span is an error from 400 on.
    if status >= 400 {
        span.set_attribute(KeyValue::new(ERROR_TYPE, status.to_string()));
        span.set_status(Status::error(""));
    }
}

/// Marks a CLIENT span whose attempt failed with `kind` (`status` when the
/// endpoint answered one).
fn failed(span: &mut Span, kind: FailureKind, status: Option<u16>) {
    if let Some(status) = status {
        span.set_attribute(KeyValue::new(HTTP_RESPONSE_STATUS_CODE, i64::from(status)));
    }
    if let FailureKind::GrpcStatus(code) = kind {
        span.set_attribute(KeyValue::new(RPC_GRPC_STATUS_CODE, i64::from(code)));
    }
    if let Some(detail) = kind.detail() {
        span.set_attribute(KeyValue::new(CERTIFICATE_ERROR, detail));
    }
    let name = kind.name();
    span.set_attribute(KeyValue::new(ERROR_TYPE, name.clone()));
    span.set_status(Status::error(name));
}

impl Drop for AttemptSpan {
    fn drop(&mut self) {
        if let Some(mut span) = self.0.take() {
            span.set_attribute(KeyValue::new(CANCELLED, true));
            span.end();
        }
    }
}

/// The CLIENT span attributes that name the endpoint and the attempt:
/// `resends` attempts before it, a speculative duplicate when `hedge`.
fn endpoint_attributes(endpoint: &Endpoint, resends: u32, hedge: bool, out: &mut Vec<KeyValue>) {
    out.push(KeyValue::new(
        SERVER_ADDRESS,
        endpoint.addr.ip().to_string(),
    ));
    out.push(KeyValue::new(SERVER_PORT, i64::from(endpoint.addr.port())));
    if resends > 0 {
        out.push(KeyValue::new(HTTP_REQUEST_RESEND_COUNT, i64::from(resends)));
    }
    if let Some(pod) = &endpoint.name {
        out.push(KeyValue::new(ENDPOINT_POD, pod.clone()));
    }
    if hedge {
        out.push(KeyValue::new(HEDGE, true));
    }
}

/// The wall-clock time of `at`, a reading of the monotonic clock in the
/// past: spans recorded after the fact carry when things happened.
fn wall_clock(at: Instant) -> SystemTime {
    let ago = Instant::now().saturating_duration_since(at);
    SystemTime::now()
        .checked_sub(ago)
        .unwrap_or_else(SystemTime::now)
}

/// For a gRPC request (`content-type: application/grpc...`), the service and
/// method its path `/package.Service/Method` names.
fn grpc_service_method<B>(req: &Request<B>) -> Option<(String, String)> {
    let grpc = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if !grpc {
        return None;
    }
    let (service, method) = req.uri().path().strip_prefix('/')?.split_once('/')?;
    Some((service.to_string(), method.to_string()))
}

/// The OpenTelemetry RPC attributes of a gRPC call.
fn rpc_attributes(rpc: Option<&(String, String)>, out: &mut Vec<KeyValue>) {
    if let Some((service, method)) = rpc {
        out.push(KeyValue::new(RPC_SYSTEM, "grpc"));
        out.push(KeyValue::new(RPC_SERVICE, service.clone()));
        out.push(KeyValue::new(RPC_METHOD, method.clone()));
    }
}

/// The method as the semantic conventions want it: one of the known methods,
/// else `_OTHER` with the original alongside.
fn method_attributes(method: &Method, out: &mut Vec<KeyValue>) {
    match known_method(method) {
        Some(m) => out.push(KeyValue::new(HTTP_REQUEST_METHOD, m)),
        None => {
            out.push(KeyValue::new(HTTP_REQUEST_METHOD, "_OTHER"));
            out.push(KeyValue::new(
                HTTP_REQUEST_METHOD_ORIGINAL,
                method.as_str().to_string(),
            ));
        }
    }
}

fn known_method(method: &Method) -> Option<&'static str> {
    Some(match method.as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        "PATCH" => "PATCH",
        "CONNECT" => "CONNECT",
        "TRACE" => "TRACE",
        _ => return None,
    })
}

fn protocol_version(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
