//! What a failed attempt tells the gates: the failure with its response
//! (for a status failure), and what that response asked about a retry's
//! timing (`Retry-After`, gRPC's pushback).

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use crate::exchange::failure::{FailureKind, Stage};

/// A failed attempt.
#[derive(Debug)]
pub(crate) struct Failure<B> {
    /// What went wrong.
    pub kind: FailureKind,
    /// How far it got.
    pub stage: Stage,
    /// The response, for a status failure (discarded if retried).
    pub response: Option<http::Response<B>>,
    /// What the response asked about a retry's timing.
    pub wait: Wait,
}

/// What a failed response asked about a retry: `Retry-After` (seconds or an
/// HTTP-date) or gRPC's `grpc-retry-pushback-ms` (gRFC A6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Nothing: the backoff applies.
    Backoff,
    /// Wait this long before the retry.
    For(Duration),
    /// Do not retry (a negative or malformed pushback).
    Refused,
}

/// `grpc-retry-pushback-ms` (gRFC A6): a non-negative number of
/// milliseconds is the delay before the retry; a negative or malformed value
/// asks for no retry; absent, the backoff applies.
pub(crate) fn grpc_pushback(headers: &HeaderMap) -> Wait {
    let Some(value) = headers.get("grpc-retry-pushback-ms") else {
        return Wait::Backoff;
    };
    match value
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= 10 && v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse::<u64>().ok())
    {
        Some(ms) => Wait::For(Duration::from_millis(ms)),
        None => Wait::Refused,
    }
}

/// The largest delay [`retry_after`] returns: ten digits of seconds. Longer
/// values are ignored as garbage. The retry loop honours a delay only up to the
/// policy's `retry_after_max` (at most 600 s) and ends the retries on a longer one.
pub const RETRY_AFTER_MAX_SECS: u64 = 9_999_999_999;

/// The delay a `Retry-After` asks for (RFC 9110 §10.2.3): delay-seconds (1 to
/// 10 digits, spaces and tabs trimmed), or an HTTP-date in any of its three
/// formats, as the time left until that date (none for a date in the past).
/// Garbage is ignored (the normal backoff applies). The result is at most
/// [`RETRY_AFTER_MAX_SECS`].
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    retry_after_at(headers, SystemTime::now())
}

/// [`retry_after`] with the clock's reading given.
pub fn retry_after_at(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim_matches(|c| c == ' ' || c == '\t');
    if value.bytes().all(|b| b.is_ascii_digit()) {
        if value.is_empty() || value.len() > 10 {
            return None;
        }
        return value.parse::<u64>().ok().map(Duration::from_secs);
    }
    let date = httpdate::parse_http_date(value).ok()?;
    let wait = date.duration_since(now).unwrap_or(Duration::ZERO);
    Some(wait.min(Duration::from_secs(RETRY_AFTER_MAX_SECS)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, v.parse().expect("header value"));
        h
    }

    #[test]
    fn retry_after_takes_only_delay_seconds() {
        assert_eq!(retry_after(&headers("3")), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(&headers(" 0 ")), Some(Duration::ZERO));
        assert_eq!(retry_after(&headers("-1")), None);
        assert_eq!(retry_after(&headers("1.5")), None);
        assert_eq!(retry_after(&headers("99999999999999999999")), None);
        assert_eq!(
            retry_after(&headers("9999999999")),
            Some(Duration::from_secs(RETRY_AFTER_MAX_SECS))
        );
        assert_eq!(retry_after(&headers("10000000000")), None, "eleven digits");
        assert_eq!(retry_after(&headers("soon")), None);
        assert_eq!(retry_after(&HeaderMap::new()), None);
    }

    #[test]
    fn retry_after_takes_http_dates_in_all_three_formats() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").expect("date");
        let at = |v: &str| retry_after_at(&headers(v), now);
        for later in [
            "Wed, 21 Oct 2015 07:28:30 GMT",     // IMF-fixdate
            "Wednesday, 21-Oct-15 07:28:30 GMT", // RFC 850
            "Wed Oct 21 07:28:30 2015",          // asctime
        ] {
            assert_eq!(at(later), Some(Duration::from_secs(30)), "{later}");
        }
        assert_eq!(
            at("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO),
            "now"
        );
        assert_eq!(
            at("Tue, 20 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO),
            "the past: no wait"
        );
        assert_eq!(
            at("Fri, 31 Dec 9999 23:59:59 GMT"),
            Some(Duration::from_secs(RETRY_AFTER_MAX_SECS)),
            "clamped"
        );
        assert_eq!(at("Wed, 32 Oct 2015 07:28:00 GMT"), None, "no such day");
        assert_eq!(at("21 Oct 2015"), None);
    }

    #[test]
    fn grpc_pushback_is_a_delay_or_a_refusal() {
        let h = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert("grpc-retry-pushback-ms", v.parse().expect("value"));
            h
        };
        assert_eq!(
            grpc_pushback(&h("250")),
            Wait::For(Duration::from_millis(250))
        );
        assert_eq!(grpc_pushback(&h("0")), Wait::For(Duration::ZERO));
        assert_eq!(grpc_pushback(&h("-1")), Wait::Refused);
        assert_eq!(grpc_pushback(&h("soon")), Wait::Refused);
        assert_eq!(grpc_pushback(&HeaderMap::new()), Wait::Backoff);
    }
}
