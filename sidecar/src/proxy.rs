//! The outbound proxy: one client request's life as named phases, read top
//! to bottom in [`Proxy::handle_routed`]:
//!
//! 1. **route** ([`route`]): the upstream the host names, or on a captured
//!    connection the one its original destination belongs to; a host
//!    outside every upstream is forwarded once ([`forward`]) or refused;
//!    CONNECT becomes a tunnel ([`tunnel`]).
//! 2. **admit** ([`admit`]): the policy that applies and whether a failure
//!    may be retried at all; then ([`deadline`]) the deadline that came from
//!    an earlier hop, and whether attempts carry one on.
//! 3. **prepare** ([`prepare`]): the request head made repeatable, the body
//!    buffered for replay or left to stream.
//! 4. **forward**: the retry engine ([`crate::retry`]) runs the attempts.
//! 5. **respond** ([`respond`]): the upstream's response passed on (its body
//!    watched for mid-stream failure, [`body`]), an upgrade bridged, or a
//!    local answer ([`local`]); then, for a request that did not end `ok`,
//!    its diagnostics entry, and one access-log line.

pub(crate) mod admit;
pub(crate) mod body;
mod deadline;
pub(crate) mod dns;
mod forward;
pub(crate) mod local;
mod prepare;
mod respond;
pub(crate) mod route;
pub(crate) mod tunnel;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use arc_swap::ArcSwap;
use http::{Method, Request, Response};
use reprise_crds::policy::RetryLayers;
use reprise_crds::Config;
use tokio::time::Instant;

use self::admit::Admission;
use self::body::ProxyBody;
use self::dns::Dns;
use self::local::{Local, ERROR_HEADER};
use self::route::{Destination, EndpointsChange, Routed, Routes};
use self::tunnel::Tunnels;
use crate::balance::client::{passthrough_client, PassthroughClient};
use crate::exchange::body::replay::ReplayReservation;
use crate::exchange::body::ClientBody;
use crate::exchange::deadline::Hops;
use crate::exchange::grpc::{grpc_code, parse_grpc_timeout};
use crate::exchange::hop_by_hop;
use crate::exchange::outcome::Outcome;
use crate::exchange::report::Report;
use crate::observe::access_log::AccessLog;
use crate::observe::diagnostics::{Diagnostics, Finished};
use crate::observe::metrics::{ProxyMetrics, UpstreamStats};
use crate::observe::spans::RequestSpan;
use crate::observe::traffic;
use crate::observe::Tracing;
use crate::random::ThreadRandom;
use crate::retry::upstream::UpstreamState;
use crate::retry::{self, BodySource, Plan};

/// The proxy's shared state: the current routes and process-wide counters.
#[derive(Debug)]
pub struct Proxy {
    routes: ArcSwap<Routes>,
    reservation: Arc<ReplayReservation>,
    pub(crate) metrics: ProxyMetrics,
    draining: AtomicBool,
    ready: AtomicBool,
    passthrough: PassthroughClient,
    tracing: Tracing,
    access_log: AccessLog,
    /// The requests that were retried or failed, for `/diagnostics`.
    diagnostics: Diagnostics,
    tunnels: Tunnels,
    /// The addresses of host-named endpoints, and the task that keeps them.
    pub(crate) dns: Arc<Dns>,
    /// This proxy, for the DNS task, which must not keep it alive.
    me: Weak<Self>,
    /// Held while routes are built and swapped in: a reload and a DNS
    /// rebuild each start from the routes in force, so neither may swap in
    /// routes built from what the other replaced.
    rebuilding: std::sync::Mutex<()>,
}

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
    pub(crate) fn with_telemetry(
        config: Config,
        tracing: Tracing,
        access_log: AccessLog,
    ) -> Arc<Self> {
        let reservation = ReplayReservation::new(config.proxy.replay_reservation_bytes);
        let diagnostics = Diagnostics::new(config.proxy.diagnostics_retained);
        let dns = Arc::new(Dns::default());
        let config = Arc::new(config);
        let proxy = Arc::new_cyclic(|me| Self {
            me: me.clone(),
            routes: ArcSwap::from_pointee(Routes::new(Arc::clone(&config), None, &dns)),
            reservation,
            metrics: ProxyMetrics::default(),
            draining: AtomicBool::new(false),
            ready: AtomicBool::new(true),
            passthrough: passthrough_client(),
            tracing,
            access_log,
            diagnostics,
            tunnels: Tunnels::default(),
            dns,
            rebuilding: std::sync::Mutex::new(()),
        });
        proxy.dns.configured(Arc::downgrade(&proxy), &config);
        proxy
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
        self.diagnostics.retain(config.proxy.diagnostics_retained);
        let config = Arc::new(config);
        {
            let _one_at_a_time = self.rebuilding.lock().unwrap_or_else(|e| e.into_inner());
            let previous = self.routes.load_full();
            self.routes.store(Arc::new(Routes::new(
                Arc::clone(&config),
                Some(&previous),
                &self.dns,
            )));
        }
        self.metrics.reloads_ok.fetch_add(1, Ordering::Relaxed);
        self.dns.configured(self.me.clone(), &config);
    }

    /// Patches the endpoints of running upstreams in place of a reload, at
    /// the cost of the change ([`Routes::with_endpoints`]). False, changing
    /// nothing, when the patches do not fit the routes in force: the caller
    /// reloads the whole configuration instead.
    pub(crate) fn patch_endpoints(&self, patches: &[EndpointsChange]) -> bool {
        let _one_at_a_time = self.rebuilding.lock().unwrap_or_else(|e| e.into_inner());
        let Some(routes) = self.routes.load().with_endpoints(patches) else {
            return false;
        };
        self.routes.store(Arc::new(routes));
        self.metrics.reloads_ok.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Counts one request answered on its first attempt and one recovered
    /// by a retry under every rule in force, as if both had been served.
    /// For the model cluster benchmark only
    /// (`controller/examples/cluster_scale.rs`): its simulated sidecars
    /// serve no traffic, but must send the controller the traffic reports
    /// real ones send.
    #[doc(hidden)]
    pub fn count_model_traffic(&self) {
        let served = |outcome, attempts, ms| traffic::Finished {
            outcome,
            success: true,
            attempts,
            first_error: None,
            elapsed: std::time::Duration::from_millis(ms),
        };
        for rule in &self.routes.load().traffic {
            rule.record(&served(Outcome::Ok, 1, 3));
            rule.record(&served(Outcome::Recovered, 2, 9));
        }
    }

    /// Builds the routes again from the configuration in force, for host
    /// names whose addresses changed; like a reload, what stays keeps its
    /// state. Blocking: run it off the runtime's threads, as reloads are.
    pub(crate) fn rebuild_routes(&self) {
        let _one_at_a_time = self.rebuilding.lock().unwrap_or_else(|e| e.into_inner());
        let previous = self.routes.load_full();
        let config = Arc::clone(&previous.config);
        self.routes
            .store(Arc::new(Routes::new(config, Some(&previous), &self.dns)));
    }

    /// The configuration in force now.
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.routes.load().config)
    }

    /// What upstream `name` (or an alias of it) has done so far.
    pub fn stats(&self, name: &str) -> Option<UpstreamStats> {
        self.routes.load().upstream(name).map(|u| u.stats())
    }

    /// Bytes the request replay buffers hold now.
    pub fn replay_buffer_bytes(&self) -> u64 {
        self.reservation.in_use()
    }

    /// The routes in force now.
    pub(crate) fn routes(&self) -> Arc<Routes> {
        self.routes.load_full()
    }

    /// The replay buffer reservation.
    pub(crate) fn reservation(&self) -> &ReplayReservation {
        &self.reservation
    }

    /// The requests that were retried or failed.
    pub(crate) fn diagnostics(&self) -> &Diagnostics {
        &self.diagnostics
    }

    /// Tunnels and upgraded connections open now.
    pub(crate) fn tunnels(&self) -> &Tunnels {
        &self.tunnels
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

    /// Handles one request routed as `dest` says (the explicit proxy, inside
    /// a CONNECT tunnel, or on a transparently captured connection).
    ///
    /// One async function from the span's start to its end, the phases in
    /// a labelled block: each nested async fn would put its whole future
    /// inside its caller's, and it is copied on the way in, on every
    /// request. The steps that never wait (routing, admission, the log line,
    /// the span's end) are plain functions, which cost nothing over inline
    /// code (e2e/bench/results/2026-12-06-issue41-layers.md).
    pub(crate) async fn handle_routed(
        self: Arc<Self>,
        mut req: Request<ClientBody>,
        dest: Destination,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let _in_flight = self.metrics.in_flight.enter();
        let mut span = RequestSpan::start(&self.tracing, &req);
        // A gRPC client gets its local answers as gRPC statuses. gRPC is
        // HTTP/2 only, so an HTTP/1 request costs no header lookup here.
        let grpc = req.version() == http::Version::HTTP_2 && prepare::is_grpc(req.headers());
        let response = 'serve: {
            // 1. Route. Looked up per request, so a long-lived connection follows
            // reloads (new endpoints, changed policies).
            let routes = self.routes.load_full();
            // The filter is checked first: with `reprise::request=off` the
            // entry's strings (endpoint list, rule, trace id) are not built.
            let logging = routes.config.proxy.access_log && AccessLog::enabled();
            // The arrival time only when something reads it (the log's
            // duration, a gRPC deadline): the attempts' clock is read once the
            // body is prepared, and a clock read is not free (measured:
            // `e2e/bench/results/2026-12-04-issue18-clocks-and-copies.md`).
            let arrived = (logging || grpc).then(Instant::now);
            let upstream = match routes.route(&req, &dest) {
                Routed::Upstream(upstream) => upstream,
                Routed::Captured(addr) => {
                    break 'serve forward::forward_to(&self.passthrough, req, addr, &span).await
                }
                Routed::NoHost => break 'serve Local::MissingHost.answer(grpc),
                Routed::Unknown => {
                    self.metrics
                        .unknown_upstream
                        .fetch_add(1, Ordering::Relaxed);
                    if routes.config.proxy.forward_unknown_hosts {
                        break 'serve forward::forward(&self.passthrough, req, &span).await;
                    }
                    let host = route::request_host(&req).unwrap_or_default();
                    break 'serve Local::UnknownUpstream(host).answer(grpc);
                }
            };
            span.routed(&upstream.config.name);
            if req.method() == Method::CONNECT {
                break 'serve tunnel::connect(req, upstream, &self.tunnels);
            }
            // HTTP/2 has no `Upgrade` (RFC 9113 §8.6; the h2 crate refuses
            // the field as connection-specific): no lookups for it.
            let upgrade =
                req.version() < http::Version::HTTP_2 && hop_by_hop::is_upgrade(req.headers());
            let client_upgrade = upgrade.then(|| tunnel::upgrade::ClientUpgrade::take(&mut req));
            let (parts, body) = req.into_parts();
            let mut template = match prepare::template(parts, &upstream, upgrade, grpc) {
                Ok(template) => template,
                Err(local) => break 'serve local.answer(grpc),
            };

            // 2. Admit.
            let mut admitted = admit::admit(&routes, &upstream, &template, upgrade, &self.metrics);
            if admitted
                .plan
                .policy
                .is_some_and(|p| p.retry_layers == RetryLayers::Once)
            {
                deadline::once_across_layers(&mut admitted, &mut template);
            }

            let switches = deadline::switches(routes.config.proxy.deadlines, admitted.plan.policy);
            let received = deadline::received(&template.head.headers, switches, &upstream, &span);

            // 3. Prepare the body: buffered only when a retry is possible,
            // and not at all when the request's deadline has passed (the
            // retry loop answers at once).
            let retry_policy = admitted.retry_policy();
            let body = if received.as_ref().is_some_and(Hops::passed) {
                BodySource::Direct(Some(body))
            } else {
                match prepare::body(
                    body,
                    retry_policy,
                    &template,
                    &self.reservation,
                    &upstream.config.name,
                )
                .await
                {
                    Ok(b) => b,
                    Err(local) => break 'serve local.answer(grpc),
                }
            };
            // With retries possible, the client's gRPC deadline bounds them: past
            // it the client has given up.
            if let Some(arrived) =
                arrived.filter(|_| grpc && retry_policy.is_some_and(|p| p.enabled()))
            {
                template.grpc_deadline =
                    parse_grpc_timeout(&template.head.headers).map(|d| arrived + d);
            }
            template.hops = deadline::onward(
                received,
                switches,
                &upstream,
                admitted.plan.policy,
                template.grpc_deadline,
            );
            let logged = logging.then(|| {
                (
                    template.head.method.clone(),
                    template.head.path_and_query.clone(),
                )
            });

            // 4. Forward, with retries. One clock reading serves the budget's
            // window and the first attempt's start and timeout.
            let now = Instant::now();
            let plan: Plan<'_> = admitted.plan;
            let (fin, report) = retry::run(
                &upstream,
                template,
                body,
                plan,
                now,
                &span,
                &mut ThreadRandom,
            )
            .await;
            span.record_outcome(
                &report,
                admitted.chosen.map(|c| c.source),
                admitted.max_retries() + 1,
            );

            // 5. Respond.
            let response =
                respond::respond(fin, &report, client_upgrade, &upstream, &self.tunnels, grpc);
            let rule = admitted.chosen.and_then(|c| c.traffic);
            let finished = traffic::Finished::of(&report, false, report.elapsed);
            let response = body::tally(response, &upstream, rule, finished, grpc);
            // The outcome first: a request its first attempt answered goes
            // no further (nothing allocated, no lock taken).
            if report.outcome != Outcome::Ok {
                self.diagnose(&upstream, &admitted, &report, &response, &span);
            }
            if let (Some((method, path)), Some(arrived)) = (logged, arrived) {
                let logged = Logged {
                    method: &method,
                    path: &path,
                    arrived,
                    grpc,
                };
                self.log_request(&upstream, logged, &admitted, &report, &response, &span);
            }
            response
        };
        end_span(span, &response, grpc);
        Ok(response)
    }

    /// The diagnostics entry of a request to `upstream` that did not end `ok`.
    fn diagnose(
        &self,
        upstream: &UpstreamState,
        admitted: &Admission<'_>,
        report: &Report,
        response: &Response<ProxyBody>,
        span: &RequestSpan,
    ) {
        if !self.diagnostics.is_on() {
            return;
        }
        let finished = Finished {
            upstream: &upstream.config.name,
            source: admitted.chosen.map(|c| c.source),
            status: response.status().as_u16(),
            trace_id: span.trace_id(),
        };
        self.diagnostics
            .record(finished, |i| upstream.endpoints[i].label.as_str(), report);
    }

    /// The access log's line for one request to `upstream`.
    fn log_request(
        &self,
        upstream: &UpstreamState,
        logged: Logged<'_>,
        admitted: &Admission<'_>,
        report: &Report,
        response: &Response<ProxyBody>,
        span: &RequestSpan,
    ) {
        self.access_log.request(
            &upstream.config.name,
            |i| upstream.endpoints[i].label.as_str(),
            logged.method,
            logged.path,
            admitted.chosen.map(|c| c.source),
            admitted.max_retries(),
            report,
            response.status(),
            logged.grpc.then(|| grpc_code(response.headers())).flatten(),
            logged.arrived,
            span.trace_id(),
        );
    }
}

/// What the access log needs of the request beyond its outcome.
#[derive(Clone, Copy, Debug)]
struct Logged<'a> {
    method: &'a Method,
    path: &'a http::uri::PathAndQuery,
    arrived: Instant,
    grpc: bool,
}

/// Ends the request's SERVER span with what the client got; its attributes
/// are looked up only while tracing is on.
fn end_span(span: RequestSpan, response: &Response<ProxyBody>, grpc: bool) {
    if span.is_off() {
        return;
    }
    let local_error = response
        .headers()
        .get(ERROR_HEADER)
        .and_then(|v| v.to_str().ok());
    span.end(
        response.status(),
        local_error,
        grpc.then(|| grpc_code(response.headers())).flatten(),
    );
}
