//! The answers the sidecar gives itself, when no upstream response can be
//! passed on: one type, so every local answer carries its status, its error
//! kind in `x-reprise-error` and a one-line explanation the same way. A gRPC
//! client gets them the gRPC way: HTTP 200, Trailers-Only, a `grpc-status`
//! (UNAVAILABLE, or DEADLINE_EXCEEDED for timeouts) and the failure kind in
//! `grpc-message`; never an HTTP 5xx, which gRPC libraries turn into opaque
//! errors.

use std::borrow::Cow;

use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

use reprise_crds::grpc;

use super::body::ProxyBody;
use crate::exchange::failure::FailureKind;
use crate::retry::upstream::UpstreamState;

pub use crate::http1::server::ERROR_HEADER;

/// Why the sidecar answers a request itself.
#[derive(Debug)]
pub(crate) enum Local<'a> {
    /// Neither an absolute URI nor a Host header names a host.
    MissingHost,
    /// An HTTP/2 request whose `host` names another authority than its
    /// `:authority` (RFC 9113 §8.3.1).
    HostMismatch,
    /// No upstream answers to this host.
    UnknownUpstream(&'a str),
    /// A host outside every upstream with a URI that cannot be forwarded.
    BadUri,
    /// The client's request body failed while it was being buffered.
    RequestBody,
    /// The client's request body stopped arriving while it was being
    /// buffered for replay.
    RequestBodyTimeout,
    /// CONNECT to a host outside every upstream (not forwarded).
    ConnectOutside,
    /// The upstream's attempts ended without a response to pass on.
    Failed {
        upstream: &'a str,
        kind: FailureKind,
        attempts: u32,
    },
    /// The upstream has no endpoints.
    NoEndpoint(&'a str),
    /// The upstream's endpoints are DNS names none of which has resolved yet.
    DnsUnresolved(&'a str),
    /// Forwarding to a host outside every upstream failed.
    Forward {
        authority: &'a str,
        kind: FailureKind,
    },
}

impl<'a> Local<'a> {
    /// The answer for `upstream` when it has no endpoint to send to: its
    /// host names not resolved yet (or resolving to nothing), or none at all.
    pub(crate) fn no_endpoint(upstream: &'a UpstreamState) -> Self {
        if upstream.endpoints.is_empty() && !upstream.config.dns.is_empty() {
            Local::DnsUnresolved(&upstream.config.name)
        } else {
            Local::NoEndpoint(&upstream.config.name)
        }
    }

    /// The status the client gets.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Local::MissingHost | Local::HostMismatch | Local::BadUri | Local::RequestBody => {
                StatusCode::BAD_REQUEST
            }
            Local::UnknownUpstream(_) => StatusCode::BAD_GATEWAY,
            Local::RequestBodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Local::ConnectOutside => StatusCode::METHOD_NOT_ALLOWED,
            Local::Failed { kind, .. } | Local::Forward { kind, .. } => kind.status(),
            Local::NoEndpoint(_) | Local::DnsUnresolved(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The error kind in `x-reprise-error`.
    pub(crate) fn kind(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            Local::MissingHost => "missing_host",
            Local::HostMismatch => "host_mismatch",
            Local::UnknownUpstream(_) => "unknown_upstream",
            Local::BadUri => "bad_uri",
            Local::RequestBody => "request_body_error",
            Local::RequestBodyTimeout => "request_body_timeout",
            Local::ConnectOutside => "connect_unsupported",
            Local::Failed { kind, .. } | Local::Forward { kind, .. } => return kind.name(),
            Local::NoEndpoint(_) => "no_endpoint",
            Local::DnsUnresolved(_) => "dns_unresolved",
        })
    }

    /// The one-line body.
    fn message(&self) -> String {
        match self {
            Local::MissingHost => {
                "reprise: the request names no host (absolute URI or Host header)\n".into()
            }
            Local::HostMismatch => {
                "reprise: the host field names another authority than :authority\n".into()
            }
            Local::UnknownUpstream(host) => format!("reprise: no upstream named \"{host}\"\n"),
            Local::BadUri => "reprise: cannot forward this URI\n".into(),
            Local::RequestBody => "reprise: reading the request body failed\n".into(),
            Local::RequestBodyTimeout => {
                "reprise: the request body stopped arriving before it was whole\n".into()
            }
            Local::ConnectOutside => {
                "reprise: CONNECT to a host outside the mesh is not supported; add it to NO_PROXY\n"
                    .into()
            }
            // The request's deadline had passed before a first attempt could
            // start: nothing was sent.
            Local::Failed {
                upstream,
                kind: FailureKind::DeadlineExceeded,
                attempts: 0,
            } => format!(
                "reprise: the request's deadline passed before an attempt to upstream \"{upstream}\" could start\n"
            ),
            Local::Failed {
                upstream,
                kind,
                attempts,
            } => format!(
                "reprise: upstream \"{upstream}\" failed: {} after {attempts} attempt(s)\n",
                kind.name()
            ),
            Local::NoEndpoint(upstream) => {
                format!("reprise: upstream \"{upstream}\" has no endpoints\n")
            }
            Local::DnsUnresolved(upstream) => format!(
                "reprise: upstream \"{upstream}\" has no endpoints: its DNS names have not resolved\n"
            ),
            Local::Forward { authority, kind } => format!(
                "reprise: forwarding to {authority} failed: {}\n",
                kind.name()
            ),
        }
    }

    /// The gRPC status this answer stands for.
    fn grpc_status(&self) -> u8 {
        match self.status() {
            StatusCode::GATEWAY_TIMEOUT => grpc::DEADLINE_EXCEEDED,
            StatusCode::BAD_REQUEST => grpc::INTERNAL,
            StatusCode::METHOD_NOT_ALLOWED => grpc::UNIMPLEMENTED,
            _ => grpc::UNAVAILABLE,
        }
    }

    /// The response for a client that speaks gRPC when `grpc`, else HTTP.
    pub(crate) fn answer(self, grpc: bool) -> Response<ProxyBody> {
        if grpc {
            self.into_grpc_response()
        } else {
            self.into_response()
        }
    }

    /// A Trailers-Only gRPC response: HTTP 200, `grpc-status`, the failure
    /// kind in `grpc-message` and `x-reprise-error`, no body.
    pub(crate) fn into_grpc_response(self) -> Response<ProxyBody> {
        let mut response = Response::new(ProxyBody::Local(None));
        let kind = self.kind();
        let h = response.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(
            "grpc-status",
            HeaderValue::from(u16::from(self.grpc_status())),
        );
        // Kinds are lower-case words and underscores: nothing to percent-encode.
        if let Ok(v) = HeaderValue::from_str(&kind) {
            h.insert("grpc-message", v.clone());
            h.insert(ERROR_HEADER, v);
        }
        response
    }

    /// The response: status, `x-reprise-error`, a plain-text explanation.
    pub(crate) fn into_response(self) -> Response<ProxyBody> {
        let mut response = Response::new(ProxyBody::text(self.message()));
        *response.status_mut() = self.status();
        if let Ok(v) = HeaderValue::from_str(&self.kind()) {
            response.headers_mut().insert(ERROR_HEADER, v);
        }
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    fn deadline(attempts: u32) -> Local<'static> {
        Local::Failed {
            upstream: "stock",
            kind: FailureKind::DeadlineExceeded,
            attempts,
        }
    }

    async fn text(response: Response<ProxyBody>) -> String {
        let body = response.into_body().collect().await.expect("a local body");
        String::from_utf8(body.to_bytes().to_vec()).expect("utf-8")
    }

    #[tokio::test]
    async fn a_deadline_answers_504_deadline_exceeded_before_or_after_attempts() {
        for (attempts, says) in [
            (0, "deadline passed before an attempt to upstream \"stock\""),
            (
                2,
                "upstream \"stock\" failed: deadline_exceeded after 2 attempt(s)",
            ),
        ] {
            let response = deadline(attempts).answer(false);
            assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
            assert_eq!(response.headers()[ERROR_HEADER], "deadline_exceeded");
            assert_eq!(
                response.headers()[CONTENT_TYPE],
                "text/plain; charset=utf-8"
            );
            let body = text(response).await;
            assert!(body.contains(says), "{attempts}: {body}");
        }
    }

    #[tokio::test]
    async fn a_grpc_client_gets_its_deadline_as_deadline_exceeded_in_trailers_only() {
        for attempts in [0, 3] {
            let response = deadline(attempts).answer(true);
            assert_eq!(response.status(), StatusCode::OK, "gRPC: never an HTTP 5xx");
            let h = response.headers();
            assert_eq!(
                h["grpc-status"],
                grpc::DEADLINE_EXCEEDED.to_string().as_str()
            );
            assert_eq!(h["grpc-message"], "deadline_exceeded");
            assert_eq!(h[ERROR_HEADER], "deadline_exceeded");
            assert_eq!(h[CONTENT_TYPE], "application/grpc");
            assert_eq!(text(response).await, "", "Trailers-Only: no body");
        }
    }

    #[test]
    fn timeouts_are_504_and_deadline_exceeded_other_failures_502_and_unavailable() {
        let answer = |kind| Local::Failed {
            upstream: "stock",
            kind,
            attempts: 1,
        };
        for kind in [
            FailureKind::DeadlineExceeded,
            FailureKind::ReadTimeout,
            FailureKind::ConnectTimeout,
        ] {
            assert_eq!(answer(kind).status(), StatusCode::GATEWAY_TIMEOUT);
            assert_eq!(answer(kind).grpc_status(), grpc::DEADLINE_EXCEEDED);
        }
        let refused = answer(FailureKind::ConnectRefused);
        assert_eq!(refused.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(refused.grpc_status(), grpc::UNAVAILABLE);
        assert_eq!(refused.kind(), "connect_refused");
    }
}
