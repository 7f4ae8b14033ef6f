//! The summary, in three steps: [`count`] tallies every request, delivery,
//! metric and sample; [`Report::judge`] turns the counts into the list of
//! failed checks (`e2e/soak/README.md`'s "The run fails" list); [`format`] writes the
//! text. [`Report::render`] runs the three.

mod count;
mod format;

use std::sync::Arc;
use std::time::Duration;

use reprise_testkit::upstream::Deliveries;

use self::count::Counts;
use super::events::{EventLog, DRAIN_PROBES};
use super::faults::Endpoint;
use super::load::{Done, MAX_IN_FLIGHT};
use super::resources::{Usage, FD_GROWTH_MAX, RSS_GROWTH_MAX};
use super::verdict::SidecarLogs;

/// Everything the summary reads.
pub(crate) struct Report<'a> {
    pub secs: u64,
    pub rate: u64,
    pub eps: &'a [Arc<Endpoint>],
    pub deliveries: &'a Deliveries,
    pub results: &'a [Done],
    pub samples: &'a [Usage],
    pub events: &'a EventLog,
    pub logs: &'a SidecarLogs,
    pub saturated: u64,
    pub max_lag: Duration,
    pub warmup_ms: u64,
    pub traffic_end_ms: u64,
}

impl Report<'_> {
    /// The summary text, and whether every check passed.
    pub fn render(&self) -> (String, bool) {
        let counts = count::count(self);
        let fails = self.judge(&counts);
        (format::format(self, &counts, &fails), fails.is_empty())
    }

    /// Every failed check, in the order the summary lists them.
    fn judge(&self, c: &Counts) -> Vec<String> {
        let mut fails: Vec<String> = self.events.failures.clone();
        for (gen, code, _) in &self.events.exits {
            if *code != Some(0) {
                fails.push(format!("sidecar #{gen} exited with {code:?}"));
            }
        }
        let p = &c.probes;
        if self.events.sigterm_ms > 0 && p.sent as u64 != DRAIN_PROBES {
            fails.push(format!(
                "only {} of {DRAIN_PROBES} drain probes finished",
                p.sent
            ));
        }
        if p.lost + p.unexpected > 0 {
            fails.push(format!(
                "drain probes: {} lost, {} unexpected",
                p.lost, p.unexpected
            ));
        }
        if c.post_dups > 0 {
            fails.push(format!("{} POST(s) delivered more than once", c.post_dups));
        }
        for u in &c.usage {
            let gen = u.gen;
            if let Some(growth) = u.growth().filter(|g| *g > RSS_GROWTH_MAX) {
                fails.push(format!(
                    "sidecar #{gen}: RSS grew {:.1}% after warm-up (limit {:.0}%)",
                    growth * 100.0,
                    RSS_GROWTH_MAX * 100.0
                ));
            }
            if let Some(fd_growth) = u.fd_growth().filter(|g| *g > FD_GROWTH_MAX) {
                fails.push(format!("sidecar #{gen}: open fds grew by {fd_growth} after warm-up (limit {FD_GROWTH_MAX})"));
            }
        }
        let unexpected = c.sum(|r| r.unexpected);
        if unexpected > 0 {
            fails.push(format!("{unexpected} request(s) failed unexpectedly"));
        }
        if c.lost_at_term > 0 {
            fails.push(format!(
                "{} request(s) in flight at SIGTERM lost",
                c.lost_at_term
            ));
        }
        if self.saturated > 0 {
            fails.push(format!(
                "{} request(s) not sent: {MAX_IN_FLIGHT} already in flight",
                self.saturated
            ));
        }
        fails
    }
}
