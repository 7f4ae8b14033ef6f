//! The admit phase: which policy applies to a request and whether a failure
//! of it may be retried at all, decided before anything is sent. The first
//! enabled rule that matches wins (by priority, then id), else the upstream's
//! own `retries` block; upgrades and methods the policy does not retry are
//! skipped up front.

use reprise_crds::RetryPolicy;

use super::route::{self, ChosenPolicy, RequestFacts, Routes};
use crate::exchange::outcome::SkipReason;
use crate::observe::metrics::ProxyMetrics;
use crate::retry::attempt::RequestTemplate;
use crate::retry::upstream::UpstreamState;
use crate::retry::Plan;

/// What the admit phase decided.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Admission<'a> {
    /// The policy and where it came from, when one applies.
    pub(crate) chosen: Option<ChosenPolicy<'a>>,
    /// What the retry loop may do.
    pub(crate) plan: Plan<'a>,
}

/// Admits the request `template` repeats for `upstream`.
pub(crate) fn admit<'a>(
    routes: &'a Routes,
    upstream: &'a UpstreamState,
    template: &RequestTemplate,
    upgrade: bool,
    metrics: &ProxyMetrics,
) -> Admission<'a> {
    let request = RequestFacts {
        method: template.head.method.as_str(),
        path: template.head.path_and_query.path(),
        query: template.head.path_and_query.query(),
        host: template
            .authority
            .as_ref()
            .map_or("", route::authority_host),
        headers: &template.head.headers,
    };
    let method = request.method;
    let chosen = routes.policy_for(upstream, &request, |rule| metrics.record_cel_error(rule));
    let policy = chosen.map(|c| c.policy);
    let skip = if upgrade {
        Some(SkipReason::Upgrade)
    } else {
        match policy {
            None => Some(SkipReason::RetriesOff),
            Some(p) if !p.enabled() => Some(SkipReason::RetriesOff),
            Some(p) if !p.methods.contains(method) => Some(SkipReason::Method),
            Some(_) => None,
        }
    };
    Admission {
        chosen,
        plan: Plan { policy, skip },
    }
}

impl Admission<'_> {
    /// The policy when a failure may be retried at all: the body is
    /// buffered for replay only then.
    pub(crate) fn retry_policy(&self) -> Option<&RetryPolicy> {
        self.plan.policy.filter(|_| self.plan.skip.is_none())
    }

    /// Retries the policy allows beyond the first attempt (0 without one).
    pub(crate) fn max_retries(&self) -> u32 {
        self.plan.policy.map_or(0, |p| p.max_retries)
    }
}
