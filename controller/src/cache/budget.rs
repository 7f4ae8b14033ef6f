//! Which XBackendTrafficPolicy sets a Service's retry budget: of those
//! targeting it (in its namespace), the oldest, then the first by name, as
//! Gateway API settles conflicts between policies.

use std::sync::Arc;

use kube::ResourceExt;
use reprise_crds::snapshot::SnapshotBudget;

use super::Cache;
use crate::policy::budget::{self, XBackendTrafficPolicy};
use crate::policy::route::read::Refused;

impl Cache {
    /// The XBackendTrafficPolicy that sets the budget of Service `name` in
    /// `namespace`, with the budget it gives or why it is not applied.
    pub(crate) fn budget_of(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<(Arc<XBackendTrafficPolicy>, Result<SnapshotBudget, Refused>)> {
        let mut candidates = self
            .traffic_policies
            .store
            .state_filter(|p| p.namespace().as_deref() == Some(namespace) && p.targets(name));
        candidates.sort_by(|a, b| {
            let created = |p: &XBackendTrafficPolicy| {
                p.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.as_second())
            };
            created(a)
                .cmp(&created(b))
                .then_with(|| a.name_any().cmp(&b.name_any()))
        });
        let first = candidates.into_iter().next()?;
        let verdict = budget::budget(&first.spec);
        Some((first, verdict))
    }
}
