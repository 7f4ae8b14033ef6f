//! One attempt: the request built from the client's (each attempt a fresh
//! copy carrying its own attempt number and trace context), sent to one
//! endpoint, awaited up to its timeout.

use std::time::Duration;

use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::failure::{classify_client_error, FailureKind, Stage};
use super::replay_body::AttemptBody;
use crate::balance::upstream::UpstreamState;
use crate::observe::spans::{AttemptSpan, RequestSpan};

/// Request header carrying the attempt number (1 for the first) on retryable
/// requests, like Envoy's `x-envoy-attempt-count`.
pub const ATTEMPT_HEADER: http::HeaderName = http::HeaderName::from_static("x-reprise-attempt");

/// The parts of the client's request every attempt repeats.
#[derive(Debug)]
pub(crate) struct RequestTemplate {
    /// Method.
    pub(crate) method: Method,
    /// Path and query.
    pub(crate) path_and_query: PathAndQuery,
    /// Version towards the endpoint.
    pub(crate) version: Version,
    /// End-to-end headers (hop-by-hop ones already removed).
    pub(crate) headers: HeaderMap,
    /// Attempts built so far (numbers the attempt header).
    pub(crate) attempts_sent: u32,
    /// The host the client addressed: HTTP/2's `:authority` towards the endpoint
    /// (the connector dials the endpoint whatever it says). `None` uses the endpoint's address.
    pub(crate) authority: Option<http::uri::Authority>,
}

/// One finished attempt, before it is classified.
#[derive(Debug)]
pub(crate) struct Attempted {
    /// The endpoint it went to.
    pub(crate) endpoint: usize,
    /// Response headers, or how it failed and how far it got.
    pub(crate) result: Result<Response<Incoming>, (FailureKind, Stage)>,
    /// Its CLIENT span, still open.
    pub(crate) span: AttemptSpan,
    /// Time from sending to response headers or failure.
    pub(crate) elapsed: Duration,
}

/// Sends `request` to `endpoint` and waits for its response headers, at most
/// `timeout` (which names the failure it becomes).
pub(crate) async fn send(
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
            Err(_) => Err((kind, Stage::AfterWrite)),
        },
        None => response.await.map_err(|e| classify_client_error(&e)),
    };
    Attempted {
        endpoint,
        result,
        span,
        elapsed: started.elapsed(),
    }
}

impl RequestTemplate {
    /// The request for one attempt to `endpoint`, and the attempt's CLIENT
    /// span under `trace`, whose context it carries. `last` lets the only
    /// attempt take the headers instead of copying them.
    pub(crate) fn request(
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
        // The first attempt's number goes into the template, so that each copy
        // already has the entry and a retry only overwrites its value
        // (inserting a new name into a fresh copy would grow it).
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
