//! What one request's retries came to, as the access log, the metrics and
//! the spans report it: the [`Report`] (outcome, attempts, the endpoints
//! [`Tried`], the first failure, the backoffs) and where the policy that
//! ran came from ([`PolicySource`]).

use std::time::Duration;

use super::failure::FailureKind;
use super::outcome::Outcome;

/// What happened, for the log event, metrics and traces.
#[derive(Debug)]
pub(crate) struct Report {
    /// The outcome.
    pub(crate) outcome: Outcome,
    /// Attempts made, the first (and any hedge) included.
    pub(crate) attempts: u32,
    /// Endpoints tried, in order.
    pub(crate) tried: Tried,
    /// The first failure's kind.
    pub(crate) first_error: Option<FailureKind>,
    /// What the last failure that says more said (which check a
    /// certificate failed).
    pub(crate) error_detail: Option<&'static str>,
    /// The delays slept before each retry.
    pub(crate) backoffs: Vec<Duration>,
    /// True when a hedge was sent.
    pub(crate) hedged: bool,
    /// The attempts' time to their answers (or failures) and the backoffs
    /// between them: the time to the final answer, from clock readings the
    /// attempts make anyway (a hedge's overlap counted twice).
    pub(crate) elapsed: Duration,
}

/// Most attempts one request can make: 10 retries, the first attempt and a hedge.
pub(crate) const MAX_TRIED: usize = 12;

/// Endpoints one request has tried, by index, without allocating.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tried {
    len: usize,
    idx: [usize; MAX_TRIED],
}

impl Tried {
    /// Records that `i` was tried.
    pub(crate) fn insert(&mut self, i: usize) {
        if !self.contains(i) && self.len < MAX_TRIED {
            self.idx[self.len] = i;
            self.len += 1;
        }
    }

    /// True when `i` was tried.
    pub(crate) fn contains(&self, i: usize) -> bool {
        self.idx[..self.len].contains(&i)
    }

    /// Indexes tried, in order.
    pub(crate) fn as_slice(&self) -> &[usize] {
        &self.idx[..self.len]
    }
}

/// Where a policy came from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PolicySource<'a> {
    /// A retry rule, by id.
    Rule(&'a str),
    /// The upstream's own `retries` block.
    Upstream,
}

impl std::fmt::Display for PolicySource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicySource::Rule(id) => write!(f, "rule:{id}"),
            PolicySource::Upstream => f.write_str("upstream"),
        }
    }
}
