//! The outbound proxy: routes each request to its upstream, picks the retry
//! policy, prepares the body and runs the retry loop.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::header::{HeaderValue, CONTENT_LENGTH, HOST};
use http::{Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use reprise_crds::{Config, Protocol};
use tokio::time::Instant;

use crate::access_log::{AccessLog, Entry};
use crate::endpoint_picker::{EndpointPicker, Tried};
use crate::hop_by_hop;
use crate::metrics::ProxyMetrics;
use crate::outcome::{Outcome, SkipReason};
use crate::replay_body::{ReplayBody, ReplayReservation};
use crate::response_body::ProxyBody;
use crate::retry::{self, BodySource, Final, Plan, Report, RequestTemplate};
use crate::routes::{PolicySource, Routes};
use crate::telemetry::{RequestSpan, Tracing};
use crate::upstream::UpstreamState;

/// The proxy's shared state: the current routes and process-wide counters.
#[derive(Debug)]
pub struct Proxy {
    routes: ArcSwap<Routes>,
    reservation: Arc<ReplayReservation>,
    /// Process-wide metrics.
    pub metrics: ProxyMetrics,
    draining: AtomicBool,
    ready: AtomicBool,
    passthrough: crate::upstream::PassthroughClient,
    tracing: Tracing,
    access_log: AccessLog,
}

/// Header that tells the client which local failure the sidecar answered for.
pub const ERROR_HEADER: &str = "x-reprise-error";

impl Proxy {
    /// A proxy serving `config`, tracing off.
    pub fn new(config: Config) -> Arc<Self> {
        Self::with_tracing(config, Tracing::off())
    }

    /// A proxy serving `config` that records spans with `tracing`; access log
    /// lines (when `proxy.access_log` is on) go out as `tracing` events.
    pub fn with_tracing(config: Config, tracing: Tracing) -> Arc<Self> {
        Self::with_telemetry(config, tracing, AccessLog::Event)
    }

    /// A proxy serving `config` that records spans with `tracing` and writes
    /// access log lines to `access_log`.
    pub fn with_telemetry(config: Config, tracing: Tracing, access_log: AccessLog) -> Arc<Self> {
        let reservation = ReplayReservation::new(config.proxy.replay_reservation_bytes);
        Arc::new(Self {
            routes: ArcSwap::from_pointee(Routes::new(config, None)),
            reservation,
            metrics: ProxyMetrics::default(),
            draining: AtomicBool::new(false),
            ready: AtomicBool::new(true),
            passthrough: crate::upstream::passthrough_client(),
            tracing,
            access_log,
        })
    }

    /// The tracing pipeline (off unless OTEL_* configured one).
    pub fn tracing(&self) -> &Tracing {
        &self.tracing
    }

    /// Swaps in a new configuration atomically; budgets, pools and endpoint
    /// health carry over. In-flight requests finish on the routes they started with.
    pub fn reload(&self, config: Config) {
        self.reservation
            .set_limit(config.proxy.replay_reservation_bytes);
        let previous = self.routes.load_full();
        self.routes
            .store(Arc::new(Routes::new(config, Some(&previous))));
        self.metrics.reloads_ok.fetch_add(1, Ordering::Relaxed);
    }

    /// The routes in force now.
    pub fn routes(&self) -> Arc<Routes> {
        self.routes.load_full()
    }

    /// The replay buffer reservation.
    pub fn reservation(&self) -> &ReplayReservation {
        &self.reservation
    }

    /// Marks the proxy as draining (readiness goes false).
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Sets whether a configuration worth serving is loaded (Kubernetes mode
    /// starts not ready until its first snapshot).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// True when ready to serve and not draining.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && !self.is_draining()
    }

    /// True after SIGTERM.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Handles one client request.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<ProxyBody>, Infallible> {
        self.metrics.in_flight.fetch_add(1, Ordering::Relaxed);
        let mut span = RequestSpan::start(&self.tracing, &req);
        let response = self.route(req, &mut span).await;
        let local_error = response
            .headers()
            .get(ERROR_HEADER)
            .and_then(|v| v.to_str().ok());
        span.end(response.status(), local_error);
        self.metrics.in_flight.fetch_sub(1, Ordering::Relaxed);
        Ok(response)
    }

    async fn route(
        &self,
        mut req: Request<Incoming>,
        span: &mut RequestSpan,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let routes = self.routes.load_full();
        let Some(host) = request_host(&req) else {
            return local(
                StatusCode::BAD_REQUEST,
                "missing_host",
                "reprise: the request names no host (absolute URI or Host header)\n".into(),
            );
        };
        let Some(upstream) = routes.upstream(host).cloned() else {
            self.metrics
                .unknown_upstream
                .fetch_add(1, Ordering::Relaxed);
            if routes.config.proxy.forward_unknown_hosts {
                return self.forward(req, span).await;
            }
            let msg = format!("reprise: no upstream named \"{host}\"\n");
            return local(StatusCode::BAD_GATEWAY, "unknown_upstream", msg);
        };
        upstream.budget.record_request();
        span.routed(&upstream.config.name);
        if req.method() == Method::CONNECT {
            return self.tunnel(req, &upstream).await;
        }
        let upgrade = hop_by_hop::is_upgrade(req.headers());
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
        if !parts.headers.contains_key(HOST) {
            if let Some(authority) = parts.uri.authority() {
                if let Ok(v) = HeaderValue::from_str(authority.as_str()) {
                    parts.headers.insert(HOST, v);
                }
            }
        }
        hop_by_hop::strip(&mut parts.headers, upgrade);
        // The host the client addressed travels as HTTP/2's :authority or HTTP/1's
        // Host; an HTTP/2 request must not also carry a different Host (RFC 9113 §8.3.1).
        let authority = parts
            .headers
            .get(HOST)
            .and_then(|h| http::uri::Authority::try_from(h.as_bytes()).ok())
            .or_else(|| parts.uri.authority().cloned());
        if upstream.config.protocol == Protocol::H2c {
            parts.headers.remove(HOST);
        }

        let chosen = routes.policy_for(
            &upstream,
            parts.method.as_str(),
            path.path(),
            &parts.headers,
        );
        let policy = chosen.map(|c| c.policy);
        let skip = if upgrade {
            Some(SkipReason::Upgrade)
        } else {
            match policy {
                None => Some(SkipReason::RetriesOff),
                Some(p) if !p.enabled() => Some(SkipReason::RetriesOff),
                Some(p) if !p.methods.contains(parts.method.as_str()) => Some(SkipReason::Method),
                Some(_) => None,
            }
        };
        let body = match (skip, policy) {
            (None, Some(p)) => {
                let length = parts
                    .headers
                    .get(CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                match ReplayBody::prepare(body, length, p.replay_limit_bytes, &self.reservation)
                    .await
                {
                    Ok(b) => BodySource::Replay(b),
                    Err(e) => {
                        tracing::info!(upstream = %upstream.config.name, error = %e, "client request body failed while buffering");
                        return local(
                            StatusCode::BAD_REQUEST,
                            "request_body_error",
                            "reprise: reading the request body failed\n".into(),
                        );
                    }
                }
            }
            _ => BodySource::Direct(Some(body)),
        };
        let template = RequestTemplate {
            method: parts.method.clone(),
            path_and_query: path.clone(),
            version: match upstream.config.protocol {
                Protocol::Http1 => Version::HTTP_11,
                Protocol::H2c => Version::HTTP_2,
            },
            headers: parts.headers,
            attempts_sent: 0,
            authority,
        };

        let (fin, report) =
            retry::run(&upstream, template, body, Plan { policy, skip }, span).await;
        upstream.metrics.record_outcome(report.outcome);
        span.record_outcome(
            &report,
            chosen.map(|c| c.source),
            policy.map_or(0, |p| p.attempts) + 1,
        );
        let response = match fin {
            Final::Upstream {
                mut response,
                endpoint,
            } => {
                if upgrade && response.status() == StatusCode::SWITCHING_PROTOCOLS {
                    if let Some(client) = client_upgrade {
                        let server = hyper::upgrade::on(&mut response);
                        tokio::spawn(bridge_upgrade(client, server));
                    }
                    let (parts, _) = response.into_parts();
                    Response::from_parts(parts, ProxyBody::Local(None))
                } else {
                    let (mut parts, inner) = response.into_parts();
                    hop_by_hop::strip(&mut parts.headers, false);
                    Response::from_parts(
                        parts,
                        ProxyBody::Upstream {
                            inner,
                            upstream: Arc::clone(&upstream),
                            endpoint,
                        },
                    )
                }
            }
            Final::Local(kind) => {
                let msg = format!(
                    "reprise: upstream \"{}\" failed: {} after {} attempt(s)\n",
                    upstream.config.name,
                    kind.name(),
                    report.attempts
                );
                local(kind.status(), &kind.name(), msg)
            }
            Final::NoEndpoint => local(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_endpoint",
                format!(
                    "reprise: upstream \"{}\" has no endpoints\n",
                    upstream.config.name
                ),
            ),
        };
        // The filter is checked first: with `reprise::request=off` the entry's
        // strings (endpoint list, rule, trace id) are not built at all.
        if routes.config.proxy.access_log && AccessLog::enabled() {
            log_request(
                &self.access_log,
                &upstream,
                &parts.method,
                &path,
                chosen.map(|c| c.source),
                policy.map_or(0, |p| p.attempts),
                &report,
                response.status(),
                started,
                span.trace_id(),
            );
        }
        response
    }

    /// A host no policy covers, in Kubernetes mode: forwarded once, as a plain
    /// proxy would, so that HTTP_PROXY does not break the application's other calls.
    async fn forward(&self, req: Request<Incoming>, span: &RequestSpan) -> Response<ProxyBody> {
        if req.method() == Method::CONNECT {
            return local(StatusCode::METHOD_NOT_ALLOWED, "connect_unsupported", "reprise: CONNECT to a host outside the mesh is not supported; add it to NO_PROXY\n".into());
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
            return local(
                StatusCode::BAD_REQUEST,
                "missing_host",
                "reprise: the request names no host\n".into(),
            );
        };
        let (mut parts, body) = req.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let Ok(uri) = format!("http://{authority}{path}").parse::<http::Uri>() else {
            return local(
                StatusCode::BAD_REQUEST,
                "bad_uri",
                "reprise: cannot forward this URI\n".into(),
            );
        };
        if !parts.headers.contains_key(HOST) {
            if let Ok(v) = HeaderValue::from_str(&authority) {
                parts.headers.insert(HOST, v);
            }
        }
        hop_by_hop::strip(&mut parts.headers, false);
        parts.uri = uri;
        parts.version = Version::HTTP_11;
        let mut request = Request::from_parts(parts, crate::replay_body::AttemptBody::Direct(body));
        let attempt = span.forwarded(&authority, &mut request);
        match self.passthrough.request(request).await {
            Ok(response) => {
                attempt.responded(response.status().as_u16());
                let (mut parts, body) = response.into_parts();
                hop_by_hop::strip(&mut parts.headers, false);
                Response::from_parts(parts, ProxyBody::Passthrough(body))
            }
            Err(e) => {
                let (kind, _) = crate::failure::classify_client_error(&e);
                attempt.failed(kind, None);
                local(
                    kind.status(),
                    &kind.name(),
                    format!(
                        "reprise: forwarding to {authority} failed: {}\n",
                        kind.name()
                    ),
                )
            }
        }
    }

    /// CONNECT: a TCP tunnel to one endpoint of the upstream. Never retried.
    async fn tunnel(
        &self,
        req: Request<Incoming>,
        upstream: &Arc<UpstreamState>,
    ) -> Response<ProxyBody> {
        let Some(i) = EndpointPicker::pick(&upstream.endpoints, &Tried::default(), false) else {
            return local(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_endpoint",
                "reprise: no endpoints\n".into(),
            );
        };
        let addr = upstream.endpoints[i].endpoint.addr;
        let connect = tokio::time::timeout(
            upstream.config.connect_timeout,
            tokio::net::TcpStream::connect(addr),
        )
        .await;
        let stream = match connect {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                upstream.endpoints[i].record_failure(&upstream.config.passive_health);
                upstream
                    .metrics
                    .record_outcome(Outcome::Skipped(SkipReason::Method));
                return local(
                    StatusCode::BAD_GATEWAY,
                    "connect_error",
                    format!("reprise: tunnel connect failed: {e}\n"),
                );
            }
            Err(_) => {
                upstream
                    .metrics
                    .record_outcome(Outcome::Skipped(SkipReason::Method));
                return local(
                    StatusCode::GATEWAY_TIMEOUT,
                    "connect_timeout",
                    "reprise: tunnel connect timed out\n".into(),
                );
            }
        };
        upstream.metrics.record_outcome(Outcome::Ok);
        tokio::spawn(async move {
            if let Ok(upgraded) = hyper::upgrade::on(req).await {
                let mut client = TokioIo::new(upgraded);
                let mut stream = stream;
                let _ = tokio::io::copy_bidirectional(&mut client, &mut stream).await;
            }
        });
        Response::new(ProxyBody::Local(None))
    }
}

async fn bridge_upgrade(client: hyper::upgrade::OnUpgrade, server: hyper::upgrade::OnUpgrade) {
    if let (Ok(client), Ok(server)) = (client.await, server.await) {
        let mut client = TokioIo::new(client);
        let mut server = TokioIo::new(server);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
    }
}

/// The host a request addresses: the absolute-form URI's host, else the Host
/// header's, without a port.
fn request_host(req: &Request<Incoming>) -> Option<&str> {
    if let Some(h) = req.uri().host() {
        return Some(h.trim_start_matches('[').trim_end_matches(']'));
    }
    let host = req.headers().get(HOST)?.to_str().ok()?;
    let host = match host.rfind(':') {
        Some(i)
            if !host[i + 1..].is_empty() && host[i + 1..].bytes().all(|b| b.is_ascii_digit()) =>
        {
            &host[..i]
        }
        _ => host,
    };
    (!host.is_empty()).then_some(host)
}

fn local(status: StatusCode, kind: &str, message: String) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::text(message));
    *response.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(kind) {
        response.headers_mut().insert(ERROR_HEADER, v);
    }
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[allow(clippy::too_many_arguments)]
fn log_request(
    access_log: &AccessLog,
    upstream: &UpstreamState,
    method: &Method,
    path: &http::uri::PathAndQuery,
    source: Option<PolicySource<'_>>,
    max_retries: u32,
    report: &Report,
    status: StatusCode,
    started: Instant,
    trace_id: Option<String>,
) {
    let endpoint_label = |i: &usize| upstream.endpoints[*i].label.as_str();
    let endpoints: std::borrow::Cow<'_, str> = match report.tried.as_slice() {
        [one] => endpoint_label(one).into(),
        tried => tried
            .iter()
            .map(endpoint_label)
            .collect::<Vec<_>>()
            .join(",")
            .into(),
    };
    let rule: std::borrow::Cow<'_, str> = match source {
        None => "none".into(),
        Some(PolicySource::Upstream) => "upstream".into(),
        Some(s) => s.to_string().into(),
    };
    access_log.record(&Entry {
        upstream: &upstream.config.name,
        method: method.as_str(),
        path: path.path(),
        rule: &rule,
        attempts: report.attempts,
        max_attempts: max_retries + 1,
        endpoints: &endpoints,
        outcome: report.outcome.name(),
        reason: report.outcome.reason(),
        first_error: &report
            .first_error
            .map_or(std::borrow::Cow::Borrowed(""), |k| k.name()),
        hedged: report.hedged,
        status: status.as_u16(),
        duration_ms: started.elapsed().as_secs_f64() * 1000.0,
        trace_id: trace_id.as_deref().unwrap_or(""),
    });
}
