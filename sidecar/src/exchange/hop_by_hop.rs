//! Hop-by-hop header handling (RFC 9110 §7.6.1): connection-specific headers
//! are not forwarded, nor any header the Connection header names but `Host`.

use http::header::Entry;
use http::header::{
    HeaderName, CONNECTION, HOST, PROXY_AUTHORIZATION, TE, TRANSFER_ENCODING, UPGRADE,
};
use http::HeaderMap;

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Removes hop-by-hop headers. With `keep_upgrade`, `Connection: upgrade` and
/// `Upgrade` survive so an upgrade can be forwarded.
pub(crate) fn strip(headers: &mut HeaderMap, keep_upgrade: bool) {
    // One pass over the names finds which hop-by-hop headers are present
    // (usually none, or just Connection), so only those cost a hashed removal.
    // This runs twice per proxied request.
    let mut present = [false; HOP_BY_HOP.len()];
    let mut any = false;
    for name in headers.keys() {
        if let Some(i) = hop_index(name) {
            present[i] = true;
            any = true;
        }
    }
    if !any {
        return;
    }
    if present[0] {
        // One hashed lookup takes Connection out with all its values. A value
        // of just `keep-alive` or `close` (what nginx and most servers send)
        // names nothing left to remove: no token parsing, no allocation.
        let mut named: Vec<HeaderName> = Vec::new();
        if let Entry::Occupied(connection) = headers.entry(CONNECTION) {
            for value in connection.remove_entry_mult().1 {
                let v = value.as_bytes();
                if v.eq_ignore_ascii_case(b"keep-alive") || v.eq_ignore_ascii_case(b"close") {
                    continue;
                }
                named.extend(
                    value
                        .to_str()
                        .into_iter()
                        .flat_map(|v| v.split(','))
                        .map(str::trim)
                        .filter(|t| {
                            !t.eq_ignore_ascii_case("close")
                                && !t.eq_ignore_ascii_case("keep-alive")
                        })
                        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok()),
                );
            }
        }
        for name in named {
            // `Host` names the resource, not the connection: an endpoint
            // must get it (RFC 9112 §3.2), whatever `Connection` says. nginx
            // and HAProxy remove no field `Connection` names.
            if !(keep_upgrade && name == UPGRADE) && name != HOST {
                headers.remove(&name);
            }
        }
        if keep_upgrade {
            headers.insert(CONNECTION, http::HeaderValue::from_static("upgrade"));
        }
        present[0] = false;
    }
    for (name, _) in HOP_BY_HOP.iter().zip(present).filter(|(_, p)| *p) {
        if !(keep_upgrade && *name == UPGRADE) {
            headers.remove(name);
        }
    }
    if present[5] {
        // A message framed by Transfer-Encoding: its Content-Length (if the
        // sender put one in too) is not the length of what is forwarded, and
        // RFC 9112 §6.3 has a proxy remove it (hyper's client, used for
        // hosts outside every upstream, keeps it: the client got 3 of 5
        // bytes in the differential tests).
        headers.remove(http::header::CONTENT_LENGTH);
    }
}

/// True for a field that is always hop-by-hop (`Connection` may name more).
pub(crate) fn is_hop_by_hop(name: &HeaderName) -> bool {
    hop_index(name).is_some()
}

/// `name`'s index in [`HOP_BY_HOP`], if it is one. Its length rules out all
/// but at most two candidates, so an ordinary header (Host, Date,
/// Content-Type...) costs one length check instead of seven name comparisons
/// (measured: `e2e/bench/results/2026-12-01-instructions-perf.md`).
fn hop_index(name: &HeaderName) -> Option<usize> {
    let candidates: &[usize] = match name.as_str().len() {
        2 => &[4],     // te
        7 => &[6],     // upgrade
        10 => &[0, 1], // connection, keep-alive
        16 => &[2],    // proxy-connection
        17 => &[5],    // transfer-encoding
        19 => &[3],    // proxy-authorization
        _ => &[],
    };
    candidates.iter().copied().find(|&i| HOP_BY_HOP[i] == name)
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
pub(crate) fn is_upgrade(headers: &HeaderMap) -> bool {
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
    fn a_length_beside_transfer_encoding_goes_with_it() {
        let mut h = HeaderMap::new();
        h.insert(TRANSFER_ENCODING, "chunked".parse().expect("value"));
        h.insert(http::header::CONTENT_LENGTH, "3".parse().expect("value"));
        strip(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
        let mut h = HeaderMap::new();
        h.insert(http::header::CONTENT_LENGTH, "3".parse().expect("value"));
        strip(&mut h, false);
        assert_eq!(h.len(), 1, "a length alone is end-to-end");
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
    fn every_hop_by_hop_name_is_found_at_its_index_and_no_other() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_index(name), Some(i), "{name}");
        }
        for other in [
            "host",
            "date",
            "server",
            "content-type",
            "content-length",
            "x-connection",
            "keep-alivex",
            "tf",
        ] {
            let name = HeaderName::from_static(other);
            assert_eq!(hop_index(&name), None, "{other}");
        }
    }

    #[test]
    fn every_connection_value_is_read_and_all_of_them_removed() {
        let mut h = HeaderMap::new();
        h.append(CONNECTION, "keep-alive".parse().expect("value"));
        h.append(CONNECTION, "X-First".parse().expect("value"));
        h.append(CONNECTION, "close, x-second".parse().expect("value"));
        for name in ["x-first", "x-second", "x-end-to-end"] {
            h.insert(name, "1".parse().expect("value"));
        }
        strip(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-end-to-end"));
    }

    #[test]
    fn connection_cannot_name_host_away() {
        let mut h = HeaderMap::new();
        h.append(CONNECTION, "host".parse().expect("value"));
        h.append(CONNECTION, "close, Host, x-hop".parse().expect("value"));
        h.insert(http::header::HOST, "api".parse().expect("value"));
        h.insert("x-hop", "1".parse().expect("value"));
        strip(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h[http::header::HOST], "api");
    }

    #[test]
    fn a_plain_keep_alive_connection_removes_only_itself() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, "Keep-Alive".parse().expect("value"));
        h.insert("content-length", "128".parse().expect("value"));
        strip(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("content-length"));
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
