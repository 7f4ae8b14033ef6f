//! What one request's retries came to, as the access log, the metrics, the
//! spans and the diagnostics report it: the [`Report`] (outcome, attempts,
//! the endpoints [`Tried`], the first failure, the backoffs, and for a
//! request that needed more than its first attempt each attempt's
//! [`AttemptRecord`]) and where the policy that ran came from
//! ([`PolicySource`]).

use std::time::Duration;

use http::uri::PathAndQuery;
use http::Method;
use tokio::time::Instant;

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
    /// What a request that did not get by on its first attempt leaves for
    /// the diagnostics and the spans. Boxed, and absent until an attempt
    /// fails or a second one is made: the request its first attempt answered
    /// carries one empty pointer.
    pub(crate) detail: Option<Box<Detail>>,
}

/// The part of a [`Report`] only some requests have.
#[derive(Debug, Default)]
pub(crate) struct Detail {
    /// Each attempt that failed, was cancelled, or answered after another
    /// one was made, in the order they ended.
    pub(crate) history: Vec<AttemptRecord>,
    /// The request's method and path, copied when it ends other than `ok`
    /// (for the diagnostics; the template they come from is gone by then).
    pub(crate) request: Option<(Method, PathAndQuery)>,
}

/// One attempt, as the diagnostics list it and a retried request's spans
/// record it after the fact.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttemptRecord {
    /// The endpoint's index.
    pub(crate) endpoint: usize,
    /// How it ended.
    pub(crate) end: AttemptEnd,
    /// When it was sent.
    pub(crate) started: Instant,
    /// From sending to its response headers, failure or cancellation.
    pub(crate) elapsed: Duration,
    /// The id its CLIENT span was given when that span recorded nothing
    /// (an unsampled trace), so that it can be recorded later under the id
    /// the endpoint saw in `traceparent`.
    pub(crate) unrecorded_span: Option<[u8; 8]>,
}

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttemptEnd {
    /// Its response was the final one: `status`, and the `grpc-status` its
    /// headers or early trailers carried.
    Answered {
        /// The status.
        status: u16,
        /// The gRPC status, when known.
        grpc_status: Option<u8>,
    },
    /// It failed with `kind`; `status` when the endpoint answered one.
    Failed {
        /// The failure.
        kind: FailureKind,
        /// The status of a retryable response.
        status: Option<u16>,
    },
    /// The other attempt of a hedge answered first.
    Cancelled,
}

impl Report {
    /// Records an attempt.
    pub(crate) fn push_attempt(&mut self, record: AttemptRecord) {
        self.detail
            .get_or_insert_with(Box::default)
            .history
            .push(record);
    }

    /// The attempts recorded, in the order they ended.
    pub(crate) fn history(&self) -> &[AttemptRecord] {
        self.detail.as_deref().map_or(&[], |d| &d.history)
    }

    /// The history ordered by when each attempt was sent (a hedge race can
    /// end them out of order).
    pub(crate) fn attempts_in_order(&self) -> Vec<AttemptRecord> {
        let mut attempts = self.history().to_vec();
        attempts.sort_by_key(|a| a.started);
        attempts
    }

    /// Keeps the request's method and path.
    pub(crate) fn keep_request(&mut self, method: Method, path: PathAndQuery) {
        self.detail.get_or_insert_with(Box::default).request = Some((method, path));
    }

    /// The method and path kept, if any.
    pub(crate) fn request(&self) -> Option<&(Method, PathAndQuery)> {
        self.detail.as_deref()?.request.as_ref()
    }
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
