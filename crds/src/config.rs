//! The resolved configuration a sidecar runs: upstreams, their endpoints and
//! retry policies, and the ordered retry rules. Both the standalone file and the
//! controller's snapshots resolve to this.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::cel_match::CelMatch;
use crate::matching::RequestMatch;
use crate::policy::{MethodSet, Protocol, RetryPolicy};
pub use crate::tls::{ClientIdentity, TrustBundle};

/// A validated, resolved sidecar configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Config {
    /// Upstreams by name, in file order.
    pub upstreams: Vec<Upstream>,
    /// Retry rules, sorted by priority then id (evaluation order).
    pub rules: Vec<Rule>,
    /// Process-wide proxy settings.
    pub proxy: ProxySettings,
}

/// One upstream: a named set of interchangeable endpoints.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Upstream {
    /// The name requests address (the host of the request).
    pub name: String,
    /// Other host names for the same upstream (e.g. a Service's DNS forms).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// Interchangeable endpoints; a retry goes to one not yet tried.
    pub endpoints: Vec<Endpoint>,
    /// Endpoints named by DNS: every address a name resolves to is an
    /// endpoint beside [`Upstream::endpoints`], resolved by the sidecar.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dns: Vec<DnsEndpoint>,
    /// Virtual addresses (a Service's ClusterIP and port) whose connections,
    /// captured transparently, go to this upstream.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<SocketAddr>,
    /// Protocol to the endpoints.
    pub protocol: Protocol,
    /// Time allowed to establish a connection.
    #[serde(with = "crate::policy::millis")]
    pub connect_timeout: Duration,
    /// Time one attempt may wait for response headers (`timeouts.read_ms`).
    #[serde(with = "crate::policy::opt_millis")]
    pub read_timeout: Option<Duration>,
    /// The upstream's own retry policy (its `retries` block); applies when no rule matches.
    pub retries: RetryPolicy,
    /// The rolling retry budget shared by every request to this upstream.
    pub budget: BudgetSettings,
    /// When an endpoint is ejected after repeated transport failures.
    pub passive_health: PassiveHealth,
    /// TLS the sidecar originates towards the endpoints; none speaks clear
    /// text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTls>,
    /// The `Host` (or `:authority`) every attempt carries instead of the one
    /// the application sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_rewrite: Option<String>,
}

/// TLS towards an upstream's endpoints: one policy for every attempt of a
/// request, whichever endpoint it goes to (only the address changes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UpstreamTls {
    /// Sent as SNI and the name the endpoint's certificate must carry (a
    /// DNS name, or an IP address in the certificate's IP names).
    pub server_name: String,
    /// When not empty, the certificate must carry one of these names
    /// instead of `server_name` (which is still sent as SNI): Gateway API's
    /// `subjectAltNames`, Envoy's `match_typed_subject_alt_names`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
    /// The certificates a chain must end in.
    pub trust: TrustAnchors,
    /// The certificate and key to present when the endpoint asks for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_identity: Option<ClientIdentity>,
}

/// Where the trusted root certificates come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrustAnchors {
    /// The public roots compiled into the sidecar (Mozilla's, as curated
    /// for the web PKI).
    WellKnown,
    /// A PEM bundle.
    Bundle(TrustBundle),
}

/// One endpoint of an upstream.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Endpoint {
    /// Address and port.
    pub addr: SocketAddr,
    /// Pod (or other) name, for traces and logs. Shared, as the zone is:
    /// a change to one endpoint of many copies the list, not its strings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<Arc<str>>,
    /// Topology zone, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<Arc<str>>,
}

/// Endpoints named by DNS: the addresses `host` resolves to, each on `port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct DnsEndpoint {
    /// The name, lowercase.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Topology zone, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// Retry budget: a retry is allowed while
/// `(retries + 1) * 100 <= percent * requests` over the rolling window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BudgetSettings {
    /// Share of requests that may be retries, in (0, 100].
    pub percent: f64,
    /// Length of the rolling window.
    #[serde(with = "crate::policy::millis")]
    pub window: Duration,
    /// Retries per second always allowed on top of the percentage (0 = the
    /// budget formula exactly); may be below one (a Gateway API
    /// `minRetryRate` of one per ten seconds is 0.1).
    pub min_retries_per_second: f64,
}

/// Passive health: eject an endpoint after consecutive transport failures or
/// mid-stream body errors. Upstream statuses never count: a status proves the
/// transport works, not that the endpoint is unhealthy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PassiveHealth {
    /// Consecutive failures that eject an endpoint (0 = never eject).
    pub consecutive_failures: u32,
    /// How long an ejected endpoint is left out of picks.
    #[serde(with = "crate::policy::millis")]
    pub ejection: Duration,
}

/// A rules-document retry rule: which requests, and the policy they get.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rule {
    /// Unique id; breaks priority ties.
    pub id: String,
    /// Which source's rules run first, before priority: 0 for the file's
    /// rules and a caller's own RetryPolicies, higher for the sources a
    /// caller's own choice overrides (`docs/src/concepts/precedence.md`).
    #[serde(skip_serializing_if = "is_zero")]
    pub precedence: u8,
    /// Lower runs first.
    pub priority: i32,
    /// What the rule's traffic is reported as, when it is one of several
    /// rules of one policy (a route rule's matches): its policy's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report_as: Option<String>,
    /// Disabled rules never match.
    pub enabled: bool,
    /// Upstream names the rule applies to; empty means all.
    pub upstreams: Vec<String>,
    /// Methods the rule matches (and retries).
    pub methods: MethodSet,
    /// Path and header conditions.
    #[serde(rename = "match")]
    pub request_match: RequestMatch,
    /// The compiled `match.cel`, run last, only when every other condition holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cel: Option<CelMatch>,
    /// The policy a matching request gets.
    pub policy: RetryPolicy,
}

/// Process-wide settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProxySettings {
    /// Bytes all replay buffers together may hold.
    pub replay_reservation_bytes: u64,
    /// Time in-flight requests get to finish after SIGTERM.
    #[serde(with = "crate::policy::millis")]
    pub drain_timeout: Duration,
    /// Largest request head (request line and headers) accepted, in bytes.
    pub max_request_header_bytes: usize,
    /// Client connections the proxy listener holds open at once, and apart
    /// from them the transparent listeners; one more is closed at once.
    pub max_connections: u64,
    /// Emit one structured log event per request.
    pub access_log: bool,
    /// Requests that were retried or failed kept for the admin
    /// `/diagnostics` page, newest first; 0 keeps none.
    pub diagnostics_retained: usize,
    /// Forward requests for hosts that name no upstream as a plain proxy
    /// (Kubernetes mode, where HTTP_PROXY sends every host here) instead of refusing them.
    pub forward_unknown_hosts: bool,
    /// The DNS servers that resolve host-named endpoints; empty: the
    /// system's (`/etc/resolv.conf`, its search domains and `ndots`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dns_resolvers: Vec<SocketAddr>,
    /// Deadlines across hops for every request (`proxy.deadlines`; in
    /// Kubernetes the `reprise.dev/deadline-*` annotations); a policy may
    /// turn a way off for its own requests.
    pub deadlines: crate::policy::DeadlinePolicy,
    /// Let host-named endpoints resolve to loopback and link-local
    /// addresses (standalone use: a name in `/etc/hosts` for a local
    /// service). Off in Kubernetes mode: a name a Service points anywhere
    /// must not lead to the pod itself or the node's metadata service.
    pub dns_allow_local: bool,
}

impl Config {
    /// The upstream named `name`, compared case-insensitively.
    pub fn upstream(&self, name: &str) -> Option<&Upstream> {
        self.upstreams
            .iter()
            .find(|u| u.name.eq_ignore_ascii_case(name))
    }
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

impl Rule {
    /// The id its traffic is reported under.
    pub fn report_id(&self) -> &str {
        self.report_as.as_deref().unwrap_or(&self.id)
    }

    /// Evaluation order: precedence, then priority, then id.
    pub fn order(a: &Rule, b: &Rule) -> std::cmp::Ordering {
        (a.precedence, a.priority, &a.id).cmp(&(b.precedence, b.priority, &b.id))
    }

    /// True when this rule applies to `upstream`, `method`, `path`, `query`
    /// (without `?`) and headers, by every condition but [`Rule::cel`],
    /// which the caller runs next.
    pub fn matches<'a>(
        &self,
        upstream: &str,
        method: &str,
        path: &str,
        query: Option<&str>,
        header: impl Fn(&str) -> Option<&'a [u8]>,
    ) -> bool {
        self.enabled
            && (self.upstreams.is_empty()
                || self
                    .upstreams
                    .iter()
                    .any(|u| u.eq_ignore_ascii_case(upstream)))
            && self.methods.contains(method)
            && self.request_match.matches(path, header)
            && self.request_match.matches_query(query)
    }
}
