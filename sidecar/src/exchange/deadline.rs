//! The deadline that travels between hops, as an entry of W3C `baggage`
//! (`docs/src/tasks/deadlines.md`): read from a request the application
//! forwarded, and written over each attempt's `baggage` with the
//! application's own entries kept.
//!
//! The wire form is one list-member, `reprise-deadline=<ms>`: the deadline
//! as milliseconds since the Unix epoch. Absolute, because applications
//! forward baggage unchanged (OpenTelemetry's propagators do): a relative
//! value would not shrink by the time an application spent before calling
//! the next hop. It assumes the nodes' clocks agree (NTP) to well within the
//! deadlines in use; what a skewed value can do is bounded by [`read`]'s
//! rules.
//!
//! Reading ([`read`]): every `baggage` field is scanned (the list rule
//! allows several); an entry that is not 1 to 15 digits is malformed, one
//! more than [`STALE_AFTER`] in the past is stale (a replayed or queued
//! request, or a clock far off), one more than [`FARTHEST`] ahead is far in
//! the future: all three are ignored, never a failure of the request. Of
//! several valid entries the earliest counts (any caller may set one, and
//! it may only ever shorten that caller's own request).
//!
//! A second entry, `reprise-retry=1`, marks an attempt that is an upper
//! layer's retry or hedge, for policies that retry once across layers
//! (`retry_layers: once`; [`has_retry_mark`], [`with_entries`]).
//!
//! Writing ([`with_entries`]): the application's list-members are kept, in
//! their order, byte for byte but for the whitespace around them; the
//! Reprise entry takes the place of the first one already there (others of
//! its key go, a deduplication the specification allows) or is appended.
//! Nothing is written when the result would pass the specification's limits
//! ([`MAX_MEMBERS`], [`MAX_BYTES`]: what OpenTelemetry's SDKs keep, the
//! larger dropped whole by some), or when a member of the application's is
//! not valid baggage (a parser downstream may refuse the whole field):
//! the application's baggage then goes out as it came.

use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;
use std::time::Duration;
use tokio::time::Instant;

/// The W3C baggage request field.
pub(crate) const BAGGAGE: HeaderName = HeaderName::from_static("baggage");

/// Whether `headers` hold a `baggage` field. A scan of a request's few
/// names costs less than the map's hashed lookup, and every request with
/// the incoming deadline accepted asks (instructions.sh measured the
/// lookup at about 200 instructions a request).
pub(crate) fn has_baggage(headers: &http::HeaderMap) -> bool {
    headers.keys().any(|name| *name == BAGGAGE)
}
/// The key of the Reprise entry.
pub(crate) const KEY: &str = "reprise-deadline";
/// The key of the mark an upper layer's retry or hedge carries
/// (`retry_layers: once`).
pub(crate) const RETRY_KEY: &str = "reprise-retry";
/// List-members a baggage field may hold for every conforming platform to
/// keep them all (W3C Baggage, "Limits").
pub(crate) const MAX_MEMBERS: usize = 64;
/// Bytes a baggage field may hold for every conforming platform to keep it.
pub(crate) const MAX_BYTES: usize = 8192;
/// A deadline further in the past than this is stale: ignored.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(60);
/// A deadline further ahead than this is not a request's: ignored.
pub(crate) const FARTHEST: Duration = Duration::from_secs(3600);
/// Digits a value may have (epoch milliseconds have 13 until the year 2286).
const MAX_DIGITS: usize = 15;

/// What a request's baggage says of its deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Received {
    /// No Reprise entry.
    Absent,
    /// The earliest valid entry: the deadline in Unix milliseconds.
    Valid(u64),
    /// Entries there were, none valid: why the first was ignored.
    Ignored(Ignored),
}

/// Why a received deadline was ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Ignored {
    /// Not 1 to 15 digits.
    Malformed,
    /// More than [`STALE_AFTER`] in the past.
    Stale,
    /// More than [`FARTHEST`] ahead.
    FarFuture,
}

impl Ignored {
    /// Every reason, in the metric's order.
    pub(crate) const ALL: [Ignored; 3] = [Ignored::Malformed, Ignored::Stale, Ignored::FarFuture];

    /// The reason's name in metrics, spans and logs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Ignored::Malformed => "malformed",
            Ignored::Stale => "stale",
            Ignored::FarFuture => "far_future",
        }
    }

    /// The position in [`Self::ALL`].
    pub(crate) fn index(self) -> usize {
        match self {
            Ignored::Malformed => 0,
            Ignored::Stale => 1,
            Ignored::FarFuture => 2,
        }
    }
}

/// What a propagated deadline stopped: an attempt not made, or cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Stop {
    /// It had passed when the request came: no attempt was made (`504`).
    BeforeFirstAttempt,
    /// A retry (or its backoff) would have started at or after it.
    Retry,
    /// Less than the hedge's delay was left: no hedge was sent.
    Hedge,
    /// An attempt's wait for its response headers was cut at it.
    AttemptCut,
}

impl Stop {
    /// Every stop, in the metric's order.
    pub(crate) const ALL: [Stop; 4] = [
        Stop::BeforeFirstAttempt,
        Stop::Retry,
        Stop::Hedge,
        Stop::AttemptCut,
    ];

    /// The stop's name in metrics and spans.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stop::BeforeFirstAttempt => "before_first_attempt",
            Stop::Retry => "retry",
            Stop::Hedge => "hedge",
            Stop::AttemptCut => "attempt_cut",
        }
    }

    /// The position in [`Self::ALL`].
    pub(crate) fn index(self) -> usize {
        match self {
            Stop::BeforeFirstAttempt => 0,
            Stop::Retry => 1,
            Stop::Hedge => 2,
            Stop::AttemptCut => 3,
        }
    }
}

/// Why an attempt's baggage could not carry the deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotWritten {
    /// The result would pass [`MAX_MEMBERS`] or [`MAX_BYTES`].
    Full,
    /// A member of the application's is not valid baggage.
    Malformed,
}

impl NotWritten {
    /// Every reason, in the metric's order.
    pub(crate) const ALL: [NotWritten; 2] = [NotWritten::Full, NotWritten::Malformed];

    /// The reason's name in metrics.
    pub(crate) fn name(self) -> &'static str {
        match self {
            NotWritten::Full => "baggage_full",
            NotWritten::Malformed => "baggage_malformed",
        }
    }

    /// The position in [`Self::ALL`].
    pub(crate) fn index(self) -> usize {
        match self {
            NotWritten::Full => 0,
            NotWritten::Malformed => 1,
        }
    }
}

/// One request's deadline across hops: the deadline that came with it,
/// whether its attempts carry one on, and the wall clock's reading at one
/// instant of the monotonic clock the retry loop runs on (to turn Unix
/// milliseconds into instants and back: one wall clock read per request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hops {
    /// The wall clock at `at`, in Unix milliseconds.
    wall_ms: u64,
    at: Instant,
    /// The deadline that came with the request and is accepted, in Unix ms.
    pub(crate) incoming_ms: Option<u64>,
    /// Attempts carry the request's deadline to the next hop.
    pub(crate) propagate: bool,
}

impl Hops {
    /// The wall clock read `wall_ms` at `at`.
    pub(crate) fn new(
        wall_ms: u64,
        at: Instant,
        incoming_ms: Option<u64>,
        propagate: bool,
    ) -> Self {
        Hops {
            wall_ms,
            at,
            incoming_ms,
            propagate,
        }
    }

    /// The instant of the wall clock's `ms`.
    pub(crate) fn instant(&self, ms: u64) -> Instant {
        if ms >= self.wall_ms {
            self.at + Duration::from_millis(ms - self.wall_ms)
        } else {
            let ago = Duration::from_millis(self.wall_ms - ms);
            self.at.checked_sub(ago).unwrap_or(self.at)
        }
    }

    /// The wall clock's milliseconds at `t` (rounded down).
    pub(crate) fn ms(&self, t: Instant) -> u64 {
        let whole = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        match t.checked_duration_since(self.at) {
            Some(after) => self.wall_ms.saturating_add(whole(after)),
            None => {
                let before = self.at.saturating_duration_since(t);
                let part = u64::from(!before.subsec_nanos().is_multiple_of(1_000_000));
                self.wall_ms
                    .saturating_sub(whole(before).saturating_add(part))
            }
        }
    }

    /// True when the incoming deadline had passed at the reading.
    pub(crate) fn passed(&self) -> bool {
        self.incoming_ms.is_some_and(|ms| ms <= self.wall_ms)
    }

    /// The incoming deadline as an instant.
    pub(crate) fn incoming(&self) -> Option<Instant> {
        self.incoming_ms.map(|ms| self.instant(ms))
    }
}

/// The deadline `headers`' baggage carries, judged at `now_ms` (the wall
/// clock, in Unix milliseconds: injected, so skew is testable).
pub(crate) fn read(headers: &HeaderMap, now_ms: u64) -> Received {
    let mut earliest: Option<u64> = None;
    let mut first_ignored = None;
    for field in headers.get_all(BAGGAGE) {
        for member in field.as_bytes().split(|b| *b == b',') {
            let Some(value) = own_value(member) else {
                continue;
            };
            match judge(value, now_ms) {
                Ok(ms) => earliest = Some(earliest.map_or(ms, |e| e.min(ms))),
                Err(why) => {
                    first_ignored.get_or_insert(why);
                }
            }
        }
    }
    match (earliest, first_ignored) {
        (Some(ms), _) => Received::Valid(ms),
        (None, Some(why)) => Received::Ignored(why),
        (None, None) => Received::Absent,
    }
}

/// True when `headers`' baggage carries the mark of an upper layer's retry.
pub(crate) fn has_retry_mark(headers: &HeaderMap) -> bool {
    headers.get_all(BAGGAGE).iter().any(|field| {
        field
            .as_bytes()
            .split(|b| *b == b',')
            .any(|m| value_of(RETRY_KEY, m).is_some())
    })
}

/// The value of `member` (its properties left out) when its key is the
/// Reprise entry's.
fn own_value(member: &[u8]) -> Option<&[u8]> {
    value_of(KEY, member)
}

/// The value of `member` (its properties left out) when its key is `key`.
fn value_of<'m>(key: &str, member: &'m [u8]) -> Option<&'m [u8]> {
    let member = trim(member);
    let rest = member.strip_prefix(key.as_bytes())?;
    let rest = trim_start(rest).strip_prefix(b"=")?;
    let value = rest.split(|b| *b == b';').next().unwrap_or_default();
    Some(trim(value))
}

/// A value's deadline, or why it is ignored.
fn judge(value: &[u8], now_ms: u64) -> Result<u64, Ignored> {
    if value.is_empty() || value.len() > MAX_DIGITS || !value.iter().all(u8::is_ascii_digit) {
        return Err(Ignored::Malformed);
    }
    let ms = value.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    if ms.saturating_add(millis(STALE_AFTER)) < now_ms {
        return Err(Ignored::Stale);
    }
    if ms > now_ms.saturating_add(millis(FARTHEST)) {
        return Err(Ignored::FarFuture);
    }
    Ok(ms)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The baggage field an attempt sends: `headers`' baggage with the Reprise
/// entry set to `deadline_ms`, or why it cannot carry it (the field is then
/// left as it is).
#[cfg(test)]
pub(crate) fn with_deadline(
    headers: &HeaderMap,
    deadline_ms: u64,
) -> Result<HeaderValue, NotWritten> {
    with_entries(headers, Some(deadline_ms), false)
}

/// The baggage field an attempt sends: `headers`' baggage with the Reprise
/// entry set to `deadline_ms` when given (an entry already there stays
/// otherwise), and with the retry mark when `mark` (once), or why it cannot
/// carry them (the field is then left as it is).
pub(crate) fn with_entries(
    headers: &HeaderMap,
    deadline_ms: Option<u64>,
    mark: bool,
) -> Result<HeaderValue, NotWritten> {
    let mut out = String::with_capacity(64);
    let mut members = 0usize;
    let mut written = deadline_ms.is_none();
    let mut marked = !mark;
    for field in headers.get_all(BAGGAGE) {
        for member in field.as_bytes().split(|b| *b == b',') {
            let member = trim(member);
            // An empty element is no member (RFC 9110 §5.6.1: recipients
            // accept and ignore them).
            if member.is_empty() {
                continue;
            }
            match deadline_ms {
                Some(ms) if own_value(member).is_some() => {
                    if written {
                        continue;
                    }
                    written = true;
                    push_entry(&mut out, KEY, ms);
                }
                _ => {
                    if !is_member(member) {
                        return Err(NotWritten::Malformed);
                    }
                    if value_of(RETRY_KEY, member).is_some() {
                        marked = true;
                    }
                    if !out.is_empty() {
                        out.push(',');
                    }
                    // ASCII: is_member accepted only visible ASCII, spaces and tabs.
                    out.push_str(std::str::from_utf8(member).map_err(|_| NotWritten::Malformed)?);
                }
            }
            members += 1;
            if members > MAX_MEMBERS || out.len() > MAX_BYTES {
                return Err(NotWritten::Full);
            }
        }
    }
    if let (false, Some(ms)) = (written, deadline_ms) {
        push_entry(&mut out, KEY, ms);
        members += 1;
    }
    if !marked {
        push_entry(&mut out, RETRY_KEY, 1);
        members += 1;
    }
    if members > MAX_MEMBERS || out.len() > MAX_BYTES {
        return Err(NotWritten::Full);
    }
    HeaderValue::from_str(&out).map_err(|_| NotWritten::Malformed)
}

/// Appends `key=value`, after a comma when `out` has members.
fn push_entry(out: &mut String, key: &str, value: u64) {
    use std::fmt::Write;
    if !out.is_empty() {
        out.push(',');
    }
    let _ = write!(out, "{key}={value}");
}

/// True for a list-member of the W3C grammar: `key OWS "=" OWS value *( OWS
/// ";" OWS property )`, a property being `key OWS "=" OWS value` or `key OWS`.
fn is_member(member: &[u8]) -> bool {
    let mut parts = member.split(|b| *b == b';');
    let Some(first) = parts.next() else {
        return false;
    };
    let Some(eq) = first.iter().position(|b| *b == b'=') else {
        return false;
    };
    if !is_key(trim(&first[..eq])) || !is_value(trim(&first[eq + 1..])) {
        return false;
    }
    parts.all(|property| match property.iter().position(|b| *b == b'=') {
        Some(eq) => is_key(trim(&property[..eq])) && is_value(trim(&property[eq + 1..])),
        None => is_key(trim(property)),
    })
}

/// A token (RFC 9110 §5.6.2).
fn is_key(key: &[u8]) -> bool {
    !key.is_empty()
        && key
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b))
}

/// `*baggage-octet`: visible ASCII but `"`, `,`, `;` and `\` (a value
/// may contain `=`).
fn is_value(value: &[u8]) -> bool {
    value
        .iter()
        .all(|b| matches!(b, 0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E))
}

fn is_ows(b: &u8) -> bool {
    *b == b' ' || *b == b'\t'
}

fn trim_start(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|b| !is_ows(b)).unwrap_or(s.len());
    &s[start..]
}

fn trim(s: &[u8]) -> &[u8] {
    let s = trim_start(s);
    let end = s.iter().rposition(|b| !is_ows(b)).map_or(0, |i| i + 1);
    &s[..end]
}

#[cfg(test)]
mod tests;
