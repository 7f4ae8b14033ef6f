//! An attempt's request: the head every attempt repeats
//! ([`RequestTemplate`], built once from the client's request) and the
//! fields one attempt sets over it ([`AttemptFields`]: its number, its trace
//! context, and for gRPC `grpc-previous-rpc-attempts` and the time left in
//! `grpc-timeout`), each replacing the template's field of the same name.
//! HTTP/1 encodes the two together without copying the head; HTTP/2 applies
//! the fields to a copy ([`AttemptRequest::into_http2`]), or to the
//! template's own map when no other attempt is in flight
//! ([`RequestTemplate::sole_request`], its fields kept for the next).

use std::borrow::Cow;
use std::sync::atomic::{AtomicU32, Ordering};

use http::header::{HeaderName, HeaderValue};
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, Method, Request, Uri, Version};
use tokio::time::Instant;

use super::grpc_timeout::{self, GRPC_TIMEOUT};
use crate::balance::upstream::UpstreamState;
use crate::observe::spans::{AttemptSpan, RequestSpan};
use crate::retry::replay_body::AttemptBody;
use reprise_telemetry::propagation::{TraceFields, TRACEPARENT, TRACESTATE};

/// Request header carrying the attempt number (1 for the first) on retryable
/// requests, like Envoy's `x-envoy-attempt-count`.
pub const ATTEMPT_HEADER: http::HeaderName = http::HeaderName::from_static("x-reprise-attempt");

/// gRFC A6: how many attempts preceded this one, on every gRPC retry and hedge.
const PREVIOUS_ATTEMPTS: http::HeaderName =
    http::HeaderName::from_static("grpc-previous-rpc-attempts");

/// The request head every attempt repeats.
#[derive(Debug, Clone)]
pub(crate) struct RequestHead {
    /// Method.
    pub(crate) method: Method,
    /// Path and query.
    pub(crate) path_and_query: PathAndQuery,
    /// End-to-end headers (hop-by-hop ones already removed).
    pub(crate) headers: HeaderMap,
}

/// The parts of the client's request every attempt repeats.
#[derive(Debug)]
pub(crate) struct RequestTemplate {
    /// Method, path and headers.
    pub(crate) head: RequestHead,
    /// Version towards the endpoint.
    pub(crate) version: Version,
    /// Attempts built so far (numbers the attempt header). Atomic only so a
    /// hedge can be built while the first attempt borrows the template.
    attempts_sent: AtomicU32,
    /// Attempts carry their number ([`ATTEMPT_HEADER`]): the request may be
    /// retried or hedged.
    numbered: bool,
    /// The host the client addressed: HTTP/2's `:authority` towards the endpoint
    /// (the connector dials the endpoint whatever it says). `None` uses the endpoint's address.
    pub(crate) authority: Option<http::uri::Authority>,
    /// A gRPC request (`content-type: application/grpc...`).
    pub(crate) grpc: bool,
    /// When the client's `grpc-timeout` runs out, if it sent one.
    pub(crate) grpc_deadline: Option<Instant>,
}

/// One attempt's request: the template's head, borrowed (or, for the only
/// attempt, owned), the fields this attempt sets over it, and its body.
/// HTTP/1 encodes it straight onto the connection; HTTP/2 makes a
/// [`Request`] of it ([`AttemptRequest::into_http2`]).
#[derive(Debug)]
pub(crate) struct AttemptRequest<'t> {
    /// Method, path and the template's headers.
    pub(crate) head: Cow<'t, RequestHead>,
    /// Header fields this attempt sends instead of the template's.
    pub(crate) fields: AttemptFields,
    /// The `:authority` of an HTTP/2 request.
    pub(crate) authority: &'t http::uri::Authority,
    /// The body.
    pub(crate) body: AttemptBody,
}

/// The header fields one attempt sets. Each replaces the template's fields
/// of the same name, except `host`, which is only ever added (the template
/// had none).
#[derive(Debug, Default)]
pub(crate) struct AttemptFields {
    attempt: Option<HeaderValue>,
    host: Option<HeaderValue>,
    /// Boxed: only gRPC and traced attempts have them, and the fields move
    /// with the attempt's request through several futures (240 bytes
    /// unboxed, 88 boxed).
    more: Option<Box<MoreFields>>,
}

/// The fields of gRPC and traced attempts.
#[derive(Debug, Default)]
struct MoreFields {
    previous_attempts: Option<HeaderValue>,
    grpc_timeout: Option<HeaderValue>,
    trace: Option<TraceFields>,
}

impl AttemptFields {
    /// Fields as a retry sends them: `attempt`, and the trace context.
    #[cfg(test)]
    pub(crate) fn fixture(attempt: u32, traceparent: &'static str) -> Self {
        AttemptFields {
            attempt: Some(attempt_number(attempt)),
            host: None,
            more: Some(Box::new(MoreFields {
                trace: Some(TraceFields {
                    traceparent: HeaderValue::from_static(traceparent),
                    tracestate: None,
                }),
                ..MoreFields::default()
            })),
        }
    }

    /// The gRPC and trace fields, set up on first use.
    fn more(&mut self) -> &mut MoreFields {
        self.more.get_or_insert_with(Box::default)
    }

    /// True when the template's field `name` gives way to one of these.
    pub(crate) fn replaces(&self, name: &HeaderName) -> bool {
        (self.attempt.is_some() && name == ATTEMPT_HEADER)
            || self.more.as_ref().is_some_and(|m| {
                (m.trace.is_some() && (name == TRACEPARENT || name == TRACESTATE))
                    || (m.grpc_timeout.is_some() && name == GRPC_TIMEOUT)
                    || (m.previous_attempts.is_some() && name == PREVIOUS_ATTEMPTS)
            })
    }

    /// Calls `f` with each field to send after the template's.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&HeaderName, &HeaderValue)) {
        if let Some(v) = &self.host {
            f(&http::header::HOST, v);
        }
        if let Some(v) = &self.attempt {
            f(&ATTEMPT_HEADER, v);
        }
        let Some(more) = &self.more else {
            return;
        };
        if let Some(v) = &more.previous_attempts {
            f(&PREVIOUS_ATTEMPTS, v);
        }
        if let Some(v) = &more.grpc_timeout {
            f(&GRPC_TIMEOUT, v);
        }
        if let Some(t) = &more.trace {
            f(&TRACEPARENT, &t.traceparent);
            if let Some(v) = &t.tracestate {
                f(&TRACESTATE, v);
            }
        }
    }

    /// Sets the fields in `headers`, as [`AttemptFields::replaces`] says.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if let Some(v) = self.host {
            headers.entry(http::header::HOST).or_insert(v);
        }
        if let Some(v) = self.attempt {
            headers.insert(ATTEMPT_HEADER, v);
        }
        let Some(more) = self.more else {
            return;
        };
        if let Some(v) = more.previous_attempts {
            headers.insert(PREVIOUS_ATTEMPTS, v);
        }
        if let Some(v) = more.grpc_timeout {
            headers.insert(GRPC_TIMEOUT, v);
        }
        if let Some(t) = more.trace {
            headers.insert(TRACEPARENT, t.traceparent);
            match t.tracestate {
                Some(v) => headers.insert(TRACESTATE, v),
                None => headers.remove(TRACESTATE),
            };
        }
    }
}

#[cfg(test)]
impl AttemptRequest<'static> {
    /// A request of its own (no template) to `host`: a fixture for the
    /// clients' tests.
    pub(crate) fn fixture(
        method: Method,
        path: &'static str,
        host: &'static str,
        body: AttemptBody,
    ) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::HOST, HeaderValue::from_static(host));
        let authority: &'static http::uri::Authority =
            Box::leak(Box::new(http::uri::Authority::from_static(host)));
        AttemptRequest {
            head: Cow::Owned(RequestHead {
                method,
                path_and_query: PathAndQuery::from_static(path),
                headers,
            }),
            fields: AttemptFields::default(),
            authority,
            body,
        }
    }
}

impl AttemptRequest<'_> {
    /// The request for an HTTP/2 connection: scheme and authority for its
    /// pseudo-headers, the fields applied to the template's headers (copied
    /// unless this attempt owns them).
    pub(crate) fn into_http2(self) -> Request<AttemptBody> {
        let (method, path_and_query, mut headers) = match self.head {
            Cow::Owned(head) => (head.method, head.path_and_query, head.headers),
            Cow::Borrowed(head) => (
                head.method.clone(),
                head.path_and_query.clone(),
                head.headers.clone(),
            ),
        };
        self.fields.apply(&mut headers);
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(Scheme::HTTP);
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(path_and_query);
        let mut request = Request::new(self.body);
        *request.method_mut() = method;
        *request.uri_mut() = Uri::from_parts(parts).unwrap_or_default();
        *request.version_mut() = Version::HTTP_2;
        *request.headers_mut() = headers;
        request
    }
}
impl RequestTemplate {
    /// A template of `head`, sent as `version`.
    pub(crate) fn new(
        head: RequestHead,
        version: Version,
        authority: Option<http::uri::Authority>,
        grpc: bool,
    ) -> Self {
        Self {
            head,
            version,
            attempts_sent: AtomicU32::new(0),
            numbered: false,
            authority,
            grpc,
            grpc_deadline: None,
        }
    }

    /// The request may be retried or hedged: each attempt carries its
    /// number. On HTTP/2 the field goes into the template now, so that each
    /// copy already has the entry and an attempt only overwrites its value
    /// (inserting a new name into a fresh copy would grow it).
    pub(crate) fn number_attempts(&mut self) {
        self.numbered = true;
        if self.version == Version::HTTP_2 {
            self.head.headers.insert(ATTEMPT_HEADER, attempt_number(1));
        }
    }

    /// The request for one attempt to `endpoint`, and the attempt's CLIENT
    /// span under `trace`, whose context it carries.
    pub(crate) fn request<'t>(
        &'t self,
        up: &'t UpstreamState,
        endpoint: usize,
        body: AttemptBody,
        trace: &RequestSpan,
        hedge: bool,
    ) -> (AttemptRequest<'t>, AttemptSpan) {
        self.attempt(Cow::Borrowed(&self.head), up, endpoint, body, trace, hedge)
    }

    /// The request of the only attempt there will be: over HTTP/2 it takes
    /// the template's headers instead of copying them (HTTP/1 never copies).
    pub(crate) fn only_request<'t>(
        &'t mut self,
        up: &'t UpstreamState,
        endpoint: usize,
        body: AttemptBody,
        trace: &RequestSpan,
    ) -> (AttemptRequest<'t>, AttemptSpan) {
        if self.version != Version::HTTP_2 {
            return self.request(up, endpoint, body, trace, false);
        }
        let head = self.take_head();
        let this: &'t Self = self;
        this.attempt(Cow::Owned(head), up, endpoint, body, trace, false)
    }

    /// The request of an attempt with no other in flight (not a hedge's
    /// race) when more may follow: over HTTP/2 it takes the template's
    /// headers too, their fields kept inline in `kept` (no allocation) for
    /// [`RequestTemplate::restore_head`] to give them back before the next
    /// attempt. Copying the header map for every first attempt cost two
    /// allocations, their frees and the map's second drop: about 700
    /// instructions per h2c request (callgrind). A head of more than
    /// [`KEPT_FIELDS`] fields is copied as before.
    pub(crate) fn sole_request<'t>(
        &'t mut self,
        kept: &mut Option<KeptFields>,
        up: &'t UpstreamState,
        endpoint: usize,
        body: AttemptBody,
        trace: &RequestSpan,
    ) -> (AttemptRequest<'t>, AttemptSpan) {
        if self.version != Version::HTTP_2 || !KeptFields::keep(kept, &self.head.headers) {
            return self.request(up, endpoint, body, trace, false);
        }
        let head = self.take_head();
        let this: &'t Self = self;
        this.attempt(Cow::Owned(head), up, endpoint, body, trace, false)
    }

    /// Gives back the head [`RequestTemplate::sole_request`] took, if it did.
    pub(crate) fn restore_head(&mut self, kept: &mut Option<KeptFields>) {
        if let Some(fields) = kept.take() {
            self.head.headers = fields.into_map();
        }
    }

    /// The head for an attempt that takes the template's headers.
    fn take_head(&mut self) -> RequestHead {
        RequestHead {
            method: self.head.method.clone(),
            path_and_query: self.head.path_and_query.clone(),
            headers: std::mem::take(&mut self.head.headers),
        }
    }

    fn attempt<'t>(
        &'t self,
        head: Cow<'t, RequestHead>,
        up: &'t UpstreamState,
        endpoint: usize,
        body: AttemptBody,
        trace: &RequestSpan,
        hedge: bool,
    ) -> (AttemptRequest<'t>, AttemptSpan) {
        let n = self.attempts_sent.fetch_add(1, Ordering::Relaxed) + 1;
        let endpoint_authority = &up.endpoints[endpoint].authority;
        let authority = self.authority.as_ref().unwrap_or(endpoint_authority);
        let mut fields = AttemptFields::default();
        if self.numbered && (n > 1 || self.version != Version::HTTP_2) {
            fields.attempt = Some(attempt_number(n));
            if self.grpc && n > 1 {
                fields.more().previous_attempts = Some(attempt_number(n - 1));
            }
        }
        if let Some(deadline) = self.grpc_deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            fields.more().grpc_timeout = HeaderValue::try_from(grpc_timeout::value_for(left)).ok();
        }
        if self.version != Version::HTTP_2
            && self.authority.is_none()
            && !head.headers.contains_key(http::header::HOST)
        {
            // A client that named no host at all (HTTP/1.0): the endpoint's
            // address, as HTTP/1.1 requires a `Host`.
            fields.host = HeaderValue::from_str(endpoint_authority.as_str()).ok();
        }
        let span = trace.attempt(
            &up.endpoints[endpoint].endpoint,
            authority.as_str(),
            &head.method,
            head.path_and_query.path(),
            n - 1,
            hedge,
        );
        if let Some(trace) = span.trace_fields() {
            fields.more().trace = Some(trace);
        }
        let request = AttemptRequest {
            head,
            fields,
            authority,
            body,
        };
        (request, span)
    }
}

/// Fields a head may have for [`KeptFields`] to keep them: h2load sends
/// one, curl two, a gRPC client five to seven.
pub(crate) const KEPT_FIELDS: usize = 8;

/// A request head's fields, in order, kept inline while its header map is
/// with an attempt.
#[derive(Debug)]
pub(crate) struct KeptFields([Option<(HeaderName, HeaderValue)>; KEPT_FIELDS]);

impl KeptFields {
    /// Keeps `headers`' fields in `kept` (written in place: the fields are
    /// 576 bytes), unless there are more than [`KEPT_FIELDS`].
    fn keep(kept: &mut Option<Self>, headers: &HeaderMap) -> bool {
        if headers.len() > KEPT_FIELDS {
            return false;
        }
        let slots = &mut kept.insert(KeptFields(Default::default())).0;
        for (slot, (name, value)) in slots.iter_mut().zip(headers) {
            *slot = Some((name.clone(), value.clone()));
        }
        true
    }

    /// The header map again, its fields in their order.
    fn into_map(self) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(KEPT_FIELDS);
        for (name, value) in self.0.into_iter().flatten() {
            headers.append(name, value);
        }
        headers
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
