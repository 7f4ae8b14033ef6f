//! The peers' reports, parsed once per version of their ConfigMap: the
//! leader reads them for every policy it reconciles and every publication
//! of the traffic, and a report can hold thousands of policies.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;

use super::{of_other, PeerReport};

/// Reports by ConfigMap name, with the resource version they were parsed at.
#[derive(Debug, Default)]
pub(super) struct Parsed {
    by_name: Mutex<HashMap<String, Versioned>>,
}

/// A ConfigMap's resource version and the report it carried then.
type Versioned = (String, Option<Arc<PeerReport>>);

impl Parsed {
    /// The reports of `cms` that are not `me`'s, parsing only those whose
    /// ConfigMap changed since the last call; forgets ConfigMaps gone.
    pub(super) fn of(&self, cms: &[Arc<ConfigMap>], me: &str) -> Vec<Arc<PeerReport>> {
        let mut by_name = self.by_name.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for cm in cms.iter().filter(|cm| of_other(cm, me)) {
            let name = cm.name_any();
            let version = cm.resource_version().unwrap_or_default();
            let entry = match by_name.get(&name) {
                Some((v, report)) if !version.is_empty() && *v == version => report.clone(),
                _ => {
                    let report = PeerReport::of(cm).map(Arc::new);
                    by_name.insert(name.clone(), (version, report.clone()));
                    report
                }
            };
            out.extend(entry);
            seen.insert(name);
        }
        if by_name.len() > seen.len() {
            by_name.retain(|name, _| seen.contains(name));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::SYNC_COUNTS_LABEL;

    fn cm(name: &str, owner: &str, version: &str, heartbeat: i64) -> Arc<ConfigMap> {
        let report = format!(r#"{{"heartbeat":{heartbeat},"counts":{{}}}}"#);
        Arc::new(ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(version.into()),
                labels: Some([(SYNC_COUNTS_LABEL.to_string(), owner.to_string())].into()),
                ..Default::default()
            },
            data: Some([("report".to_string(), report)].into()),
            ..Default::default()
        })
    }

    #[test]
    fn a_report_is_parsed_again_only_when_its_configmap_changed() {
        let parsed = Parsed::default();
        let first = parsed.of(&[cm("a", "a", "1", 10), cm("me", "me", "1", 10)], "me");
        assert_eq!(first.len(), 1, "its own report is not a peer's");
        let again = parsed.of(&[cm("a", "a", "1", 10)], "me");
        assert!(
            Arc::ptr_eq(&first[0], &again[0]),
            "the same version: not parsed again"
        );
        let changed = parsed.of(&[cm("a", "a", "2", 20)], "me");
        assert_eq!(changed[0].heartbeat, 20);
        assert!(parsed.of(&[], "me").is_empty());
        assert!(
            parsed.by_name.lock().expect("lock").is_empty(),
            "a ConfigMap gone is forgotten"
        );
    }
}
