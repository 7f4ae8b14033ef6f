//! `Retry-After` from an upstream response: any header value bytes.
//!
//! Invariants: never panics; the result is `None` or at most
//! `RETRY_AFTER_MAX_SECS` (ten digits); and it agrees with a plain model of
//! RFC 9110's `Retry-After`: delay-seconds (digits only, after trimming spaces
//! and tabs), else an HTTP-date as the time from a fixed "now" until it (zero
//! for the past). Nothing else (signs, fractions, empty) yields a delay.

use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use reprise_sidecar::retry::{retry_after_at, RETRY_AFTER_MAX_SECS};

/// Replays one input; panics when an invariant above breaks.
pub fn check(data: &[u8]) {
    // Several values: the first one is the one that counts (`HeaderMap::get`).
    let mut headers = HeaderMap::new();
    for part in data.split(|b| *b == b'\n') {
        if let Ok(v) = HeaderValue::from_bytes(part) {
            headers.append(RETRY_AFTER, v);
        }
    }
    // 2026-12-01T00:00:00Z: a fixed clock, so the model can agree exactly.
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_083_200);
    let got = retry_after_at(&headers, now);
    if let Some(d) = got {
        assert!(
            d <= Duration::from_secs(RETRY_AFTER_MAX_SECS),
            "{d:?} above the cap"
        );
    }

    let expected = headers.get(RETRY_AFTER).and_then(|v| {
        let bytes = v.as_bytes();
        if !bytes
            .iter()
            .all(|b| (0x20..0x7f).contains(b) || *b == b'\t')
        {
            return None; // not visible ASCII: to_str() refuses it
        }
        let t = std::str::from_utf8(bytes)
            .ok()?
            .trim_matches(|c| c == ' ' || c == '\t');
        if !t.bytes().all(|b| b.is_ascii_digit()) {
            let date = httpdate::parse_http_date(t).ok()?;
            let wait = date.duration_since(now).unwrap_or(Duration::ZERO);
            return Some(wait.min(Duration::from_secs(RETRY_AFTER_MAX_SECS)));
        }
        if t.is_empty() || t.len() > 10 {
            return None;
        }
        Some(Duration::from_secs(t.parse::<u64>().ok()?))
    });
    assert_eq!(got, expected, "{:?}", headers.get(RETRY_AFTER));
}
