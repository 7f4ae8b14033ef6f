//! Step one of the summary: every tally the text shows and the checks read.

use std::collections::{BTreeMap, HashMap};

use reprise_testkit::prometheus::Sample;

use super::Report;
use crate::soak::faults::{faults_at, Act, Rec, Role};
use crate::soak::load::{BodyCheck, ConnMode, ErrKind, Meth};
use crate::soak::resources::{self, ProcessUsage};
use crate::soak::verdict::{short, verdict, Evidence, Verdict};
use crate::soak::{lock, REPLAY_CAP};

/// Requests of one method.
#[derive(Debug, Default)]
pub(super) struct Row {
    pub sent: u64,
    pub ok: u64,
    pub allowed: u64,
    pub unexpected: u64,
}

/// The drain probes.
#[derive(Debug, Default)]
pub(super) struct Probes {
    pub sent: usize,
    pub in_flight: u64,
    pub ok: u64,
    pub allowed: u64,
    pub unexpected: u64,
    pub lost: u64,
    /// One line per unexpected probe.
    pub notes: Vec<String>,
}

/// One endpoint's deliveries.
#[derive(Debug)]
pub(super) struct EndpointRow {
    pub name: &'static str,
    pub requests: usize,
    pub connections: u64,
    pub acts: BTreeMap<&'static str, u64>,
    /// The churn endpoint: answers cut by a kill, times its listener was
    /// closed, and for how long in all (ms, until the traffic ended).
    pub churn: Option<(u64, usize, u64)>,
}

#[derive(Debug, Default)]
pub(super) struct Counts {
    pub rows: BTreeMap<Meth, Row>,
    pub by_status: BTreeMap<String, u64>,
    pub allowed: BTreeMap<String, u64>,
    pub unexpected: BTreeMap<String, u64>,
    pub examples: Vec<String>,
    pub calm_failures: u64,
    /// 2xx latencies, sorted.
    pub latencies: Vec<u64>,
    pub pooled: u64,
    pub fresh: u64,
    pub over_cap: u64,
    pub with_body: u64,
    pub in_flight_at_term: u64,
    pub lost_at_term: u64,
    pub refused: u64,
    pub refused_ok: u64,
    pub other_in_window: u64,
    pub closed_by_drain: u64,
    pub closed_ok: u64,
    pub examples_drain: Vec<String>,
    pub probes: Probes,
    pub endpoints: Vec<EndpointRow>,
    pub post_dups: u64,
    pub put_multi: u64,
    pub put_multi_after_write: u64,
    pub get_multi: u64,
    pub retried: u64,
    pub post_marked: u64,
    /// Both processes' metrics added, by series.
    pub metrics: BTreeMap<String, Sample>,
    pub usage: Vec<ProcessUsage>,
}

impl Counts {
    /// A column of the method rows, added.
    pub fn sum(&self, f: fn(&Row) -> u64) -> u64 {
        self.rows.values().map(f).sum()
    }
}

pub(super) fn count(r: &Report<'_>) -> Counts {
    let records: Vec<Vec<Rec>> = r.eps.iter().map(|e| e.records()).collect();
    let mut recs: HashMap<u64, Vec<(usize, Rec)>> = HashMap::new();
    for (i, list) in records.iter().enumerate() {
        for rec in list {
            recs.entry(rec.id).or_default().push((i, rec.clone()));
        }
    }
    let logs = lock(&r.logs.by_id).clone();
    let ev = Evidence {
        eps: r.eps,
        recs: &recs,
        logs: &logs,
    };
    let mut c = Counts::default();
    requests(r, &ev, &mut c);
    probes(r, &ev, &mut c);
    deliveries(r, &records, &recs, &mut c);
    for m in &r.events.metrics {
        for s in m.samples() {
            c.metrics
                .entry(s.series())
                .or_insert_with(|| Sample {
                    value: 0.0,
                    ..s.clone()
                })
                .value += s.value;
        }
    }
    c.usage = resources::per_process(r.samples, r.events.ready_again_ms, r.warmup_ms);
    c
}

/// The client's requests: verdicts by method, failures by answer, the restart's.
fn requests(r: &Report<'_>, ev: &Evidence<'_>, c: &mut Counts) {
    let sigterm = r.events.sigterm_ms;
    let ready = r.events.ready_again_ms;
    for d in r.results {
        let row = c.rows.entry(d.method).or_default();
        row.sent += 1;
        match d.conn {
            ConnMode::Pooled => c.pooled += 1,
            ConnMode::Fresh => c.fresh += 1,
        }
        if d.body_len > 0 {
            c.with_body += 1;
        }
        if d.body_len > REPLAY_CAP {
            c.over_cap += 1;
        }
        let v = verdict(d, ev);
        let seen = d.last();
        if !matches!(v, Verdict::Success) {
            let key = match (seen.status, &seen.body, &seen.error) {
                (Some(s), Some(BodyCheck::Cut), _) => format!("{s} + body cut"),
                (Some(s), _, _) => match &seen.reprise_error {
                    Some(k) => format!("{s} {k}"),
                    None => format!("{s} (upstream's)"),
                },
                (None, _, Some((k, _))) => format!("no answer: {k:?}"),
                _ => "no answer".into(),
            };
            *c.by_status.entry(key).or_default() += 1;
            if !faults_at(seen.t_start).any() && !faults_at(seen.t_end).any() {
                c.calm_failures += 1;
            }
        }
        match &v {
            Verdict::Success => {
                row.ok += 1;
                c.latencies.push(seen.t_end - seen.t_start);
            }
            Verdict::Allowed(why) => {
                row.allowed += 1;
                *c.allowed
                    .entry(format!("{} {why}", d.method.as_str()))
                    .or_default() += 1;
            }
            Verdict::Unexpected(why) => {
                row.unexpected += 1;
                let class = why.split(':').next().unwrap_or(why).to_string();
                *c.unexpected
                    .entry(format!("{} {class}", d.method.as_str()))
                    .or_default() += 1;
                if c.examples.len() < 12 {
                    c.examples.push(format!(
                        "id {} {} at {:.3} s ({:?}, body {} B): {why}",
                        d.id,
                        d.method.as_str(),
                        seen.t_start as f64 / 1000.0,
                        d.conn,
                        d.body_len
                    ));
                }
            }
        }
        // The restart.
        if sigterm > 0 {
            let f = &d.first;
            let refused_here = matches!(f.error, Some((ErrKind::Refused, _)));
            if refused_here && d.resent.is_some() {
                c.refused += 1;
                if matches!(v, Verdict::Success) {
                    c.refused_ok += 1;
                }
            } else if d.resent.is_some() {
                c.closed_by_drain += 1;
                if matches!(v, Verdict::Success) {
                    c.closed_ok += 1;
                }
                if c.examples_drain.len() < 5 {
                    c.examples_drain.push(format!(
                        "id {} {} ({:?}) sent at {:.3} s, SIGTERM at {:.3} s: {}",
                        d.id,
                        d.method.as_str(),
                        d.conn,
                        f.t_start as f64 / 1000.0,
                        sigterm as f64 / 1000.0,
                        f.error.as_ref().map_or(String::new(), |(_, t)| short(t))
                    ));
                }
            } else if f.t_start < sigterm && f.t_end >= sigterm {
                c.in_flight_at_term += 1;
                if f.error.is_some() {
                    c.lost_at_term += 1;
                }
            } else if f.t_start >= sigterm && f.t_start <= ready && f.error.is_some() {
                c.other_in_window += 1;
            }
        }
    }
    c.latencies.sort_unstable();
}

fn probes(r: &Report<'_>, ev: &Evidence<'_>, c: &mut Counts) {
    let sigterm = r.events.sigterm_ms;
    let p = &mut c.probes;
    p.sent = r.events.probes.len();
    for d in &r.events.probes {
        if d.first.t_start < sigterm && d.first.t_end >= sigterm {
            p.in_flight += 1;
        }
        if d.first.error.is_some() {
            p.lost += 1;
        }
        match verdict(d, ev) {
            Verdict::Success => p.ok += 1,
            Verdict::Allowed(_) => p.allowed += 1,
            Verdict::Unexpected(why) => {
                p.unexpected += 1;
                p.notes.push(format!(
                    "drain probe id {} {}: {why}",
                    d.id,
                    d.method.as_str()
                ));
            }
        }
    }
}

/// What reached the endpoints: acts per endpoint, requests delivered more than once.
fn deliveries(
    r: &Report<'_>,
    records: &[Vec<Rec>],
    recs: &HashMap<u64, Vec<(usize, Rec)>>,
    c: &mut Counts,
) {
    for (e, log) in r.eps.iter().zip(records) {
        let mut acts: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut killed = 0;
        for rec in log {
            *acts.entry(rec.act.name()).or_default() += 1;
            if rec.act == Act::Ok && !rec.done {
                killed += 1;
            }
        }
        let churn = (e.role == Role::Churn).then(|| {
            let down = lock(&e.down);
            let down_ms: u64 = down
                .iter()
                .map(|(d, u)| u.min(&r.traffic_end_ms).saturating_sub(*d))
                .sum();
            (killed, down.len(), down_ms)
        });
        c.endpoints.push(EndpointRow {
            name: e.name,
            requests: log.len(),
            connections: e.up.connections(),
            acts,
            churn,
        });
        c.retried += log.iter().filter(|r| r.attempt >= 2).count() as u64;
        c.post_marked += log
            .iter()
            .filter(|r| r.method == "POST" && r.attempt > 0)
            .count() as u64;
    }
    for (id, _) in r.deliveries.repeated() {
        let Some(list) = id.parse::<u64>().ok().and_then(|id| recs.get(&id)) else {
            continue;
        };
        match list[0].1.method.as_str() {
            "POST" => c.post_dups += 1,
            "PUT" => {
                c.put_multi += 1;
                if list.iter().any(|(_, r)| {
                    matches!(r.act, Act::Reset | Act::Stall) || (r.act == Act::Ok && !r.done)
                }) {
                    c.put_multi_after_write += 1;
                }
            }
            _ => c.get_multi += 1,
        }
    }
}
