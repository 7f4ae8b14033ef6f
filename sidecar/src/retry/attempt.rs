//! One attempt: its request ([`request`]: the template's head, shared by
//! every attempt, and the fields this attempt sets over it), sent to one
//! endpoint, awaited up to its timeout. For a gRPC request whose policy
//! retries gRPC statuses, the response's first frame is awaited too (within
//! what is left of that timeout): trailers before any message are a status
//! the gates may retry; a message commits the response.

mod request;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::time::Instant;

pub(crate) use self::request::{KeptFields, RequestTemplate};
use super::upstream::UpstreamState;
use crate::balance::client::io::EndpointIo;
use crate::balance::client::{early_body_failure, EndpointBody};
use crate::exchange::body::{impl_body, BoxError, Frames};
use crate::exchange::failure::{FailureKind, Stage};
use crate::exchange::prefixed::Prefixed;
use crate::exchange::request::AttemptRequest;
use crate::observe::spans::AttemptSpan;

/// An upstream response's body, with its first frame when it was awaited
/// before the response was judged.
#[derive(Debug)]
pub(crate) struct UpstreamBody {
    /// Boxed: only gRPC responses have one, and a response moves through
    /// several futures on every request.
    first: Option<Box<Frame<Bytes>>>,
    rest: EndpointBody,
}

impl UpstreamBody {
    fn new(rest: EndpointBody) -> Self {
        Self { first: None, rest }
    }

    /// After a `101`: the endpoint's connection in its new protocol.
    pub(crate) fn take_upgrade(&mut self) -> Option<Prefixed<EndpointIo>> {
        self.rest.take_upgrade()
    }

    /// The response head may still hold hop-by-hop fields to strip.
    pub(crate) fn hop_by_hop_in_head(&self) -> bool {
        self.rest.hop_by_hop_in_head()
    }

    /// The trailers, when they came first (no message before them).
    pub(crate) fn early_trailers(&self) -> Option<&HeaderMap> {
        self.first.as_deref().and_then(Frame::trailers_ref)
    }
}

impl Frames for UpstreamBody {
    fn poll_next_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(frame) = self.first.take() {
            return Poll::Ready(Some(Ok(*frame)));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_ended(&self) -> bool {
        self.first.is_none() && self.rest.is_end_stream()
    }

    fn size(&self) -> SizeHint {
        let first = self
            .first
            .as_deref()
            .and_then(Frame::data_ref)
            .map_or(0, |d| d.len() as u64);
        if first == 0 {
            return self.rest.size_hint();
        }
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(first + rest.lower());
        if let Some(upper) = rest.upper() {
            hint.set_upper(first + upper);
        }
        hint
    }
}

impl_body!(UpstreamBody);

/// One finished attempt, before it is classified.
#[derive(Debug)]
pub(crate) struct Attempted {
    /// The endpoint it went to.
    pub(crate) endpoint: usize,
    /// Response headers, or how it failed and how far it got.
    pub(crate) result: Result<Response<UpstreamBody>, (FailureKind, Stage)>,
    /// Its CLIENT span, still open.
    pub(crate) span: AttemptSpan,
    /// Time from sending to response headers or failure.
    pub(crate) elapsed: Duration,
}

/// Sends `request` to `endpoint` at `started` (the caller's clock reading)
/// and waits for its response headers, at most `timeout` from then (which
/// names the failure it becomes); with `first_frame`, also
/// for the body's first frame in what is left of it (past that the response
/// is passed on as it is: a long poll is not a failure).
pub(crate) async fn send(
    up: &UpstreamState,
    endpoint: usize,
    request: AttemptRequest<'_>,
    span: AttemptSpan,
    started: Instant,
    timeout: Option<(Duration, FailureKind)>,
    first_frame: bool,
) -> Attempted {
    let state = &up.endpoints[endpoint];
    let _in_flight = state.start();
    let response = state.client.request(request, started);
    let result = match timeout {
        // At `started` plus the limit: `timeout` would read the clock again.
        // A kept timer (see `timer`), polled outside the task's cooperative
        // budget, as `tokio::time::Timeout` polls its own once the future
        // it guards used the budget up: a response that keeps using it can
        // never keep its timeout from firing.
        Some((limit, kind)) => {
            let mut timer =
                std::pin::pin!(tokio::task::unconstrained(state.timers.at(started + limit)));
            let mut response = std::pin::pin!(response);
            std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = response.as_mut().poll(cx) {
                    return Poll::Ready(r);
                }
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err((kind, Stage::AfterWrite))),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await
        }
        None => response.await,
    };
    let result = match result {
        Ok(response) if first_frame => {
            let left = timeout.map(|(limit, _)| limit.saturating_sub(started.elapsed()));
            await_first_frame(response, left).await
        }
        Ok(response) => Ok(response.map(UpstreamBody::new)),
        Err(e) => Err(e),
    };
    Attempted {
        endpoint,
        result,
        span,
        elapsed: started.elapsed(),
    }
}

/// The response with its first frame read, unless its headers already end
/// it or `within` runs out first.
async fn await_first_frame(
    response: Response<EndpointBody>,
    within: Option<Duration>,
) -> Result<Response<UpstreamBody>, (FailureKind, Stage)> {
    let (parts, mut rest) = response.into_parts();
    if rest.is_end_stream() {
        return Ok(Response::from_parts(parts, UpstreamBody::new(rest)));
    }
    let frame = match within {
        Some(limit) => tokio::time::timeout(limit, rest.frame()).await.ok(),
        None => Some(rest.frame().await),
    };
    let first = match frame {
        Some(Some(Ok(frame))) => Some(Box::new(frame)),
        // The body failed before any of it reached the client: an attempt
        // failure like a reset before headers, not a mid-stream error.
        Some(Some(Err(e))) => return Err(early_body_failure(&e)),
        Some(None) | None => None,
    };
    Ok(Response::from_parts(parts, UpstreamBody { first, rest }))
}
