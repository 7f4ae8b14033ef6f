//! One attempt's request as the clients send it: the head every attempt
//! repeats ([`RequestHead`]), borrowed from the retry loop's template or
//! owned by the only attempt, and the fields one attempt sets over it
//! ([`AttemptFields`]: its number, its trace context, the `baggage` that
//! carries its deadline to the next hop, and for gRPC
//! `grpc-previous-rpc-attempts` and the time left in `grpc-timeout`), each
//! replacing the head's field (or fields) of the same name. HTTP/1 encodes the two
//! together without copying the head; HTTP/2 applies the fields to a copy
//! ([`AttemptRequest::into_http2`]), or to the head itself when the attempt
//! owns it.

use std::borrow::Cow;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, Method, Request, Uri, Version};
use reprise_telemetry::propagation::{TraceFields, TRACEPARENT, TRACESTATE};

use super::body::replay::AttemptBody;
use super::deadline::BAGGAGE;
use super::grpc::{self, GRPC_TIMEOUT};

/// Request header carrying the attempt number (1 for the first) on retryable
/// requests, like Envoy's `x-envoy-attempt-count`.
pub(crate) const ATTEMPT_HEADER: http::HeaderName =
    http::HeaderName::from_static("x-reprise-attempt");

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
    /// with the attempt's request through several futures, where a box is
    /// one pointer (measured:
    /// `e2e/bench/results/2026-12-03-issue18-own-server.md`).
    more: Option<Box<MoreFields>>,
}

/// The fields of gRPC and traced attempts, and of those that carry a
/// deadline.
#[derive(Debug, Default)]
struct MoreFields {
    previous_attempts: Option<HeaderValue>,
    grpc_timeout: Option<HeaderValue>,
    trace: Option<TraceFields>,
    /// The application's baggage with the deadline entry set.
    baggage: Option<HeaderValue>,
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

    /// This is attempt `n` (from 1); a gRPC retry also says how many
    /// attempts came before it (gRFC A6).
    pub(crate) fn set_attempt(&mut self, n: u32, grpc: bool) {
        self.attempt = Some(attempt_number(n));
        if grpc && n > 1 {
            self.more().previous_attempts = Some(attempt_number(n - 1));
        }
    }

    /// The client's gRPC deadline has `left` to run.
    pub(crate) fn set_grpc_timeout(&mut self, left: Duration) {
        self.more().grpc_timeout = HeaderValue::try_from(grpc::value_for(left)).ok();
    }

    /// A `host` for a request that had none (only ever added).
    pub(crate) fn set_host(&mut self, host: Option<HeaderValue>) {
        self.host = host;
    }

    /// The attempt's trace context.
    pub(crate) fn set_trace(&mut self, trace: TraceFields) {
        self.more().trace = Some(trace);
    }

    /// The attempt's `baggage`, in place of every field of the head's.
    pub(crate) fn set_baggage(&mut self, baggage: HeaderValue) {
        self.more().baggage = Some(baggage);
    }

    /// True when the template's field `name` gives way to one of these.
    pub(crate) fn replaces(&self, name: &HeaderName) -> bool {
        (self.attempt.is_some() && name == ATTEMPT_HEADER)
            || self.more.as_ref().is_some_and(|m| {
                (m.trace.is_some() && (name == TRACEPARENT || name == TRACESTATE))
                    || (m.grpc_timeout.is_some() && name == GRPC_TIMEOUT)
                    || (m.previous_attempts.is_some() && name == PREVIOUS_ATTEMPTS)
                    || (m.baggage.is_some() && name == BAGGAGE)
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
        if let Some(v) = &more.baggage {
            f(&BAGGAGE, v);
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
        if let Some(v) = more.baggage {
            headers.insert(BAGGAGE, v);
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
    pub(crate) fn into_http2(self, scheme: Scheme) -> Request<AttemptBody> {
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
        parts.scheme = Some(scheme);
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
/// The attempt header's value; the usual numbers without an allocation.
pub(crate) fn attempt_number(n: u32) -> http::HeaderValue {
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
