//! Hop-by-hop header handling (RFC 9110 §7.6.1): connection-specific headers
//! are not forwarded, nor any header the Connection header names.

use http::header::{HeaderName, CONNECTION, PROXY_AUTHORIZATION, TE, TRANSFER_ENCODING, UPGRADE};
use http::HeaderMap;

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Removes hop-by-hop headers. With `keep_upgrade`, `Connection: upgrade` and
/// `Upgrade` survive so an upgrade can be forwarded.
pub fn strip(headers: &mut HeaderMap, keep_upgrade: bool) {
    // One pass over the names finds which hop-by-hop headers are present
    // (usually none, or just Connection), so only those cost a hashed removal.
    // This runs twice per proxied request.
    let mut present = [false; HOP_BY_HOP.len()];
    for name in headers.keys() {
        if let Some(i) = HOP_BY_HOP.iter().position(|h| h == name) {
            present[i] = true;
        }
    }
    if !present.contains(&true) {
        return;
    }
    if present[0] {
        // `close` and `keep-alive` (the usual tokens) name nothing left to
        // remove: skipping them keeps the usual case free of allocations.
        let named: Vec<HeaderName> = headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| !t.eq_ignore_ascii_case("close") && !t.eq_ignore_ascii_case("keep-alive"))
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .collect();
        for name in named {
            if !(keep_upgrade && name == UPGRADE) {
                headers.remove(&name);
            }
        }
        if keep_upgrade {
            headers.insert(CONNECTION, http::HeaderValue::from_static("upgrade"));
        }
    }
    for (name, _) in HOP_BY_HOP.iter().zip(present).filter(|(_, p)| *p) {
        let kept = keep_upgrade && (*name == CONNECTION || *name == UPGRADE);
        if !kept {
            headers.remove(name);
        }
    }
}

/// Headers that are always hop-by-hop (more may be named by `Connection`).
/// `Connection` first: `strip` reads its tokens before removing it.
static HOP_BY_HOP: [HeaderName; 7] = [
    CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    PROXY_AUTHORIZATION,
    TE,
    TRANSFER_ENCODING,
    UPGRADE,
];

/// True when the request asks for a protocol upgrade (e.g. WebSocket).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(UPGRADE)
        && headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_listed_and_standard_hop_by_hop_headers() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, "close, x-secret".parse().expect("value"));
        h.insert("x-secret", "1".parse().expect("value"));
        h.insert("keep-alive", "timeout=5".parse().expect("value"));
        h.insert(TRANSFER_ENCODING, "chunked".parse().expect("value"));
        h.insert(TE, "trailers".parse().expect("value"));
        h.insert("x-end-to-end", "kept".parse().expect("value"));
        strip(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-end-to-end"));
    }

    #[test]
    fn leaves_end_to_end_headers_alone() {
        let mut h = HeaderMap::new();
        h.insert("x-end-to-end", "kept".parse().expect("value"));
        h.insert(http::header::HOST, "api".parse().expect("value"));
        strip(&mut h, false);
        assert_eq!(h.len(), 2);
        let mut only_keep_alive = HeaderMap::new();
        only_keep_alive.insert("keep-alive", "timeout=5".parse().expect("value"));
        strip(&mut only_keep_alive, false);
        assert!(only_keep_alive.is_empty());
    }

    #[test]
    fn connection_tokens_in_any_case_still_remove_what_they_name() {
        let mut h = HeaderMap::new();
        h.insert(
            CONNECTION,
            "Keep-Alive, CLOSE, X-Hop".parse().expect("value"),
        );
        h.insert("keep-alive", "timeout=5".parse().expect("value"));
        h.insert("x-hop", "1".parse().expect("value"));
        h.insert("x-end-to-end", "kept".parse().expect("value"));
        strip(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-end-to-end"));
    }

    #[test]
    fn keeps_upgrade_when_asked() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, "Upgrade".parse().expect("value"));
        h.insert(UPGRADE, "websocket".parse().expect("value"));
        assert!(is_upgrade(&h));
        strip(&mut h, true);
        assert_eq!(
            h.get(UPGRADE).map(|v| v.as_bytes()),
            Some(&b"websocket"[..])
        );
        assert_eq!(
            h.get(CONNECTION).map(|v| v.as_bytes()),
            Some(&b"upgrade"[..])
        );
    }
}
