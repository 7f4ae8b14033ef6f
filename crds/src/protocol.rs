//! The config push protocol between controller and sidecars.
//!
//! HTTPS (rustls). A sidecar holds `GET /v1/snapshots` open: the response is a
//! stream of newline-delimited JSON [`Snapshot`](crate::snapshot::Snapshot)s,
//! the current one first, then one per change; an empty line every
//! [`HEARTBEAT_SECS`] keeps idle connections honest. The sidecar answers each
//! snapshot with `POST /v1/acks` carrying an [`Ack`]. Both requests carry the
//! pod's projected ServiceAccount token (audience [`AUDIENCE`]) as a bearer
//! token and name the pod in [`POD_HEADER`] and [`NAMESPACE_HEADER`]; the
//! controller checks the token with the TokenReview API and that it is bound to
//! that very pod.
//!
//! Sidecars use the upgraded form: `GET /v1/snapshots` over HTTP/1.1 with
//! `Connection: upgrade` and `Upgrade: `[`UPGRADE_PROTOCOL`]. After `101
//! Switching Protocols` the TLS connection carries newline-delimited JSON both
//! ways: snapshots (and heartbeats) from the controller, one [`Ack`] line per
//! snapshot from the sidecar. The token is checked once, at the upgrade. This
//! costs the controller a fraction of an HTTP/2 connection's buffers per
//! sidecar, which is what lets one replica hold thousands of them.

use serde::{Deserialize, Serialize};

/// Path of the snapshot stream.
pub const SNAPSHOTS_PATH: &str = "/v1/snapshots";
/// Path ACKs and NACKs are posted to.
pub const ACKS_PATH: &str = "/v1/acks";
/// Header naming the sidecar's pod.
pub const POD_HEADER: &str = "x-reprise-pod";
/// Header naming the sidecar's namespace.
pub const NAMESPACE_HEADER: &str = "x-reprise-namespace";
/// Query parameter with the version the sidecar already runs (for resume).
pub const VERSION_PARAM: &str = "version";
/// Token audience the controller accepts.
pub const AUDIENCE: &str = "reprise";
/// The `Upgrade` token of the bidirectional form.
pub const UPGRADE_PROTOCOL: &str = "reprise-push/1";
/// Longest snapshot line a sidecar accepts on the upgraded stream (the
/// controller takes ACK lines of at most 64 KiB).
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// Seconds between heartbeat lines on an idle stream.
pub const HEARTBEAT_SECS: u64 = 15;

/// What a sidecar understands of a snapshot beyond the first version of
/// it, comma-separated in its subscription request. The controller leaves
/// out of a sidecar's snapshot every upstream that needs a capability the
/// sidecar did not announce (and the policies targeting it): an older
/// sidecar ignores fields it does not know, so it would send plain text,
/// credentials included, to a TLS port.
pub const CAPABILITIES_HEADER: &str = "x-reprise-capabilities";
/// TLS towards endpoints (an upstream's `tls`; `protocol` `h2` or `auto`).
pub const CAPABILITY_TLS: &str = "tls";
/// Endpoints named by DNS (an upstream's `dns` and `hostRewrite`).
pub const CAPABILITY_DNS: &str = "dns";
/// Deltas on the upgraded stream ([`crate::snapshot::SnapshotDelta`]):
/// after the whole snapshot at connection, only what changed.
pub const CAPABILITY_DELTA: &str = "delta";
/// Rules from more than one source in one snapshot (a policy's
/// `precedence`), rules from Gateway API routes (a policy's `route`), and a
/// Service's own budget (an upstream's `budget`).
pub const CAPABILITY_ROUTES: &str = "routes";
/// Every capability this build has, as it announces them.
pub const CAPABILITIES: &str = "tls,dns,delta,routes";

/// The capabilities `headers` announce (none from a sidecar older than them).
pub fn capabilities(headers: &http::HeaderMap) -> std::collections::BTreeSet<String> {
    headers
        .get_all(CAPABILITIES_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| !c.is_empty())
        .collect()
}

/// Asks for the upgrade to [`UPGRADE_PROTOCOL`] (the sidecar's request) or
/// grants it (the controller's `101 Switching Protocols`): the same two
/// headers both ways, `Connection: upgrade` and `Upgrade: reprise-push/1`.
pub fn insert_upgrade_headers(headers: &mut http::HeaderMap) {
    headers.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("upgrade"),
    );
    headers.insert(
        http::header::UPGRADE,
        http::HeaderValue::from_static(UPGRADE_PROTOCOL),
    );
}

/// True when the (first) `Upgrade` header names [`UPGRADE_PROTOCOL`], in any
/// case: a request for the upgraded form.
pub fn is_upgrade(headers: &http::HeaderMap) -> bool {
    headers.get(http::header::UPGRADE).is_some_and(|v| {
        v.as_bytes()
            .eq_ignore_ascii_case(UPGRADE_PROTOCOL.as_bytes())
    })
}

/// A sidecar's answer to one snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ack {
    /// The snapshot version answered.
    pub version: String,
    /// Absent for an ACK; the validation error for a NACK.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A sidecar's request for its whole snapshot again: a delta did not apply
/// to what it runs (another base, an unknown upstream, another version once
/// applied). Sent on the upgraded stream as `{"resync": …}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resync {
    /// The version the sidecar runs.
    pub version: String,
    /// Why the delta did not apply.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upgrade_headers_ask_for_the_push_protocol() {
        let mut headers = http::HeaderMap::new();
        assert!(!is_upgrade(&headers));
        insert_upgrade_headers(&mut headers);
        assert_eq!(headers.len(), 2);
        assert_eq!(headers[http::header::CONNECTION], "upgrade");
        assert_eq!(headers[http::header::UPGRADE], "reprise-push/1");
        assert!(is_upgrade(&headers));
        headers.insert(
            http::header::UPGRADE,
            http::HeaderValue::from_static("Reprise-Push/1"),
        );
        assert!(is_upgrade(&headers));
        headers.insert(
            http::header::UPGRADE,
            http::HeaderValue::from_static("websocket"),
        );
        assert!(!is_upgrade(&headers));
    }
}
