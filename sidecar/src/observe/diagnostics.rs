//! The diagnostics: the last requests that were retried or failed, each with
//! its attempts, for the admin `/diagnostics` page.
//!
//! The contract: [`Diagnostics`] keeps at most `proxy.diagnostics_retained`
//! entries, newest first, in a ring that drops the oldest; 0 keeps none and
//! records nothing. Only requests that did not end `ok` are recorded
//! (`recovered`, `exhausted`, `skipped`); the caller checks the outcome
//! first, so a request its first attempt answered never reaches this module
//! (no allocation, no lock). Every string an entry holds is cut at
//! [`MAX_TEXT`] bytes, and a request makes at most 12 attempts, so each entry
//! and the whole ring are bounded.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::access_log::rfc3339;
use crate::exchange::report::{AttemptEnd, PolicySource, Report};

/// Longest string an entry keeps, in bytes (a path, a method, a name): the
/// request's own strings are as long as its head allows.
pub(crate) const MAX_TEXT: usize = 256;

/// The ring of recent entries.
#[derive(Debug)]
pub(crate) struct Diagnostics {
    /// Entries kept; 0: off.
    retained: AtomicUsize,
    /// Newest first.
    ring: Mutex<VecDeque<Arc<Entry>>>,
}

/// One request that was retried or failed.
#[derive(Debug, Serialize)]
pub(crate) struct Entry {
    /// When its response head went out (RFC 3339, UTC).
    pub(crate) time: String,
    /// The upstream it was routed to.
    pub(crate) upstream: String,
    /// `rule:<id>`, `upstream` or `none`, as the access log has it.
    pub(crate) rule: String,
    /// Its method.
    pub(crate) method: String,
    /// Its path, without the query (it may carry credentials).
    pub(crate) path: String,
    /// The status the client got.
    pub(crate) status: u16,
    /// `recovered`, `exhausted` or `skipped`.
    pub(crate) outcome: &'static str,
    /// Why `exhausted` or `skipped`; empty for `recovered`.
    pub(crate) reason: &'static str,
    /// Its trace, or empty when it was not traced.
    pub(crate) trace_id: String,
    /// Its attempts, in the order they were sent.
    pub(crate) attempts: Vec<AttemptEntry>,
}

/// One attempt of an [`Entry`].
#[derive(Debug, Serialize)]
pub(crate) struct AttemptEntry {
    /// The endpoint, as the access log names it (its pod, else `address:port`).
    pub(crate) endpoint: String,
    /// `null` on the attempt that answered; else the failure kind
    /// (`x-reprise-error`'s names), or `cancelled` for the attempt of a
    /// hedge the other one beat.
    pub(crate) error: Option<Cow<'static, str>>,
    /// From sending to response headers, failure or cancellation.
    pub(crate) duration_ms: f64,
}

/// Which entries a reader wants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Filter {
    /// Only this upstream's (compared without case).
    pub(crate) upstream: Option<String>,
    /// Only this outcome's.
    pub(crate) outcome: Option<String>,
    /// At most this many, newest first.
    pub(crate) limit: Option<usize>,
}

/// What [`Diagnostics::record`] needs of a request besides its report.
#[derive(Debug)]
pub(crate) struct Finished<'a> {
    /// The upstream's name.
    pub(crate) upstream: &'a str,
    /// The policy that applied.
    pub(crate) source: Option<PolicySource<'a>>,
    /// The status the client got.
    pub(crate) status: u16,
    /// Its trace id, when traced.
    pub(crate) trace_id: Option<String>,
}

impl Diagnostics {
    /// A ring keeping `retained` entries.
    pub(crate) fn new(retained: usize) -> Self {
        Self {
            retained: AtomicUsize::new(retained),
            ring: Mutex::new(VecDeque::new()),
        }
    }

    /// Entries kept from now on (a reload); fewer drops the oldest, 0 all.
    pub(crate) fn retain(&self, retained: usize) {
        self.retained.store(retained, Ordering::Relaxed);
        let mut ring = self.lock();
        if ring.len() > retained {
            ring.truncate(retained);
            ring.shrink_to(retained);
        }
    }

    /// True when entries are kept.
    pub(crate) fn is_on(&self) -> bool {
        self.retained.load(Ordering::Relaxed) > 0
    }

    /// Records a request that did not end `ok` (`report`), whose endpoint
    /// `i` is named `label(i)`. Does nothing while off.
    pub(crate) fn record<'l>(
        &self,
        finished: Finished<'_>,
        label: impl Fn(usize) -> &'l str,
        report: &Report,
    ) {
        let retained = self.retained.load(Ordering::Relaxed);
        if retained == 0 {
            return;
        }
        let (method, path) = report
            .request()
            .map_or(("", ""), |(m, p)| (m.as_str(), p.path()));
        let rule = match finished.source {
            None => "none".to_string(),
            Some(s) => s.to_string(),
        };
        let attempts = report
            .attempts_in_order()
            .iter()
            .map(|a| AttemptEntry {
                endpoint: capped(label(a.endpoint)),
                error: match a.end {
                    AttemptEnd::Answered { .. } => None,
                    AttemptEnd::Failed { kind, .. } => Some(kind.name()),
                    AttemptEnd::Cancelled => Some(Cow::Borrowed("cancelled")),
                },
                duration_ms: millis(a.elapsed),
            })
            .collect();
        let entry = Arc::new(Entry {
            time: rfc3339(SystemTime::now()),
            upstream: capped(finished.upstream),
            rule: capped(&rule),
            method: capped(method),
            path: capped(path),
            status: finished.status,
            outcome: report.outcome.name(),
            reason: report.outcome.reason(),
            trace_id: finished.trace_id.unwrap_or_default(),
            attempts,
        });
        let mut ring = self.lock();
        ring.push_front(entry);
        ring.truncate(retained);
    }

    /// The entries `filter` asks for, newest first; `None` while off.
    pub(crate) fn entries(&self, filter: &Filter) -> Option<Vec<Arc<Entry>>> {
        if !self.is_on() {
            return None;
        }
        let ring = self.lock();
        let matching = ring.iter().filter(|e| {
            filter
                .upstream
                .as_deref()
                .is_none_or(|u| e.upstream.eq_ignore_ascii_case(u))
                && filter.outcome.as_deref().is_none_or(|o| e.outcome == o)
        });
        // Shared, not copied: the lock is held only while the ring is read,
        // never while the page is written.
        Some(
            matching
                .take(filter.limit.unwrap_or(usize::MAX))
                .cloned()
                .collect(),
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<Entry>>> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `text` cut at [`MAX_TEXT`] bytes, on a character boundary.
fn capped(text: &str) -> String {
    if text.len() <= MAX_TEXT {
        return text.to_string();
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Milliseconds, to the microsecond.
fn millis(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use http::uri::PathAndQuery;
    use http::Method;
    use tokio::time::Instant;

    use super::*;
    use crate::exchange::failure::FailureKind;
    use crate::exchange::outcome::{ExhaustedBy, Outcome};
    use crate::exchange::report::{AttemptRecord, Detail, Tried};

    fn report(outcome: Outcome, path: &str) -> Report {
        let start = Instant::now();
        let attempt = |endpoint, end, after_ms| AttemptRecord {
            endpoint,
            end,
            started: start + Duration::from_millis(after_ms),
            elapsed: Duration::from_micros(1500),
            unrecorded_span: None,
        };
        Report {
            outcome,
            attempts: 2,
            tried: Tried::default(),
            first_error: Some(FailureKind::UpstreamStatus(503)),
            error_detail: None,
            backoffs: Vec::new(),
            hedged: false,
            elapsed: Duration::from_millis(30),
            detail: Some(Box::new(Detail {
                // Ended out of order (a hedge race): listed by when they were sent.
                history: vec![
                    attempt(
                        1,
                        AttemptEnd::Answered {
                            status: 200,
                            grpc_status: None,
                        },
                        10,
                    ),
                    attempt(
                        0,
                        AttemptEnd::Failed {
                            kind: FailureKind::UpstreamStatus(503),
                            status: Some(503),
                        },
                        0,
                    ),
                ],
                request: Some((Method::GET, PathAndQuery::try_from(path).expect("path"))),
            })),
        }
    }

    fn finished(upstream: &str) -> Finished<'_> {
        Finished {
            upstream,
            source: Some(PolicySource::Upstream),
            status: 200,
            trace_id: None,
        }
    }

    const LABELS: [&str; 2] = ["10.0.0.1:80", "api-1"];

    #[tokio::test(start_paused = true)]
    async fn an_entry_lists_its_attempts_in_the_order_they_were_sent() {
        let d = Diagnostics::new(10);
        d.record(
            finished("api"),
            |i| LABELS[i],
            &report(Outcome::Recovered, "/items?token=secret"),
        );
        let entries = d.entries(&Filter::default()).expect("on");
        let json = serde_json::to_value(&*entries[0]).expect("json");
        assert_eq!(json["path"], "/items", "no query");
        assert_eq!(json["outcome"], "recovered");
        assert_eq!(json["reason"], "");
        assert_eq!(json["rule"], "upstream");
        assert_eq!(json["trace_id"], "");
        assert_eq!(
            json["attempts"],
            serde_json::json!([
                {"endpoint": "10.0.0.1:80", "error": "upstream_status_503", "duration_ms": 1.5},
                {"endpoint": "api-1", "error": null, "duration_ms": 1.5},
            ])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_ring_keeps_the_newest_and_filters_before_the_limit() {
        let d = Diagnostics::new(3);
        for (i, upstream) in ["api", "web", "api", "web", "api"].iter().enumerate() {
            let outcome = if i % 2 == 0 {
                Outcome::Recovered
            } else {
                Outcome::Exhausted(ExhaustedBy::Attempts)
            };
            d.record(
                finished(upstream),
                |i| LABELS[i],
                &report(outcome, &format!("/{i}")),
            );
        }
        let paths = |filter: Filter| -> Vec<String> {
            d.entries(&filter)
                .expect("on")
                .iter()
                .map(|e| e.path.clone())
                .collect()
        };
        assert_eq!(paths(Filter::default()), ["/4", "/3", "/2"]);
        let api = Filter {
            upstream: Some("API".into()),
            ..Filter::default()
        };
        assert_eq!(paths(api), ["/4", "/2"]);
        let exhausted = Filter {
            outcome: Some("exhausted".into()),
            ..Filter::default()
        };
        assert_eq!(paths(exhausted), ["/3"]);
        let one = Filter {
            limit: Some(1),
            ..Filter::default()
        };
        assert_eq!(paths(one), ["/4"]);
        d.retain(1);
        assert_eq!(paths(Filter::default()), ["/4"], "fewer drops the oldest");
        d.retain(0);
        assert!(d.entries(&Filter::default()).is_none(), "off");
        d.record(
            finished("api"),
            |i| LABELS[i],
            &report(Outcome::Recovered, "/5"),
        );
        d.retain(5);
        assert!(
            d.entries(&Filter::default()).expect("on").is_empty(),
            "nothing was recorded while off"
        );
    }

    #[test]
    fn strings_are_cut_on_a_character_boundary() {
        let long = "é".repeat(200);
        let cut = capped(&long);
        assert!(cut.len() <= MAX_TEXT && cut.len() >= MAX_TEXT - 1);
        assert!(long.starts_with(&cut));
        assert_eq!(capped("/short"), "/short");
    }
}
