//! The respond phase: what the client gets once the retry loop has decided.
//! An upstream response goes out with its hop-by-hop headers removed and its
//! body watched for mid-stream failure; a `101` to an upgrade request bridges
//! the two connections; anything else is a local answer.

use std::sync::Arc;

use http::{Response, StatusCode};

use super::body::ProxyBody;
use super::local::Local;
use super::tunnel::upgrade::ClientUpgrade;
use super::tunnel::{self, Tunnels};
use crate::exchange::hop_by_hop;
use crate::exchange::report::Report;
use crate::retry::attempt::UpstreamBody;
use crate::retry::upstream::UpstreamState;
use crate::retry::{verdict, Final};

/// The response to the client for `fin`; `grpc` for a gRPC request (its
/// local answers are gRPC statuses, and its response's status is counted).
pub(crate) fn respond(
    fin: Final,
    report: &Report,
    client_upgrade: Option<ClientUpgrade>,
    upstream: &Arc<UpstreamState>,
    tunnels: &Tunnels,
    grpc: bool,
) -> Response<ProxyBody> {
    match fin {
        Final::Upstream {
            mut response,
            endpoint,
        } => match client_upgrade {
            Some(client) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
                match response.body_mut().take_upgrade() {
                    Some(server) => {
                        tunnel::bridge(client, server, tunnels);
                        let (parts, _) = response.into_parts();
                        Response::from_parts(parts, ProxyBody::Local(None))
                    }
                    None => forward(response, upstream, endpoint, grpc),
                }
            }
            _ => forward(response, upstream, endpoint, grpc),
        },
        Final::Local(kind) => Local::Failed {
            upstream: &upstream.config.name,
            kind,
            attempts: report.attempts,
        }
        .answer(grpc),
        Final::NoEndpoint => Local::no_endpoint(upstream).answer(grpc),
    }
}

/// An endpoint's response on its way to the client: hop-by-hop headers
/// removed, the body watched.
fn forward(
    response: Response<UpstreamBody>,
    upstream: &Arc<UpstreamState>,
    endpoint: usize,
    grpc: bool,
) -> Response<ProxyBody> {
    if grpc {
        if let Some((code, _)) = verdict::grpc_status(&response) {
            if response.body().early_trailers().is_none() {
                // Trailers-Only: the status is in the headers. A status in
                // trailers is counted as they pass.
                upstream.metrics.record_grpc_status(code);
            }
        }
    }
    let (mut parts, inner) = response.into_parts();
    // The HTTP/1 codec leaves out `Connection: keep-alive` and the like
    // while parsing; only what it kept needs the pass, which over every
    // head was a large part of a request's header work (measured:
    // `e2e/bench/results/2026-12-02-issue18-server-path.md`).
    if inner.hop_by_hop_in_head() {
        hop_by_hop::strip(&mut parts.headers, false);
    }
    Response::from_parts(
        parts,
        ProxyBody::Upstream {
            inner,
            upstream: Arc::clone(upstream),
            endpoint,
            grpc,
            tally: None,
        },
    )
}
