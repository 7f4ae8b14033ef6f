//! The sidecar's resources: `VmRSS`, `Threads` and open fds from `/proc`,
//! sampled every [`SAMPLE_EVERY`], and their summary per process after its
//! warm-up (start and end are medians of three samples).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;

use super::load::RestartClock;
use super::{lock, now_ms};

pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// Growth after warm-up beyond these fails the run.
pub(crate) const RSS_GROWTH_MAX: f64 = 0.20;
pub(crate) const FD_GROWTH_MAX: i64 = 20;

/// One sample of one process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Usage {
    pub t_ms: u64,
    pub gen: u32,
    pub rss_kib: u64,
    pub fds: i64,
    pub threads: u64,
}

/// A sample of process `pid` (generation `gen`), if it is still there.
pub(crate) fn sample(pid: u32, gen: u32) -> Option<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as i64;
    Some(Usage {
        t_ms: now_ms(),
        gen,
        rss_kib: field("VmRSS:")?,
        fds,
        threads: field("Threads:")?,
    })
}

/// Samples the process whose pid is in `pid` (none while it is 0) every
/// [`SAMPLE_EVERY`] until `stop`, for at most the run's length plus a few rounds.
pub(crate) fn spawn_sampler(
    pid: Arc<AtomicU32>,
    restart: Arc<RestartClock>,
    samples: Arc<Mutex<Vec<Usage>>>,
    stop: Arc<AtomicBool>,
    duration_ms: u64,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let rounds = duration_ms / SAMPLE_EVERY.as_millis() as u64 + 5;
        for _ in 0..rounds {
            tokio::time::sleep(SAMPLE_EVERY).await;
            if stop.load(Ordering::SeqCst) {
                break;
            }
            // The pid first: the events task stores the generation before the pid.
            let pid = pid.load(Ordering::SeqCst);
            let gen = restart.generation.load(Ordering::SeqCst);
            if let Some(s) = sample(pid, gen) {
                lock(&samples).push(s);
            }
        }
    })
}

/// The sample with the median RSS and, separately, the median fd count, of up to three samples.
fn median3<'a>(samples: impl Iterator<Item = &'a &'a Usage>) -> Option<Usage> {
    let list: Vec<Usage> = samples.map(|s| **s).collect();
    let mid = list.len().checked_sub(1)? / 2;
    let mut rss: Vec<u64> = list.iter().map(|s| s.rss_kib).collect();
    let mut fds: Vec<i64> = list.iter().map(|s| s.fds).collect();
    rss.sort_unstable();
    fds.sort_unstable();
    let t_ms = list.iter().map(|s| s.t_ms).max()?;
    Some(Usage {
        t_ms,
        gen: list[0].gen,
        rss_kib: rss[mid],
        fds: fds[mid],
        threads: list[0].threads,
    })
}

/// One process's samples after its warm-up, summed up.
#[derive(Clone, Debug)]
pub(crate) struct ProcessUsage {
    pub gen: u32,
    /// Every sample of the process, warm-up included.
    pub all: usize,
    /// The samples after warm-up.
    pub after: Vec<Usage>,
    /// Medians of the first and last three after warm-up; `None` without any.
    pub first: Option<Usage>,
    pub last: Option<Usage>,
}

impl ProcessUsage {
    /// The largest of `field` after warm-up.
    pub fn max<T: Ord + Default>(&self, field: impl Fn(&Usage) -> T) -> T {
        self.after.iter().map(field).max().unwrap_or_default()
    }

    /// RSS growth from first to last, as a fraction of the first.
    pub fn growth(&self) -> Option<f64> {
        let (first, last) = (self.first?, self.last?);
        Some((last.rss_kib as f64 - first.rss_kib as f64) / first.rss_kib.max(1) as f64)
    }

    /// Open fds gained from first to last.
    pub fn fd_growth(&self) -> Option<i64> {
        Some(self.last?.fds - self.first?.fds)
    }
}

/// Process 1 (from the start) and, when the restart happened, process 2
/// (from `ready_again_ms`), each after `warmup_ms`.
pub(crate) fn per_process(
    samples: &[Usage],
    ready_again_ms: u64,
    warmup_ms: u64,
) -> Vec<ProcessUsage> {
    let mut gens = vec![(1u32, 0u64)];
    if ready_again_ms > 0 {
        gens.push((2, ready_again_ms));
    }
    gens.into_iter()
        .map(|(gen, started)| {
            let all: Vec<&Usage> = samples.iter().filter(|s| s.gen == gen).collect();
            let after: Vec<&Usage> = all
                .iter()
                .copied()
                .filter(|s| s.t_ms >= started + warmup_ms)
                .collect();
            ProcessUsage {
                gen,
                all: all.len(),
                first: median3(after.iter().take(3)),
                last: median3(after.iter().rev().take(3)),
                after: after.into_iter().copied().collect(),
            }
        })
        .collect()
}
