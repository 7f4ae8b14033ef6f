//! Reprise's sidecar proxy: the retry engine in front of an application's
//! outbound HTTP.
//!
//! The contract: an application sends its requests here (as an HTTP proxy,
//! or by Host); each is routed to an upstream by name, gets the first
//! matching retry rule's policy (else the upstream's `retries` block), and
//! runs the retry loop: attempt cap, rolling budget, full-jitter backoff,
//! total deadline, body replay, alternate endpoints and optional hedging, all
//! before response headers reach the client. The folders follow a request:
//!
//! - [`server`]: listeners, protocol sniffing, the drain, the admin endpoint.
//! - `proxy`: the request's phases: route, admit, prepare, forward, respond.
//! - [`retry`]: the engine: attempts, gates, hedging, backoff, budget, replay.
//! - `balance`: endpoints, the picker, per-upstream state, HTTP clients.
//! - [`config`]: where the configuration comes from and how it changes.
//! - [`observe`]: metrics and stats, the access log, log output, spans.
//!
//! `docs/architecture.md` walks the request and control paths through them.
#![forbid(unsafe_code)]

mod balance;
mod clock;
pub mod config;
pub mod observe;
mod proxy;
mod random;
pub mod retry;
pub mod run;
pub mod server;

pub use observe::metrics::{EndpointStats, UpstreamStats};
pub use proxy::local::ERROR_HEADER;
pub use proxy::Proxy;
pub use server::{serve_proxy, DRAIN_IDLE_GRACE, HEADER_READ_TIMEOUT};

/// Errors the sidecar library reports to its binary.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration could not be loaded.
    #[error(transparent)]
    Config(#[from] reprise_crds::Error),
    /// Tracing could not be set up from the `OTEL_*` variables.
    #[error(transparent)]
    Telemetry(#[from] reprise_telemetry::Error),
}
