//! `Retry-After` from an upstream response: any header value bytes.
//!
//! Invariants: never panics; the result is `None` or at most
//! `failure::RETRY_AFTER_MAX_SECS` (ten digits); and it agrees with a plain
//! model of RFC 9110's delay-seconds (digits only, after trimming spaces and
//! tabs). Nothing else (HTTP-dates, signs, fractions, empty) yields a delay.
#![no_main]

use std::time::Duration;

use http::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use libfuzzer_sys::fuzz_target;
use reprise_sidecar::retry::{retry_after, RETRY_AFTER_MAX_SECS};

fuzz_target!(|data: &[u8]| {
    // Several values: the first one is the one that counts (`HeaderMap::get`).
    let mut headers = HeaderMap::new();
    for part in data.split(|b| *b == b'\n') {
        if let Ok(v) = HeaderValue::from_bytes(part) {
            headers.append(RETRY_AFTER, v);
        }
    }
    let got = retry_after(&headers);
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
        if t.is_empty() || t.len() > 10 || !t.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Duration::from_secs(t.parse::<u64>().ok()?))
    });
    assert_eq!(got, expected, "{:?}", headers.get(RETRY_AFTER));
});
