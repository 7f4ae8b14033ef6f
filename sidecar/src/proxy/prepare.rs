//! The prepare phase: the client's request made ready to send any number of
//! times. Hop-by-hop headers go, the host the client addressed is kept (as
//! `Host` on HTTP/1, `:authority` on HTTP/2), and the body is buffered for
//! replay when the policy allows and it fits, or left to stream.

use http::header::{HeaderValue, CONTENT_LENGTH, HOST, TE};
use http::request::Parts;
use http::uri::{Authority, PathAndQuery};
use http::Version;
use reprise_crds::{Protocol, RetryPolicy};

use super::local::Local;
use crate::exchange::body::replay::{BodyIdle, ReplayBody, ReplayReservation};
use crate::exchange::body::ClientBody;
use crate::exchange::hop_by_hop;
use crate::exchange::request::RequestHead;
use crate::retry::attempt::RequestTemplate;
use crate::retry::upstream::UpstreamState;
use crate::retry::BodySource;

/// True for a gRPC request (`content-type: application/grpc`, `+proto`, ...).
pub(crate) fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(&http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The request head, ready to be repeated for each attempt; refused when
/// it names two hosts.
pub(crate) fn template(
    mut parts: Parts,
    upstream: &UpstreamState,
    upgrade: bool,
    grpc: bool,
) -> Result<RequestTemplate, Local<'static>> {
    let path = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    // HTTP/2 towards the endpoints, h2c or h2 over TLS.
    let h2c = upstream.config.protocol.is_http2();
    // One lookup. An HTTP/1.1 endpoint needs a `Host`: one that came only
    // in the request target (an HTTP/2 client's `:authority`) is added. An
    // h2c endpoint gets none (below), so none is added for it: an h2c
    // client's request costs no insert and no removal (measured:
    // `e2e/bench/results/2026-12-04-issue18-h2c-reference.md`).
    let host_field = parts.headers.get(HOST);
    let has_host = host_field.is_some();
    // The request was routed by its target's authority when it has one
    // (`route::request_host`), so that is the host it carries on. An HTTP/1
    // client's `Host` already agrees with it (the codec saw to that, RFC 9112
    // §3.2.2); an HTTP/2 client's `host` naming another makes the request
    // malformed (RFC 9113 §8.3.1). Checked only when both came, which an
    // HTTP/2 client seldom sends.
    let target = parts.uri.authority();
    if let (true, Version::HTTP_2, Some(target)) = (has_host, parts.version, target) {
        if super::route::names_another_host(target, &parts.headers) {
            return Err(Local::HostMismatch);
        }
    }
    let host = match target {
        Some(target) if parts.version == Version::HTTP_2 => Some(target.clone()),
        // `Host` is the target's host without its userinfo, if any.
        _ => host_field
            .and_then(|h| Authority::try_from(h.as_bytes()).ok())
            .or_else(|| target.cloned()),
    };
    if !has_host && !h2c {
        if let Some(authority) = target {
            let a = authority.as_str();
            let a = a.rfind('@').map_or(a, |at| &a[at + 1..]);
            if let Ok(v) = HeaderValue::from_str(a) {
                parts.headers.insert(HOST, v);
            }
        }
    }
    // gRPC servers refuse a stream without `te: trailers`, the one TE value
    // HTTP/2 allows (RFC 9113 §8.2.2): it is kept towards h2c endpoints,
    // and `auto` ones, which may select HTTP/2.
    let te_trailers = (h2c || upstream.config.protocol == Protocol::Auto)
        && parts.headers.get_all(TE).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
            })
        });
    hop_by_hop::strip(&mut parts.headers, upgrade);
    // The host the client addressed travels as HTTP/2's :authority or HTTP/1's
    // Host; an HTTP/2 request must not also carry a different Host (RFC 9113 §8.3.1).
    // An upstream's `host_rewrite` replaces it on every attempt (an external
    // API answers to its own name, not to the one the application called).
    let authority = match &upstream.config.host_rewrite {
        None => host,
        Some(rewrite) => {
            if !h2c {
                if let Ok(v) = HeaderValue::from_str(rewrite) {
                    parts.headers.insert(HOST, v);
                }
            }
            Authority::try_from(rewrite.as_str()).ok().or(host)
        }
    };
    let version = match upstream.config.protocol {
        Protocol::Http1 => Version::HTTP_11,
        // Prepared as HTTP/1.1 (with `Host`); the endpoint's client turns
        // it into HTTP/2 when the endpoint selected `h2`. `te: trailers`
        // stays for gRPC servers, and means as much to an HTTP/1.1 one.
        Protocol::Auto => {
            if te_trailers {
                parts
                    .headers
                    .insert(TE, HeaderValue::from_static("trailers"));
            }
            Version::HTTP_11
        }
        Protocol::H2c | Protocol::H2 => {
            if has_host {
                parts.headers.remove(HOST);
            }
            if te_trailers {
                parts
                    .headers
                    .insert(TE, HeaderValue::from_static("trailers"));
            }
            Version::HTTP_2
        }
    };
    let head = RequestHead {
        method: parts.method,
        path_and_query: path,
        headers: parts.headers,
    };
    Ok(RequestTemplate::new(head, version, authority, grpc))
}

/// The body as the retry loop will send it: buffered for replay under
/// `policy` when a retry is possible, else streamed as is. Never refuses a
/// request for want of memory; fails only when the client's body does.
pub(crate) async fn body(
    body: ClientBody,
    retry_policy: Option<&RetryPolicy>,
    template: &RequestTemplate,
    reservation: &std::sync::Arc<ReplayReservation>,
    upstream: &str,
) -> Result<BodySource, Local<'static>> {
    let Some(p) = retry_policy else {
        return Ok(BodySource::Direct(Some(body)));
    };
    let length = template
        .head
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match ReplayBody::prepare(body, length, p.replay_limit_bytes, reservation).await {
        Ok(b) => Ok(BodySource::Replay(b)),
        Err(e) if e.downcast_ref::<BodyIdle>().is_some() => {
            tracing::info!(upstream, error = %e, "client request body stopped arriving while buffering");
            Err(Local::RequestBodyTimeout)
        }
        Err(e) => {
            tracing::info!(upstream, error = %e, "client request body failed while buffering");
            Err(Local::RequestBody)
        }
    }
}
