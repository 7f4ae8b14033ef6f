//! Reprise's sidecar proxy: the retry engine in front of an application's
//! outbound HTTP.
//!
//! The contract: an application sends its requests here (as an HTTP proxy,
//! or by Host); each is routed to an upstream by name, gets the first
//! matching retry rule's policy (else the upstream's `retries` block), and
//! runs the retry loop: attempt cap, rolling budget, full-jitter backoff,
//! total deadline, body replay, alternate endpoints and optional hedging, all
//! before response headers reach the client. The folders follow a request,
//! each a floor that names only the floors below it (`run` on top; the
//! table is `testkit/tests/layers.rs`):
//!
//! - [`config`]: where the configuration comes from and how it changes;
//!   `capture`: the `iptables` subcommand, the nat rules of transparent mode.
//! - [`server`]: listeners, protocol sniffing, tunnels, the drain, the admin
//!   endpoint and its `/metrics` page.
//! - `proxy`: the request's phases: route, admit, prepare, forward, respond.
//! - [`retry`]: the engine: attempts, gates, hedging, backoff, budget, and
//!   each upstream's state.
//! - `balance`: endpoints, the picker, HTTP clients.
//! - `http1`: HTTP/1.1 on the wire, both directions, without I/O.
//! - [`observe`]: metrics and stats, the access log, log output, spans.
//! - `exchange`: the vocabulary every floor shares: bodies, the attempt's
//!   request, failure kinds, outcomes, the report.
//! - `clock`, `random`, `socket`: the leaves.
//!
//! `docs/src/concepts/architecture.md` walks the request and control paths through them.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod balance;
mod capture;
mod clock;
pub mod config;
mod exchange;
/// HTTP/1.1 on the wire, public only for the fuzz targets (`fuzz/src/`).
#[doc(hidden)]
pub mod http1;
pub mod observe;
mod proxy;
mod random;
pub mod retry;
pub mod run;
pub mod server;
mod socket;

pub use observe::metrics::{EndpointStats, UpstreamStats};
pub use proxy::local::ERROR_HEADER;
pub use proxy::Proxy;
pub use server::{
    serve, serve_proxy, Listeners, DRAIN_IDLE_GRACE, FIRST_BYTES_WAIT, HEADER_READ_TIMEOUT,
};

/// The causes [`Error`] carries from the libraries below (TLS, HTTP, I/O).
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `": cause"` after an error's own message, when it has a cause.
fn cause(source: Option<&(dyn std::error::Error + Send + Sync)>) -> String {
    source.map_or_else(String::new, |e| format!(": {e}"))
}

/// Everything that can go wrong in the sidecar outside a request (a request's
/// own failures are [`retry::FailureKind`]s, answered to its client).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration could not be loaded.
    #[error(transparent)]
    Config(#[from] reprise_crds::Error),
    /// Tracing could not be set up from the `OTEL_*` variables.
    #[error(transparent)]
    Telemetry(#[from] reprise_telemetry::Error),
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({what})")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// Which listener: proxy, admin or health.
        what: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A `REPRISE_*` variable of Kubernetes mode is missing or malformed.
    #[error("{variable}: {rule}")]
    Environment {
        /// The variable, e.g. `REPRISE_CONTROLLER`.
        variable: &'static str,
        /// The rule its value (or its absence) breaks.
        rule: String,
        /// Why the value did not parse, when that is an error of its own.
        #[source]
        source: Option<http::uri::InvalidUri>,
    },
    /// A flag of `reprise-sidecar iptables` breaks a rule.
    #[error("{flag}: {rule}")]
    Flag {
        /// The flag, e.g. `--exclude-ports`.
        flag: &'static str,
        /// The rule and the value that broke it.
        rule: String,
    },
    /// An `iptables` or `ip6tables` command failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Iptables {
        /// The command line.
        command: String,
        /// Its exit status, or why it could not start.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// Neither a configuration file nor a controller to subscribe to.
    #[error("either --config FILE (standalone) or REPRISE_CONTROLLER (Kubernetes mode) is needed")]
    NoConfigSource,
    /// A local file (configuration, token, CA) could not be read.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// TLS setup or the handshake with the controller failed.
    #[error("TLS: {what}: {source}")]
    Tls {
        /// The step: reading the trust bundle (and where from), the
        /// protocol versions, the server name, the handshake.
        what: String,
        /// What failed.
        #[source]
        source: BoxError,
    },
    /// Connecting to the controller or speaking HTTP with it failed.
    #[error("connection: {what}{}", cause(.source.as_deref()))]
    Connection {
        /// The step that failed.
        what: &'static str,
        /// What failed, when an error said so (a silent controller is
        /// only a timeout).
        #[source]
        source: Option<BoxError>,
    },
    /// The controller refused the subscription.
    #[error("controller answered {status}: {message}")]
    Refused {
        /// HTTP status.
        status: http::StatusCode,
        /// Its explanation.
        message: String,
    },
}
