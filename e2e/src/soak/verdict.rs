//! One request's verdict, and the evidence it reads: what the client saw
//! ([`Done`]), what every endpoint recorded for the request id ([`Rec`]), and
//! the sidecar's access-log event for it ([`LogEntry`], gathered from its
//! stdout by [`SidecarLogs`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::events::PROBE_IDS;
use super::faults::{Act, Endpoint, Rec};
use super::load::{BodyCheck, Done, ErrKind, Meth};
use super::{lock, DEADLINE_MS, REPLAY_CAP};

/// An answer later than the deadline plus this is unexpected.
const LATE_SLACK_MS: u64 = 1_500;

/// One request event from the sidecar's access log.
#[derive(Clone, Debug, Default)]
pub(crate) struct LogEntry {
    pub outcome: String,
    pub reason: String,
    pub attempts: u32,
    pub endpoints: String,
    pub status: u16,
    /// Access-log events seen for this id (a resend makes a second one only
    /// if the first send reached the sidecar).
    pub lines: u32,
}

#[derive(Debug, Default)]
pub(crate) struct SidecarLogs {
    pub by_id: Mutex<HashMap<u64, LogEntry>>,
    pub request_lines: AtomicU64,
    /// `LEVEL message` of every warn/error line, counted.
    pub notable: Mutex<BTreeMap<String, u64>>,
}

impl SidecarLogs {
    /// Reads one stdout line of the sidecar: a request's access-log event
    /// (by the id in its path), or a warn/error line, counted.
    pub fn record(&self, line: &str) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            *lock(&self.notable)
                .entry("(not JSON) ".to_string() + line.get(..80).unwrap_or(line))
                .or_default() += 1;
            return;
        };
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
        let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        if s("target") == "reprise::request" {
            self.request_lines.fetch_add(1, Ordering::Relaxed);
            let Some(id) = s("path")
                .strip_prefix("/r/")
                .and_then(|i| i.parse::<u64>().ok())
            else {
                return;
            };
            let mut by_id = lock(&self.by_id);
            let lines = by_id.get(&id).map_or(0, |e| e.lines) + 1;
            by_id.insert(
                id,
                LogEntry {
                    outcome: s("outcome"),
                    reason: s("reason"),
                    attempts: n("attempts") as u32,
                    endpoints: s("endpoints"),
                    status: n("status") as u16,
                    lines,
                },
            );
            return;
        }
        let level = s("level");
        if level == "WARN" || level == "ERROR" {
            let msg = s("message");
            *lock(&self.notable)
                .entry(format!("{level} {msg}"))
                .or_default() += 1;
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) enum Verdict {
    Success,
    Allowed(String),
    Unexpected(String),
}

pub(crate) struct Evidence<'a> {
    pub eps: &'a [Arc<Endpoint>],
    pub recs: &'a HashMap<u64, Vec<(usize, Rec)>>,
    pub logs: &'a HashMap<u64, LogEntry>,
}

/// A request the client saw fail is allowed to fail when the policy explains it:
///
/// 1. the client got an answer (a status, or headers and a body cut mid-way);
/// 2. the sidecar logged the request with that status, and no endpoint gave
///    it a complete healthy answer;
/// 3. every attempt the sidecar made (the log's `endpoints`) met an injected
///    fault: the endpoint recorded a 503, reset, stall, mid-body abort or a
///    kill while answering for this request id, or the attempt went to the
///    churn endpoint while its listener was closed (the request overlapped a
///    down interval, +-1 s);
/// 4. no more attempts than the policy allows (3 for GET and PUT, 1 for POST);
/// 5. the sidecar's outcome is one the policy permits for the method: GET and
///    PUT `exhausted` (attempts, budget, deadline, no_alternate), PUT over the
///    replay cap `skipped/body_consumed`, POST `skipped/method`; a body cut
///    after the headers needs an injected abort as the last delivery (bodies
///    are never retried once headers went out).
///
/// Anything else is unexpected.
pub(crate) fn verdict(d: &Done, ev: &Evidence<'_>) -> Verdict {
    let seen = d.last();
    let empty = Vec::new();
    let recs = ev.recs.get(&d.id).unwrap_or(&empty);
    if let Some(again) = &d.resent {
        // The first send must have reached nothing, or the resend duplicated it.
        if recs.iter().any(|(_, r)| r.t_ms < again.t_start) {
            return Verdict::Unexpected(
                "first send (failed during the restart) reached an endpoint; the resend duplicated it"
                    .into(),
            );
        }
        if ev.logs.get(&d.id).is_some_and(|l| l.lines > 1) {
            return Verdict::Unexpected(
                "first send (failed during the restart) was logged by the sidecar; the resend duplicated it"
                    .into(),
            );
        }
    }
    if recs.iter().any(|(_, r)| !r.body_ok) {
        return Verdict::Unexpected("request body arrived corrupted at an endpoint".into());
    }
    if d.method == Meth::Post && recs.len() > 1 {
        return Verdict::Unexpected(format!("POST delivered {} times", recs.len()));
    }
    if recs.len() > d.method.max_attempts() {
        return Verdict::Unexpected(format!(
            "{} delivered {} times (policy allows {})",
            d.method.as_str(),
            recs.len(),
            d.method.max_attempts()
        ));
    }
    if d.method != Meth::Post {
        let mut at: Vec<usize> = recs.iter().map(|(i, _)| *i).collect();
        at.sort_unstable();
        if at.windows(2).any(|w| w[0] == w[1]) {
            return Verdict::Unexpected(
                "retried on an endpoint it had already tried (reuse_endpoints is off)".into(),
            );
        }
    }
    let took = seen.t_end.saturating_sub(seen.t_start);
    if d.id < PROBE_IDS && seen.error.is_none() && took > DEADLINE_MS + LATE_SLACK_MS {
        return Verdict::Unexpected(format!(
            "answered after {took} ms; the total deadline is {DEADLINE_MS} ms"
        ));
    }
    let (Some(status), Some(body)) = (seen.status, seen.body.as_ref()) else {
        let (kind, text) = seen
            .error
            .clone()
            .unwrap_or((ErrKind::Other, String::new()));
        return Verdict::Unexpected(format!("no answer ({kind:?}): {}", short(&text)));
    };
    if (200..300).contains(&status) {
        match body {
            BodyCheck::Complete => return Verdict::Success,
            BodyCheck::Mismatch => {
                return Verdict::Unexpected("200 with another request's body".into())
            }
            BodyCheck::Cut => {
                let last = recs.iter().max_by_key(|(_, r)| r.t_ms);
                return match last {
                    Some((_, r)) if r.act == Act::Abort => {
                        Verdict::Allowed("body aborted mid-stream".into())
                    }
                    _ => Verdict::Unexpected("body cut without an injected abort".into()),
                };
            }
        }
    }
    let Some(log) = ev.logs.get(&d.id) else {
        return Verdict::Unexpected(format!("{status} without an access-log line"));
    };
    if log.status != status {
        return Verdict::Unexpected(format!(
            "client saw {status}, sidecar logged {}",
            log.status
        ));
    }
    if let Some((i, r)) = recs.iter().find(|(_, r)| r.healthy()) {
        return Verdict::Unexpected(format!(
            "client saw {status} but {} answered 200 at {} ms",
            ev.eps[*i].name, r.t_ms
        ));
    }
    if log.attempts as usize > d.method.max_attempts() {
        return Verdict::Unexpected(format!("{} attempts logged", log.attempts));
    }
    for name in log.endpoints.split(',').filter(|n| !n.is_empty()) {
        let Some(i) = ev.eps.iter().position(|e| e.name == name) else {
            return Verdict::Unexpected(format!("unknown endpoint {name} in the log"));
        };
        let here = recs.iter().any(|(j, _)| *j == i);
        if !here && !ev.eps[i].was_down(seen.t_start, seen.t_end) {
            return Verdict::Unexpected(format!(
                "attempt at {name} failed, but {name} recorded nothing and was up"
            ));
        }
    }
    if seen.reprise_error.is_none() {
        // The upstream's own answer, passed on: it must be the injected 503.
        let last = recs.iter().max_by_key(|(_, r)| r.t_ms);
        if !matches!(last, Some((_, r)) if r.act == Act::S503) || status != 503 {
            return Verdict::Unexpected(format!("{status} from upstream without an injected 503"));
        }
    }
    let outcome = format!("{}:{}", log.outcome, log.reason);
    let permitted = match d.method {
        Meth::Get => log.outcome == "exhausted",
        Meth::Put => {
            log.outcome == "exhausted"
                || (outcome == "skipped:body_consumed" && d.body_len > REPLAY_CAP)
        }
        Meth::Post => outcome == "skipped:method",
    };
    if permitted {
        Verdict::Allowed(outcome)
    } else {
        Verdict::Unexpected(format!("outcome {outcome} for {}", d.method.as_str()))
    }
}

pub(crate) fn short(s: &str) -> String {
    s.chars().take(160).collect()
}
