//! Differential tests of HTTP/1 message framing: the same bytes through four
//! HTTP/1 implementations acting as a proxy — Reprise (the sidecar, through
//! its real listener and real upstream connections), hyper's own HTTP/1
//! server and client back to back (the reference parser), nginx and HAProxy
//! — and what each made of them compared ([`peers`]).
//!
//! - Part A, response framing ([`responses`]): a raw upstream answers with a
//!   corpus of well- and ill-framed responses; the interpretation is the
//!   status, the transfer codings left on the body (a coding dropped on the
//!   way reaches the client unlabelled) and the body the client got, and
//!   the client then asks for a second
//!   response on the same connection to catch leftover bytes (a desync).
//! - Part B, request framing ([`requests`]): a raw client sends a corpus of
//!   well- and ill-framed requests, each followed in the same write by
//!   `GET /smuggled`; the interpretation is the list of requests (method,
//!   path, `Host`, transfer codings left on the body, body) a strict
//!   recording upstream received; a request with other than one `Host` is
//!   one it cannot frame (RFC 9112 §3.2).
//!
//! The rule, per case (the point of these tests):
//! 1. If Reprise forwarded, its interpretation equals that of every other
//!    implementation that forwarded. A peer that rejected (a 4xx/5xx of its
//!    own, a close) is not a disagreement, and in Part B neither is a peer
//!    that stopped earlier in the list (one list a prefix of the other). So
//!    when the forwarding peers disagree among themselves, Reprise must have
//!    rejected.
//! 2. Reprise never desyncs: in A the second response is exactly `second` or
//!    the connection was closed; in B the upstream never receives a request
//!    hidden in the first request's body, nor one it cannot frame strictly,
//!    and a `/smuggled` it receives is the real second request (unglued),
//!    last, after a first request every forwarding peer read the same way.
//! 3. Reprise answers well-formed HTTP/1.1; in A it answers at all (the
//!    upstream always ends its message or closes, so a hang is a failure);
//!    and a case marked valid (well-formed per RFC 9112) must be forwarded as
//!    sent, so that rejecting everything cannot pass.
//!
//! Each part prints a table (case, then each implementation's outcome; run
//! with `--nocapture`) and fails once, listing every failing case. A case the
//! current sidecar fails stays in the corpus and is listed in [`KNOWN`] with
//! the reason; it is printed, not failed.

#[path = "differential/peers.rs"]
mod peers;
#[path = "differential/requests.rs"]
mod requests;
#[path = "differential/responses.rs"]
mod responses;
#[path = "differential/wire.rs"]
mod wire;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use futures_util::future::join_all;

use crate::peers::{Kind, Peers, KINDS};

/// Cases the current sidecar fails, `("A:name" | "B:name", why)`: kept in
/// the corpus, printed, not failed. Empty since the sidecar's own HTTP/1
/// codec: the hyper client forwarded a chunked response's Content-Length
/// (`A:chunked-then-cl`, `A:cl-then-chunked`: 3 of 5 bytes reached the
/// client). A listed case that passes fails the test, so the list stays true.
const KNOWN: &[(&str, &str)] = &[];

/// Time for requests a proxy forwards after the client's last read (a
/// request hidden in a body, say) to reach the upstream before it is read.
const SETTLE: Duration = Duration::from_millis(300);

/// `bytes` quoted with escapes, shortened past 24 bytes (with the length).
pub fn show(bytes: &[u8]) -> String {
    let text = bytes.escape_ascii().to_string();
    if bytes.len() <= 24 {
        format!("\"{text}\"")
    } else {
        let cut: String = text.chars().take(20).collect();
        format!("\"{cut}…\"({})", bytes.len())
    }
}

/// One table row: the case, one cell per implementation, the verdict.
struct Row {
    case: String,
    cells: Vec<String>,
    verdict: Verdict,
}

enum Verdict {
    Pass(&'static str),
    Known(&'static str, Vec<String>),
    Fail(Vec<String>),
}

/// The verdict on a case from its rule violations.
fn verdict(part: &str, name: &str, failures: Vec<String>, note: &'static str) -> Verdict {
    let known = KNOWN
        .iter()
        .find(|(k, _)| *k == format!("{part}:{name}"))
        .map(|(_, why)| *why);
    match (failures.is_empty(), known) {
        (true, None) => Verdict::Pass(note),
        (true, Some(_)) => Verdict::Fail(vec!["passes, but listed in KNOWN: remove it".to_owned()]),
        (false, Some(why)) => Verdict::Known(why, failures),
        (false, None) => Verdict::Fail(failures),
    }
}

/// Prints the table and KNOWN, then fails listing every failing case.
fn report(title: &str, peers: &Peers, rows: &[Row], extra: &str, took: Duration) {
    let mut out = format!("\n== {title}\n");
    for n in &peers.notices {
        out += &format!("{n}\n");
    }
    let mut widths = vec!["case".len()];
    widths.extend(KINDS.iter().map(|k| k.name().len()));
    for r in rows {
        widths[0] = widths[0].max(r.case.chars().count());
        for (i, c) in r.cells.iter().enumerate() {
            widths[i + 1] = widths[i + 1].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>, verdict: &str| {
        let mut l = String::new();
        for (c, w) in cells.iter().zip(&widths) {
            let _ = write!(l, "{c:<w$}  ");
        }
        format!("{l}{verdict}\n")
    };
    let mut header = vec!["case"];
    header.extend(KINDS.iter().map(|k| k.name()));
    out += &line(header, "verdict");
    let mut failed = Vec::new();
    for r in rows {
        let v = match &r.verdict {
            Verdict::Pass(note) => format!("ok{}{note}", if note.is_empty() { "" } else { ": " }),
            Verdict::Known(why, f) => format!("KNOWN ({why}): {}", f.join("; ")),
            Verdict::Fail(f) => {
                failed.push(format!("{}: {}", r.case, f.join("; ")));
                format!("FAIL: {}", f.join("; "))
            }
        };
        let mut cells = vec![r.case.as_str()];
        cells.extend(r.cells.iter().map(String::as_str));
        out += &line(cells, &v);
    }
    out += "KNOWN disagreements of the current sidecar:\n";
    if KNOWN.is_empty() {
        out += "  (none)\n";
    }
    for (k, why) in KNOWN {
        out += &format!("  {k}: {why}\n");
    }
    out += extra;
    out += &format!("{} cases in {took:.1?}\n", rows.len());
    // One print: the two parts run at once and must not interleave.
    println!("{out}");
    assert!(
        failed.is_empty(),
        "{title}: {} failing case(s):\n{}\n{}",
        failed.len(),
        failed.join("\n"),
        peers.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_framing_agrees_with_hyper_nginx_and_haproxy() {
    use responses::{exchange, First, Second, Upstream, CASES};
    let upstream = Upstream::start().await;
    let peers = Peers::start([upstream.addr; 4]).await;
    let started = Instant::now();
    // Every case at once: the path ties each request to its case.
    let runs = join_all((0..CASES.len()).map(|n| {
        let peers = &peers;
        async move {
            join_all(KINDS.map(|kind| async move {
                let front = peers.front(kind).await?;
                Some(exchange(front.addr, n).await)
            }))
            .await
        }
    }))
    .await;
    let took = started.elapsed();
    let rows: Vec<Row> = CASES
        .iter()
        .zip(&runs)
        .map(|(case, outcomes)| {
            let reprise = outcomes[0].as_ref().expect("Reprise always runs");
            let mut failures = Vec::new();
            let forwarding: Vec<(Kind, responses::Forwarded<'_>)> = KINDS
                .iter()
                .zip(outcomes)
                .skip(1)
                .filter_map(|(k, o)| Some((*k, o.as_ref()?.first.forwarded()?)))
                .collect();
            // Rule 1.
            if let Some(mine) = reprise.first.forwarded() {
                for (kind, theirs) in &forwarding {
                    if mine != *theirs {
                        failures.push(format!(
                            "Reprise forwarded {} {:?} {}, {} forwarded {} {:?} {}",
                            mine.0,
                            mine.1,
                            show(mine.2),
                            kind.name(),
                            theirs.0,
                            theirs.1,
                            show(theirs.2)
                        ));
                    }
                }
            }
            // Rule 2.
            if let Second::Other(what) = &reprise.second {
                failures.push(format!(
                    "second response on the connection was not `second`: {what}"
                ));
            }
            // Rule 3.
            match &reprise.first {
                First::Hung => failures.push("Reprise never answered".into()),
                First::Garbled(why) => failures.push(format!("Reprise sent garbage: {why}")),
                First::Forwarded { .. } => {}
                _ if case.valid => failures.push("a valid response was not forwarded".into()),
                _ => {}
            }
            let differ = forwarding.windows(2).any(|w| w[0].1 != w[1].1);
            let note = if differ { "peers differ" } else { "" };
            Row {
                case: case.name.to_string(),
                cells: outcomes
                    .iter()
                    .map(|o| o.as_ref().map_or("skipped".into(), ToString::to_string))
                    .collect(),
                verdict: verdict("A", case.name, failures, note),
            }
        })
        .collect();
    report(
        "Part A: response framing (first response | second on the same connection)",
        &peers,
        &rows,
        "",
        took,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_framing_agrees_with_hyper_nginx_and_haproxy() {
    use requests::{exchange, Answer, Bad, Outcome, Seen, Upstream, CASES};
    // One recording upstream per implementation, so a record belongs to
    // one; the path ties it to a case.
    let upstreams = [
        Upstream::start().await,
        Upstream::start().await,
        Upstream::start().await,
        Upstream::start().await,
    ];
    let peers = Peers::start(upstreams.each_ref().map(|u| u.addr)).await;
    let started = Instant::now();
    // Every case through every implementation at once.
    let answers = join_all((0..CASES.len()).map(|n| {
        let peers = &peers;
        async move {
            join_all(KINDS.map(|kind| async move {
                let front = peers.front(kind).await?;
                let answer = exchange(front.addr, n).await;
                Some(answer)
            }))
            .await
        }
    }))
    .await;
    // The sidecars are gone; what their upstream connections (and the other
    // proxies) still had in flight arrives now.
    tokio::time::sleep(SETTLE).await;
    let mut untied = String::new();
    let mut seen: Vec<Vec<Vec<Seen>>> = Vec::new();
    for (kind, upstream) in KINDS.iter().zip(&upstreams) {
        let (per_case, stray) = upstream.take();
        seen.push(per_case);
        for s in stray {
            let _ = writeln!(
                untied,
                "  {} upstream received, tied to no case: {s}",
                kind.name()
            );
        }
    }
    let runs: Vec<Vec<Option<Outcome>>> = answers
        .into_iter()
        .enumerate()
        .map(|(n, answers)| {
            answers
                .into_iter()
                .zip(&seen)
                .map(|(a, seen)| {
                    a.map(|answer| Outcome {
                        answer,
                        seen: seen[n].clone(),
                    })
                })
                .collect()
        })
        .collect();
    let took = started.elapsed();
    let rows: Vec<Row> = CASES
        .iter()
        .zip(&runs)
        .map(|(case, outcomes)| {
            let reprise = outcomes[0].as_ref().expect("Reprise always runs");
            let mut failures = Vec::new();
            let forwarding: Vec<(Kind, &[Seen])> = KINDS
                .iter()
                .zip(outcomes)
                .skip(1)
                .filter_map(|(k, o)| Some((*k, o.as_ref()?.forwarded()?)))
                .collect();
            let list = |s: &[Seen]| {
                let v: Vec<String> = s.iter().map(Seen::to_string).collect();
                format!("[{}]", v.join(", "))
            };
            // Rule 1: one list a prefix of the other (a peer may stop early).
            if let Some(mine) = reprise.forwarded() {
                for (kind, theirs) in &forwarding {
                    if !(mine.starts_with(theirs) || theirs.starts_with(mine)) {
                        failures.push(format!(
                            "Reprise forwarded {}, {} forwarded {}",
                            list(mine),
                            kind.name(),
                            list(theirs)
                        ));
                    }
                }
            }
            // Rule 2, whatever the client was answered.
            let seen = &reprise.seen;
            for (i, s) in seen.iter().enumerate() {
                if s.path == "/hidden" {
                    failures.push(format!("the upstream received the hidden request: {s}"));
                }
                if let Some(Bad::Invalid(why)) = &s.bad {
                    failures.push(format!(
                        "the upstream could not frame what Reprise sent: {why}"
                    ));
                }
                if s.body.windows(9).any(|w| w == b"/smuggled") {
                    failures.push(format!("the second request was glued into a body: {s}"));
                }
                if s.path == "/smuggled" {
                    if s.method != case.second_method() || !s.body.is_empty() || i + 1 != seen.len()
                    {
                        failures.push(format!("not the real second request: {s}"));
                    }
                    for (kind, theirs) in &forwarding {
                        if theirs.first() != seen.first() {
                            failures.push(format!(
                                "the second request was forwarded though {} read the first as {}",
                                kind.name(),
                                list(theirs)
                            ));
                        }
                    }
                }
            }
            // Rule 3 (a hang is allowed here: waiting for the rest of a
            // body the proxy read as longer is no harm).
            if let Answer::Garbled(why) = &reprise.answer {
                failures.push(format!("Reprise sent garbage: {why}"));
            }
            if case.valid {
                let body: &[u8] = if case.body.is_empty() { b"" } else { b"hello" };
                match seen.first() {
                    Some(s)
                        if reprise.answer == Answer::Forwarded
                            && s.path == "/first"
                            && s.body == body => {}
                    _ => failures.push("a valid request was not forwarded as sent".into()),
                }
            }
            // Every pair: being a prefix of one another is not transitive.
            let differ = forwarding.iter().enumerate().any(|(i, (_, a))| {
                forwarding[i + 1..]
                    .iter()
                    .any(|(_, b)| !(a.starts_with(b) || b.starts_with(a)))
            });
            let note = if differ { "peers differ" } else { "" };
            Row {
                case: case.name.to_string(),
                cells: outcomes
                    .iter()
                    .map(|o| o.as_ref().map_or("skipped".into(), ToString::to_string))
                    .collect(),
                verdict: verdict("B", case.name, failures, note),
            }
        })
        .collect();
    report(
        "Part B: request framing (answer to the first request [requests the upstream received])",
        &peers,
        &rows,
        &untied,
        took,
    );
}
