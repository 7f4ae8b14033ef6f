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
            } => {
                let polled = Pin::new(inner).poll_frame(cx);
                if let Poll::Ready(Some(Ok(frame))) = &polled {
                    if let Some(code) = frame.trailers_ref().and_then(grpc_code).filter(|_| *grpc) {
                        upstream.metrics.record_grpc_status(code);
                    }
                } else if let Poll::Ready(Some(Err(e))) = &polled {
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
