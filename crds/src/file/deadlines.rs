//! `deadlines` as written, in a rule, an upstream's `retries` block or
//! `proxy` (`docs/src/reference/file-format.md`, "`deadlines`").

use serde::{Deserialize, Serialize};

use crate::policy::DeadlinePolicy;

/// Deadline propagation switches; an absent key is on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadlinesSpec {
    /// Attempts carry the request's deadline to the next hop (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub propagate: Option<bool>,
    /// A deadline that came with the request caps its attempts (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accept_incoming: Option<bool>,
}

impl DeadlinesSpec {
    /// True when no key is set (nothing to write back).
    pub fn is_empty(&self) -> bool {
        self == &DeadlinesSpec::default()
    }

    /// The switches, absent keys on.
    pub(crate) fn resolve(&self) -> DeadlinePolicy {
        DeadlinePolicy {
            propagate: self.propagate.unwrap_or(true),
            accept_incoming: self.accept_incoming.unwrap_or(true),
        }
    }
}
