//! gRPC's fields the proxy reads and writes: the deadline (`grpc-timeout`),
//! read from a client's request and written on each attempt as the time
//! left, and the status (`grpc-status`) of a response's head or trailers.

use std::time::Duration;

use http::HeaderMap;

/// The client's gRPC deadline, rewritten on each attempt to the time left.
pub(crate) const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// `grpc-timeout` for `left`: milliseconds (8 digits at most, as the spec
/// allows), else seconds.
pub(crate) fn value_for(left: Duration) -> String {
    let ms = left.as_millis();
    if ms < 100_000_000 {
        format!("{ms}m")
    } else {
        format!("{}S", left.as_secs().min(99_999_999))
    }
}

/// A client's `grpc-timeout` (gRPC over HTTP/2: 1-8 digits and a unit of
/// H, M, S, m, u or n); `None` when absent or malformed.
pub(crate) fn parse_grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(GRPC_TIMEOUT)?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The `grpc-status` in `fields`, if any.
pub(crate) fn grpc_code(fields: &http::HeaderMap) -> Option<u8> {
    const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
    fields.get(&GRPC_STATUS)?.to_str().ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_in_every_unit_and_garbage_is_ignored() {
        let t = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(GRPC_TIMEOUT, v.parse().expect("value"));
            parse_grpc_timeout(&h)
        };
        assert_eq!(t("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(t("3M"), Some(Duration::from_secs(180)));
        assert_eq!(t("10S"), Some(Duration::from_secs(10)));
        assert_eq!(t("250m"), Some(Duration::from_millis(250)));
        assert_eq!(t("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(t("5n"), Some(Duration::from_nanos(5)));
        for bad in ["", "m", "123456789m", "10x", "-1S", "1.5S"] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
        assert_eq!(value_for(Duration::from_millis(1500)), "1500m");
        assert_eq!(value_for(Duration::from_secs(200_000)), "200000S");
    }
}
