//! The access log: one line per logical request, target `reprise::request`.
//!
//! With JSON logs (the default) the line is formatted straight into the log
//! buffer: the same object `tracing-subscriber`'s JSON formatter writes, without
//! its per-event machinery (a timestamp `String`, a `fmt::Write` adaptor per
//! field, the subscriber's dispatch), which cost about as much CPU as proxying
//! the request itself. Whether the line is written still follows the log filter
//! (`REPRISE_LOG`, `PUT /log-level`), so `reprise::request=off` turns it off.

use std::time::{SystemTime, UNIX_EPOCH};

use http::{Method, StatusCode};
use tokio::time::Instant;

use super::log_output::BatchedWriter;
use crate::exchange::report::PolicySource;
use crate::exchange::report::Report;

/// The `tracing` target of access log lines.
pub(crate) const TARGET: &str = "reprise::request";

/// Where access log lines go.
#[derive(Clone, Debug, Default)]
pub(crate) enum AccessLog {
    /// As a `tracing` event, formatted by the installed subscriber (text logs,
    /// and library use such as tests).
    #[default]
    Event,
    /// As a JSON line written straight into the log buffer.
    Json(BatchedWriter),
}

/// One request's access log fields.
#[derive(Debug)]
pub(crate) struct Entry<'a> {
    /// The upstream's name.
    pub upstream: &'a str,
    /// The request method.
    pub method: &'a str,
    /// The request path (no query).
    pub path: &'a str,
    /// The policy that applied: `rule:<id>`, `upstream` or `none`.
    pub rule: &'a str,
    /// Attempts made, the first included.
    pub attempts: u32,
    /// Attempts the policy allowed.
    pub max_attempts: u32,
    /// Endpoints tried, in order, comma-separated.
    pub endpoints: &'a str,
    /// `ok`, `recovered`, `exhausted` or `skipped`.
    pub outcome: &'a str,
    /// Why the outcome (empty for `ok`).
    pub reason: &'a str,
    /// The first failure's kind, or empty.
    pub first_error: &'a str,
    /// What the last failure that says more said (which check an
    /// endpoint's certificate failed, e.g. `unknown_issuer`), or empty.
    pub error_detail: &'a str,
    /// True when a hedge was sent.
    pub hedged: bool,
    /// The status sent to the client.
    pub status: u16,
    /// The gRPC status name when the response's headers carry one (a
    /// Trailers-Only response or a local gRPC answer), else empty.
    pub grpc_status: &'a str,
    /// Time from the request's arrival to its response head, in ms.
    pub duration_ms: f64,
    /// The trace id, or empty when the request is not traced.
    pub trace_id: &'a str,
}

impl AccessLog {
    /// True when the log filter lets `reprise::request` info lines through;
    /// callers check it before gathering an entry's fields.
    pub(crate) fn enabled() -> bool {
        tracing::enabled!(target: TARGET, tracing::Level::INFO)
    }

    /// Logs `entry` if the log filter lets `reprise::request` info lines through.
    pub(crate) fn record(&self, entry: &Entry<'_>) {
        if !Self::enabled() {
            return;
        }
        match self {
            Self::Event => tracing::info!(
                target: TARGET,
                upstream = entry.upstream,
                method = entry.method,
                path = entry.path,
                rule = entry.rule,
                attempts = entry.attempts,
                max_attempts = entry.max_attempts,
                endpoints = entry.endpoints,
                outcome = entry.outcome,
                reason = entry.reason,
                first_error = entry.first_error,
                error_detail = entry.error_detail,
                hedged = entry.hedged,
                status = entry.status,
                grpc_status = entry.grpc_status,
                duration_ms = entry.duration_ms,
                trace_id = entry.trace_id,
                "request"
            ),
            Self::Json(writer) => writer.append(&entry.json_line(SystemTime::now())),
        }
    }
}

impl AccessLog {
    /// Logs one logical request to `upstream` (whose endpoint `i` is logged
    /// as `endpoint_label(i)`): what it was, which policy applied, what the
    /// retry loop did and what the client got.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn request<'u>(
        &self,
        upstream: &str,
        endpoint_label: impl Fn(usize) -> &'u str,
        method: &Method,
        path: &http::uri::PathAndQuery,
        source: Option<PolicySource<'_>>,
        max_retries: u32,
        report: &Report,
        status: StatusCode,
        grpc_status: Option<u8>,
        started: Instant,
        trace_id: Option<String>,
    ) {
        let endpoints: std::borrow::Cow<'_, str> = match report.tried.as_slice() {
            [one] => endpoint_label(*one).into(),
            tried => tried
                .iter()
                .map(|i| endpoint_label(*i))
                .collect::<Vec<_>>()
                .join(",")
                .into(),
        };
        let rule: std::borrow::Cow<'_, str> = match source {
            None => "none".into(),
            Some(PolicySource::Upstream) => "upstream".into(),
            Some(s) => s.to_string().into(),
        };
        self.record(&Entry {
            upstream,
            method: method.as_str(),
            path: path.path(),
            rule: &rule,
            attempts: report.attempts,
            max_attempts: max_retries + 1,
            endpoints: &endpoints,
            outcome: report.outcome.name(),
            reason: report.outcome.reason(),
            first_error: &report
                .first_error
                .map_or(std::borrow::Cow::Borrowed(""), |k| k.name()),
            error_detail: report.error_detail.unwrap_or(""),
            hedged: report.hedged,
            status: status.as_u16(),
            grpc_status: &grpc_status
                .map_or(std::borrow::Cow::Borrowed(""), reprise_crds::grpc::name_of),
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            trace_id: trace_id.as_deref().unwrap_or(""),
        });
    }
}

impl Entry<'_> {
    /// The line as `tracing-subscriber`'s flattened JSON formatter writes the
    /// equivalent event: timestamp, level, the message, the fields, the target.
    pub(crate) fn json_line(&self, now: SystemTime) -> Vec<u8> {
        let mut line = Vec::with_capacity(384);
        line.extend_from_slice(b"{\"timestamp\":\"");
        push_timestamp(&mut line, now);
        line.extend_from_slice(b"\",\"level\":\"INFO\",\"message\":\"request\"");
        let strings = [
            (",\"upstream\":", self.upstream),
            (",\"method\":", self.method),
            (",\"path\":", self.path),
            (",\"rule\":", self.rule),
        ];
        push_strings(&mut line, &strings);
        push_number(&mut line, ",\"attempts\":", self.attempts);
        push_number(&mut line, ",\"max_attempts\":", self.max_attempts);
        let strings = [
            (",\"endpoints\":", self.endpoints),
            (",\"outcome\":", self.outcome),
            (",\"reason\":", self.reason),
            (",\"first_error\":", self.first_error),
            (",\"error_detail\":", self.error_detail),
        ];
        push_strings(&mut line, &strings);
        line.extend_from_slice(if self.hedged {
            b",\"hedged\":true"
        } else {
            b",\"hedged\":false"
        });
        push_number(&mut line, ",\"status\":", self.status);
        push_strings(&mut line, &[(",\"grpc_status\":", self.grpc_status)]);
        line.extend_from_slice(b",\"duration_ms\":");
        // serde_json writes f64 as tracing-subscriber's formatter does (it uses serde_json).
        let _ = serde_json::to_writer(&mut line, &self.duration_ms);
        push_strings(&mut line, &[(",\"trace_id\":", self.trace_id)]);
        line.extend_from_slice(b",\"target\":\"reprise::request\"}\n");
        line
    }
}

/// Each field as `prefix` (`,"name":`, one copy instead of four) and the
/// value as a JSON string.
fn push_strings(line: &mut Vec<u8>, fields: &[(&str, &str)]) {
    for (prefix, value) in fields {
        line.extend_from_slice(prefix.as_bytes());
        // Escapes quotes, backslashes and control characters: a path or a
        // policy id cannot break the line or the JSON. A string with none of
        // them (nearly every one) is the same bytes quoted, so it is copied
        // without serde_json's writer, which cost a good part of a line
        // (measured: `e2e/bench/results/2026-12-02-issue18-server-path.md`).
        if value.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
            line.push(b'"');
            line.extend_from_slice(value.as_bytes());
            line.push(b'"');
        } else {
            let _ = serde_json::to_writer(&mut *line, value);
        }
    }
}

fn push_number(line: &mut Vec<u8>, prefix: &str, value: impl Into<u64>) {
    line.extend_from_slice(prefix.as_bytes());
    push_digits(line, value.into(), 1);
}

/// Two digits, `value` below 100 (the timestamp's fields), without a copy.
fn push_two(line: &mut Vec<u8>, value: u64) {
    line.push(b'0' + (value / 10 % 10) as u8);
    line.push(b'0' + (value % 10) as u8);
}

/// `value` in decimal, zero-padded to `width` digits. `write!` through
/// `core::fmt` cost more for the timestamp and the numbers than the rest of
/// the line together (measured:
/// `e2e/bench/results/2026-12-02-issue18-server-path.md`).
fn push_digits(line: &mut Vec<u8>, mut value: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let mut start = digits.len();
    while value > 0 || start == digits.len() {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
    }
    let start = start.min(digits.len().saturating_sub(width));
    line.extend_from_slice(&digits[start..]);
}

/// `t` as RFC 3339 in UTC with microseconds, as log lines have it.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let mut text = Vec::with_capacity(27);
    push_timestamp(&mut text, t);
    String::from_utf8(text).unwrap_or_default()
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC, microseconds), the format of
/// tracing-subscriber's default timer, so every log line reads alike.
fn push_timestamp(line: &mut Vec<u8>, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let of_day = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    // Years before 1970 do not occur (the clock is after the epoch).
    push_digits(line, u64::try_from(year).unwrap_or(0), 4);
    line.push(b'-');
    push_two(line, u64::from(month));
    line.push(b'-');
    push_two(line, u64::from(day));
    line.push(b'T');
    push_two(line, of_day / 3600);
    line.push(b':');
    push_two(line, of_day / 60 % 60);
    line.push(b':');
    push_two(line, of_day % 60);
    line.push(b'.');
    push_digits(line, u64::from(since.subsec_micros()), 6);
    line.push(b'Z');
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // day is in 1..=31 and month in 1..=12 by construction.
    (year, month as u32, day as u32)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(secs: u64, micros: u32) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(u64::from(micros))
    }

    fn timestamp(t: SystemTime) -> String {
        let mut line = Vec::new();
        push_timestamp(&mut line, t);
        String::from_utf8(line).expect("utf-8")
    }

    #[test]
    fn timestamps_are_utc_with_microseconds_across_leap_days_and_centuries() {
        assert_eq!(timestamp(at(0, 0)), "1970-01-01T00:00:00.000000Z");
        assert_eq!(timestamp(at(951_782_400, 7)), "2000-02-29T00:00:00.000007Z");
        assert_eq!(
            timestamp(at(951_868_799, 999_999)),
            "2000-02-29T23:59:59.999999Z"
        );
        assert_eq!(timestamp(at(951_868_800, 0)), "2000-03-01T00:00:00.000000Z");
        assert_eq!(
            timestamp(at(1_796_083_200, 0)),
            "2026-12-01T00:00:00.000000Z"
        );
        assert_eq!(
            timestamp(at(4_107_456_000, 0)),
            "2100-02-28T00:00:00.000000Z"
        );
        assert_eq!(
            timestamp(at(4_107_542_400, 0)),
            "2100-03-01T00:00:00.000000Z"
        );
    }

    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        for value in [
            "",
            "/items",
            "rule:r1",
            "caf\u{e9}",
            "a\u{7f}b",
            "a\"b",
            "a\\b",
            "a\nb",
            "\u{1f}",
        ] {
            let mut line = Vec::new();
            push_strings(&mut line, &[(",\"k\":", value)]);
            let expected = format!(",\"k\":{}", serde_json::to_string(value).expect("json"));
            assert_eq!(
                String::from_utf8(line).expect("utf-8"),
                expected,
                "{value:?}"
            );
        }
    }

    #[test]
    fn digits_are_zero_padded_to_their_width_and_never_cut() {
        let digits = |v: u64, w: usize| {
            let mut line = Vec::new();
            push_digits(&mut line, v, w);
            String::from_utf8(line).expect("utf-8")
        };
        assert_eq!(digits(0, 1), "0");
        assert_eq!(digits(7, 2), "07");
        assert_eq!(digits(250, 6), "000250");
        assert_eq!(digits(12345, 2), "12345");
        assert_eq!(digits(u64::MAX, 1), u64::MAX.to_string());
        assert_eq!(digits(0, 4), "0000");
    }

    fn entry<'a>(path: &'a str, rule: &'a str) -> Entry<'a> {
        Entry {
            upstream: "api",
            method: "GET",
            path,
            rule,
            attempts: 2,
            max_attempts: 3,
            endpoints: "api-0,api-1",
            outcome: "recovered",
            reason: "",
            first_error: "upstream_status_503",
            error_detail: "",
            hedged: false,
            status: 200,
            grpc_status: "",
            duration_ms: 12.5,
            trace_id: "",
        }
    }

    /// The guide's access log table (docs/src/reference/logs.md) names
    /// exactly the fields a line carries: a field added, removed or renamed
    /// here fails until the table says so.
    #[test]
    fn the_log_fields_reference_names_every_field_and_no_other() {
        let line = entry("/items", "rule:r1").json_line(at(1_796_083_200, 250));
        let v: serde_json::Value = serde_json::from_slice(&line).expect("json");
        let fields: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
        let page = include_str!("../../../docs/src/reference/logs.md");
        let table = page
            .split("## The access log")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("the access log section");
        let mut documented: Vec<String> = table
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .map(str::to_string)
            .collect();
        // The keys come back sorted (serde_json's map); compare as sets.
        documented.sort();
        assert_eq!(
            documented, fields,
            "docs/src/reference/logs.md's access log table against a line's fields"
        );
    }

    #[test]
    fn a_line_is_one_json_object_with_every_field_typed() {
        let line = entry("/items", "rule:r1").json_line(at(1_796_083_200, 250));
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        let v: serde_json::Value = serde_json::from_slice(&line).expect("json");
        assert_eq!(v["timestamp"], "2026-12-01T00:00:00.000250Z");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["message"], "request");
        assert_eq!(v["target"], TARGET);
        assert_eq!(v["path"], "/items");
        assert_eq!(v["rule"], "rule:r1");
        assert_eq!(v["attempts"], 2);
        assert_eq!(v["max_attempts"], 3);
        assert_eq!(v["hedged"], false);
        assert_eq!(v["status"], 200);
        assert_eq!(v["grpc_status"], "");
        assert_eq!(v["duration_ms"], 12.5);
        assert_eq!(v["first_error"], "upstream_status_503");
        assert_eq!(v["trace_id"], "");
    }

    #[test]
    fn quotes_backslashes_and_control_characters_cannot_break_the_line() {
        let path = "/a\"b\\c\nd\u{1}";
        let line = entry(path, "rule:\"x\"").json_line(at(0, 0));
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        let v: serde_json::Value = serde_json::from_slice(&line).expect("json");
        assert_eq!(v["path"], path);
        assert_eq!(v["rule"], "rule:\"x\"");
    }
}
