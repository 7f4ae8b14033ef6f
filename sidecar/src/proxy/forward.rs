//! Hosts outside every upstream, in Kubernetes mode: forwarded once, as a
//! plain proxy would, so that `HTTP_PROXY` pointing at the sidecar does not
//! break the application's other calls; and requests on a captured
//! connection whose destination left the configuration, forwarded once to
//! that destination. Never retried.

use std::net::SocketAddr;

use http::header::{HeaderValue, HOST};
use http::{Method, Request, Response, Version};

use super::body::ProxyBody;
use super::local::Local;
use crate::balance::client::PassthroughClient;
use crate::exchange::body::replay::AttemptBody;
use crate::exchange::body::ClientBody;
use crate::exchange::failure::classify_client_error;
use crate::exchange::hop_by_hop;
use crate::observe::spans::RequestSpan;

/// Forwards `req` to the host it names.
pub(crate) async fn forward(
    client: &PassthroughClient,
    req: Request<ClientBody>,
    span: &RequestSpan,
) -> Response<ProxyBody> {
    if req.method() == Method::CONNECT {
        return Local::ConnectOutside.into_response();
    }
    // As for an upstream's requests (`prepare::template`): one host only.
    if let (Version::HTTP_2, Some(target)) = (req.version(), req.uri().authority()) {
        if super::route::names_another_host(target, req.headers()) {
            return Local::HostMismatch.into_response();
        }
    }
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            req.headers()
                .get(HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_string)
        });
    let Some(authority) = authority else {
        return Local::MissingHost.into_response();
    };
    send(client, req, authority, span).await
}

/// Forwards `req` to `addr`, the original destination of a captured
/// connection, its `Host` header unchanged.
pub(crate) async fn forward_to(
    client: &PassthroughClient,
    req: Request<ClientBody>,
    addr: SocketAddr,
    span: &RequestSpan,
) -> Response<ProxyBody> {
    if req.method() == Method::CONNECT {
        return Local::ConnectOutside.into_response();
    }
    send(client, req, addr.to_string(), span).await
}

/// Sends `req` once to `authority` (where the connection goes; the request
/// keeps its own `Host` header when it has one).
async fn send(
    client: &PassthroughClient,
    req: Request<ClientBody>,
    authority: String,
    span: &RequestSpan,
) -> Response<ProxyBody> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("http://{authority}{path}").parse::<http::Uri>() else {
        return Local::BadUri.into_response();
    };
    if !parts.headers.contains_key(HOST) {
        if let Ok(v) = HeaderValue::from_str(&authority) {
            parts.headers.insert(HOST, v);
        }
    }
    hop_by_hop::strip(&mut parts.headers, false);
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    let mut request = Request::from_parts(parts, AttemptBody::Direct(body));
    let attempt = span.forwarded(&authority, &mut request);
    match client.request(request).await {
        Ok(response) => {
            attempt.responded(response.status().as_u16(), None);
            let (mut parts, body) = response.into_parts();
            hop_by_hop::strip(&mut parts.headers, false);
            Response::from_parts(parts, ProxyBody::Passthrough(body))
        }
        Err(e) => {
            let (kind, _) = classify_client_error(&e);
            attempt.failed(kind, None);
            Local::Forward {
                authority: &authority,
                kind,
            }
            .into_response()
        }
    }
}
