//! The response body the sidecar sends its client ([`ProxyBody`]): an
//! upstream's, watched for mid-stream failure and, for gRPC, for the
//! `grpc-status` in its trailers; or a short local answer.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::exchange::body::{chunk_frame, chunk_hint, impl_body, BoxError, Frames};
use crate::exchange::grpc::grpc_code;
use crate::observe::traffic::{is_success, Finished, RuleTraffic};
use crate::retry::attempt::UpstreamBody;
use crate::retry::upstream::UpstreamState;

/// A response body towards the client.
#[derive(Debug)]
pub(crate) enum ProxyBody {
    /// Streams from an endpoint. A failure here is never retried (headers are
    /// already sent); it counts against the endpoint's passive health.
    Upstream {
        /// The endpoint's body.
        inner: UpstreamBody,
        /// Its upstream.
        upstream: Arc<UpstreamState>,
        /// Index of the endpoint.
        endpoint: usize,
        /// A gRPC response: its trailers' `grpc-status` is counted.
        grpc: bool,
        /// The request, counted when its trailers tell whether it succeeded.
        tally: Option<Box<Tally>>,
    },
    /// A body the sidecar wrote itself.
    Local(Option<Bytes>),
    /// A forwarded response from a host outside any upstream.
    Passthrough(Incoming),
}

impl ProxyBody {
    /// A local text body.
    pub(crate) fn text(text: impl Into<Bytes>) -> Self {
        ProxyBody::Local(Some(text.into()))
    }
}

impl Frames for ProxyBody {
    fn poll_next_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self {
            ProxyBody::Local(data) => chunk_frame(data),
            ProxyBody::Passthrough(inner) => Pin::new(inner)
                .poll_frame(cx)
                .map_err(|e| Box::new(e) as BoxError),
            ProxyBody::Upstream {
                inner,
                upstream,
                endpoint,
                grpc,
                tally,
            } => {
                let polled = Pin::new(inner).poll_frame(cx);
                if let Poll::Ready(Some(Ok(frame))) = &polled {
                    if let Some(code) = frame.trailers_ref().and_then(grpc_code).filter(|_| *grpc) {
                        upstream.metrics.record_grpc_status(code);
                        if let Some(t) = tally.take() {
                            t.count(code == 0);
                        }
                    }
                } else if let Poll::Ready(Some(Err(e))) = &polled {
                    if let Some(t) = tally.take() {
                        t.count(false);
                    }
                    upstream.metrics.record_response_body_error();
                    let state = &upstream.endpoints[*endpoint];
                    state.record_outcome(true);
                    state.record_failure(&upstream.config.passive_health);
                    tracing::warn!(upstream = %upstream.config.name, endpoint = %upstream.endpoints[*endpoint].endpoint.addr, error = %e, "response body failed mid-stream; not retried");
                }
                polled
            }
        }
    }

    fn is_ended(&self) -> bool {
        match self {
            ProxyBody::Local(d) => d.is_none(),
            ProxyBody::Passthrough(inner) => inner.is_end_stream(),
            ProxyBody::Upstream { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size(&self) -> SizeHint {
        match self {
            ProxyBody::Local(d) => chunk_hint(d.as_ref()),
            ProxyBody::Passthrough(inner) => inner.size_hint(),
            ProxyBody::Upstream { inner, .. } => inner.size_hint(),
        }
    }
}

impl_body!(ProxyBody);

/// Counts a finished request in its upstream's outcome metrics and its
/// rule's traffic.
fn count(
    upstream: &UpstreamState,
    rule: Option<&RuleTraffic>,
    mut finished: Finished,
    success: bool,
) {
    finished.success = success;
    upstream.metrics.record_outcome(finished.outcome, success);
    if let Some(rule) = rule {
        rule.record(&finished);
    }
}

/// One request's count, kept by a gRPC response whose status comes in its
/// trailers: whether it succeeded is known only then. A body that ends
/// without them, fails, or is dropped unfinished (the client went away)
/// counts as a failure.
#[derive(Debug)]
pub(crate) struct Tally {
    upstream: Arc<UpstreamState>,
    rule: Option<Arc<RuleTraffic>>,
    finished: Finished,
    counted: bool,
}

impl Tally {
    /// Counts the request, a success or not.
    fn count(mut self, success: bool) {
        self.counted = true;
        count(&self.upstream, self.rule.as_deref(), self.finished, success);
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        if !self.counted {
            count(&self.upstream, self.rule.as_deref(), self.finished, false);
        }
    }
}

/// Counts the request `finished` describes, to `upstream` under `rule`, now
/// from `response`'s status (and its `grpc-status`, for gRPC), or hands it
/// to the body when a gRPC status is still to come in the trailers.
pub(crate) fn tally(
    mut response: http::Response<ProxyBody>,
    upstream: &Arc<UpstreamState>,
    rule: Option<&Arc<RuleTraffic>>,
    finished: Finished,
    grpc: bool,
) -> http::Response<ProxyBody> {
    let status = response.status();
    if grpc && status == http::StatusCode::OK {
        match grpc_code(response.headers()) {
            Some(code) => count(upstream, rule.map(Arc::as_ref), finished, code == 0),
            None => match response.body_mut() {
                ProxyBody::Upstream { tally, .. } => {
                    *tally = Some(Box::new(Tally {
                        upstream: Arc::clone(upstream),
                        rule: rule.cloned(),
                        finished,
                        counted: false,
                    }));
                }
                _ => count(upstream, rule.map(Arc::as_ref), finished, false),
            },
        }
    } else {
        count(
            upstream,
            rule.map(Arc::as_ref),
            finished,
            is_success(status, None),
        );
    }
    response
}
