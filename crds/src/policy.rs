//! The resolved retry policy a sidecar executes, whatever format it came from.

use std::time::Duration;

use serde::{Deserialize, Serialize};

mod deadlines;
pub use self::deadlines::{DeadlinePolicy, RetryLayers};

/// Most retries beyond the first attempt.
pub const MAX_RETRIES: u32 = 10;
/// Largest per-rule replay buffer.
pub const MAX_REPLAY_LIMIT_BYTES: u64 = 4 * 1024 * 1024;
/// Default reservation shared by every replay buffer in one sidecar.
pub const DEFAULT_REPLAY_RESERVATION_BYTES: u64 = 64 * 1024 * 1024;
/// Largest `total_deadline_ms`.
pub const MAX_TOTAL_DEADLINE_MS: u64 = 600_000;
/// The `gateway` status preset: gateway failures.
pub const GATEWAY_STATUSES: [u16; 3] = [502, 503, 504];
/// The `transient` status preset: broader transient failures.
pub const TRANSIENT_STATUSES: [u16; 7] = [408, 425, 429, 500, 502, 503, 504];

/// Which failures may be retried, by how far the failed attempt got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureBoundary {
    /// Only failures before the request was written and before any body byte was
    /// consumed: connect refused, connect timeout, a pooled connection that closed.
    /// The upstream cannot have seen the request.
    Connect,
    /// Any failure before response headers, including resets and read timeouts
    /// after the request may have reached the upstream. Can duplicate an operation,
    /// so it needs the duplicate-risk acknowledgement.
    BeforeHeaders,
}

/// Upstream protocol for connections from the sidecar to endpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// HTTP/1.1 with pooled keep-alive connections.
    #[default]
    Http1,
    /// HTTP/2 over cleartext with prior knowledge (h2c); streams are multiplexed.
    H2c,
    /// HTTP/2 over TLS (ALPN `h2`), the upstream's `tls` block required;
    /// what gRPC over TLS speaks.
    H2,
    /// Over TLS, offers both `h2` and `http/1.1` and speaks what the
    /// endpoint selects (the `tls` block required).
    Auto,
}

impl Protocol {
    /// HTTP/2 towards the endpoints, in clear or over TLS (`auto` is
    /// decided per endpoint, when it answers).
    pub fn is_http2(self) -> bool {
        matches!(self, Protocol::H2c | Protocol::H2)
    }

    /// Needs the upstream's `tls` block.
    pub fn needs_tls(self) -> bool {
        matches!(self, Protocol::H2 | Protocol::Auto)
    }
}

/// A set of HTTP methods, as a bit set so the per-request check is one AND.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MethodSet(u16);

/// A set of HTTP statuses in 400..=599, as a bit set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StatusSet([u64; 4]);

/// Everything the retry loop needs to decide about one request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RetryPolicy {
    /// Retries beyond the first attempt (0 = retries off). Written
    /// `attempts`, as in the configuration formats.
    #[serde(rename = "attempts")]
    pub max_retries: u32,
    /// Methods this policy retries.
    pub methods: MethodSet,
    /// How far a failed attempt may have got and still be retried.
    pub failure_boundary: FailureBoundary,
    /// Upstream statuses that trigger a retry.
    pub retry_statuses: StatusSet,
    /// gRPC statuses that trigger a retry of a gRPC request (in a
    /// Trailers-Only response, or trailers before any message).
    pub grpc_statuses: crate::grpc::GrpcStatusSet,
    /// Whether transport errors and per-attempt timeouts are retried at all.
    pub retry_transport: bool,
    /// Backoff base: nominal delay before retry n is `min(base * 2^(n-1), cap)`.
    #[serde(with = "millis")]
    pub backoff_base: Duration,
    /// Backoff ceiling.
    #[serde(with = "millis")]
    pub backoff_cap: Duration,
    /// Bodies up to this many bytes are buffered once and replayed.
    pub replay_limit_bytes: u64,
    /// Wall-clock cap from the first attempt to the last, backoff included.
    #[serde(with = "opt_millis")]
    pub total_deadline: Option<Duration>,
    /// Time one attempt may wait for response headers (overrides the
    /// upstream's `read_ms`); zero: no limit at all (a route's
    /// `backendRequest: 0s`), not the upstream's.
    #[serde(with = "opt_millis")]
    pub attempt_timeout: Option<Duration>,
    /// Delay after which one speculative duplicate is sent to another endpoint.
    #[serde(with = "opt_millis")]
    pub hedge_delay: Option<Duration>,
    /// Whether a retry may go back to an endpoint this request already tried when no
    /// untried one is left (default no: a retry goes to an endpoint not yet tried).
    pub reuse_endpoints: bool,
    /// Longest `Retry-After` the sidecar will wait for; a longer one ends retries.
    #[serde(with = "millis")]
    pub retry_after_max: Duration,
    /// The user acknowledged that retries may duplicate an upstream operation.
    pub duplicate_risk_acknowledged: bool,
    /// Deadlines across hops: sent to the next hop, accepted from the caller.
    pub deadlines: DeadlinePolicy,
    /// Whether a request an upper layer already retried is retried here.
    pub retry_layers: RetryLayers,
    /// When the total deadline ends the retries, the client gets a `504`
    /// naming it rather than the last response (Gateway API's request
    /// timeout; a RetryPolicy answers the last response).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub deadline_answers_timeout: bool,
}

const METHODS: [(&str, u16); 8] = [
    ("GET", 1),
    ("HEAD", 1 << 1),
    ("OPTIONS", 1 << 2),
    ("PUT", 1 << 3),
    ("DELETE", 1 << 4),
    ("POST", 1 << 5),
    ("PATCH", 1 << 6),
    ("*", 1 << 7),
];

impl MethodSet {
    /// GET, HEAD and OPTIONS: the safe methods of RFC 9110 §9.2.1 that Reprise
    /// retries without a duplicate-risk acknowledgement.
    pub const SAFE: MethodSet = MethodSet(1 | 1 << 1 | 1 << 2);
    /// The recommended starting set for rules.
    pub const GET_HEAD: MethodSet = MethodSet(1 | 1 << 1);
    /// The empty set.
    pub const NONE: MethodSet = MethodSet(0);
    const ANY: u16 = 1 << 7;

    /// Parses a method token (`GET`, `post`, `*`); CONNECT, TRACE and unknown tokens are `None`.
    pub fn parse_one(token: &str) -> Option<MethodSet> {
        METHODS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(token))
            .map(|(_, bit)| MethodSet(*bit))
    }

    /// The union of two sets.
    pub const fn union(self, other: MethodSet) -> MethodSet {
        MethodSet(self.0 | other.0)
    }

    /// True when the set holds the wildcard `*`.
    pub fn is_any(self) -> bool {
        self.0 & Self::ANY != 0
    }

    /// True when the set holds a method that is not safe (or the wildcard).
    pub fn has_unsafe(self) -> bool {
        self.0 & !Self::SAFE.0 != 0
    }

    /// True when `method` is in the set. CONNECT and TRACE never are, even under `*`.
    pub fn contains(self, method: &str) -> bool {
        let bit = match method {
            "GET" => 1,
            "HEAD" => 1 << 1,
            "OPTIONS" => 1 << 2,
            "PUT" => 1 << 3,
            "DELETE" => 1 << 4,
            "POST" => 1 << 5,
            "PATCH" => 1 << 6,
            "CONNECT" | "TRACE" => return false,
            _ => 0,
        };
        self.0 & bit != 0 || self.is_any()
    }

    /// Method names in the set, for display.
    pub fn names(self) -> Vec<&'static str> {
        METHODS
            .iter()
            .filter(|(_, bit)| self.0 & bit != 0)
            .map(|(name, _)| *name)
            .collect()
    }
}

impl Serialize for MethodSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.names())
    }
}

impl StatusSet {
    /// The empty set.
    pub const NONE: StatusSet = StatusSet([0; 4]);

    /// A set from statuses; each must be in 400..=599 (checked by validation).
    pub fn from_statuses(statuses: impl IntoIterator<Item = u16>) -> StatusSet {
        let mut set = StatusSet::NONE;
        for s in statuses {
            set.insert(s);
        }
        set
    }

    /// Adds `status` when it is in 400..=599.
    pub fn insert(&mut self, status: u16) {
        if (400..=599).contains(&status) {
            let i = usize::from(status - 400);
            self.0[i / 64] |= 1 << (i % 64);
        }
    }

    /// True when `status` is in the set.
    pub fn contains(&self, status: u16) -> bool {
        if !(400..=599).contains(&status) {
            return false;
        }
        let i = usize::from(status - 400);
        self.0[i / 64] & (1 << (i % 64)) != 0
    }

    /// True when the set is empty (status retries off).
    pub fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }

    /// The statuses in ascending order.
    pub fn statuses(&self) -> Vec<u16> {
        (400..=599).filter(|s| self.contains(*s)).collect()
    }
}

impl Serialize for StatusSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.statuses())
    }
}

impl RetryPolicy {
    /// True when this policy can retry anything at all.
    pub fn enabled(&self) -> bool {
        self.max_retries > 0
    }

    /// Nominal (pre-jitter) backoff before retry `n` (1-based): `min(base * 2^(n-1), cap)`.
    pub fn nominal_backoff(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.backoff_base
            .checked_mul(factor)
            .unwrap_or(self.backoff_cap)
            .min(self.backoff_cap)
    }
}

/// Serializes a `Duration` as whole milliseconds.
pub(crate) mod millis {
    use std::time::Duration;

    pub(crate) fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// Serializes an optional `Duration` as whole milliseconds or null.
pub(crate) mod opt_millis {
    use std::time::Duration;

    pub(crate) fn serialize<S: serde::Serializer>(
        d: &Option<Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_set_never_holds_connect_or_trace() {
        let any = MethodSet::parse_one("*").expect("wildcard parses");
        assert!(any.contains("DELETE"));
        assert!(any.contains("PROPFIND"));
        assert!(!any.contains("CONNECT"));
        assert!(!any.contains("TRACE"));
        assert!(MethodSet::parse_one("CONNECT").is_none());
        assert!(MethodSet::parse_one("trace").is_none());
        assert!(!MethodSet::SAFE.has_unsafe());
        assert!(MethodSet::SAFE
            .union(MethodSet::parse_one("post").expect("POST"))
            .has_unsafe());
    }

    #[test]
    fn nominal_backoff_doubles_up_to_the_cap() {
        let yaml = "upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\n    retries: { attempts: 10, backoff_base_ms: 25, backoff_cap_ms: 250 }\n";
        let cfg = crate::file::parse(yaml, "t").expect("valid");
        let p = &cfg.upstreams[0].retries;
        let ms: Vec<u128> = (1..=10).map(|n| p.nominal_backoff(n).as_millis()).collect();
        assert_eq!(ms, vec![25, 50, 100, 200, 250, 250, 250, 250, 250, 250]);
        assert_eq!(
            p.nominal_backoff(40).as_millis(),
            250,
            "no overflow past 2^31"
        );
    }

    #[test]
    fn status_set_bounds() {
        let set = StatusSet::from_statuses([400, 429, 503, 599, 600, 200]);
        assert_eq!(set.statuses(), vec![400, 429, 503, 599]);
        assert!(!set.contains(200));
        assert!(StatusSet::NONE.is_empty());
    }
}
