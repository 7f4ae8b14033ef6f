//! Which pods a verb about pods reads, named as kubectl names them: `NAME`
//! or `pod/NAME`, a workload whose selector picks its pods (`deploy/NAME`,
//! `sts/NAME`, `ds/NAME`, `rs/NAME`, `job/NAME`), or `-l SELECTOR` (with
//! `-A`, in every namespace). A named pod is read whatever its phase; a
//! workload's or a selector's pods only while Running (the others have no
//! sidecar to ask), sorted by namespace and name.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::Error;

/// The pods a verb reads.
#[derive(Debug, clap::Args)]
pub(super) struct PodsArgs {
    /// The pod: `NAME` or `pod/NAME`, or a workload whose running pods to
    /// read: `deploy/NAME`, `sts/NAME`, `ds/NAME`, `rs/NAME`, `job/NAME`.
    pub(super) target: Option<String>,
    /// The running pods this label selector picks (`-l app=web`), in -n's
    /// namespace or, with -A, in every namespace.
    #[arg(short = 'l', long)]
    pub(super) selector: Option<String>,
}

/// What names the pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Named {
    /// One pod.
    Pod(String),
    /// A workload's pods.
    Workload(Workload, String),
    /// Pods by label selector.
    Selector(String),
}

/// The workloads whose pods can be named through them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Workload {
    Deployment,
    StatefulSet,
    DaemonSet,
    ReplicaSet,
    Job,
}

impl PodsArgs {
    /// What the arguments name; `-A` only goes with `-l`, as no name is
    /// unique across namespaces.
    pub(super) fn named(&self, all_namespaces: bool) -> Result<Named, Error> {
        match (&self.target, &self.selector) {
            (Some(_), Some(_)) => Err(Error::Usage(
                "name a pod or select pods with -l, not both".into(),
            )),
            (None, None) => Err(Error::Usage(
                "name a pod (NAME, pod/NAME, deploy/NAME, sts/NAME, ds/NAME, rs/NAME, job/NAME) or select pods with -l".into(),
            )),
            (Some(_), None) if all_namespaces => Err(Error::Usage(
                "a pod cannot be named across all namespaces: drop -A, or select pods with -l"
                    .into(),
            )),
            (Some(target), None) => parse(target),
            (None, Some(selector)) if selector.trim().is_empty() => Err(Error::Usage(
                "-l needs a selector (e.g. -l app=web)".into(),
            )),
            (None, Some(selector)) => Ok(Named::Selector(selector.clone())),
        }
    }
}

/// `TYPE/NAME` or `NAME`, with kubectl's names and short names of the types.
pub(super) fn parse(target: &str) -> Result<Named, Error> {
    let Some((kind, name)) = target.split_once('/') else {
        return Ok(Named::Pod(target.to_string()));
    };
    if name.is_empty() || name.contains('/') {
        return Err(Error::Usage(format!("{target}: expected TYPE/NAME")));
    }
    let kind = kind.strip_suffix(".apps").unwrap_or(kind);
    let kind = kind.strip_suffix(".batch").unwrap_or(kind);
    let workload = match kind {
        "po" | "pod" | "pods" => return Ok(Named::Pod(name.to_string())),
        "deploy" | "deployment" | "deployments" => Workload::Deployment,
        "sts" | "statefulset" | "statefulsets" => Workload::StatefulSet,
        "ds" | "daemonset" | "daemonsets" => Workload::DaemonSet,
        "rs" | "replicaset" | "replicasets" => Workload::ReplicaSet,
        "job" | "jobs" => Workload::Job,
        _ => {
            return Err(Error::Usage(format!(
                "{target}: name a pod or a workload (pod/, deploy/, sts/, ds/, rs/, job/)"
            )))
        }
    };
    Ok(Named::Workload(workload, name.to_string()))
}

/// A label selector in kubectl's text form; an empty one is refused, as it
/// would pick every pod of the namespace.
pub(super) fn selector_text(selector: &LabelSelector) -> Result<String, String> {
    let mut terms: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.as_deref().unwrap_or_default().join(",");
        terms.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            other => return Err(format!("operator {other} of key {}", e.key)),
        });
    }
    if terms.is_empty() {
        return Err("an empty selector".into());
    }
    Ok(terms.join(","))
}

/// The pods `named` names, in `namespace` (`None`: every namespace, only
/// with a selector).
pub(super) async fn resolve(
    client: &Client,
    namespace: Option<&str>,
    named: &Named,
) -> Result<Vec<Pod>, Error> {
    let pods_in = |ns: Option<&str>| -> Api<Pod> {
        match ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    };
    let (selector, what) = match named {
        Named::Pod(name) => {
            let ns = namespace.ok_or_else(|| Error::Usage("a pod needs a namespace".into()))?;
            let pod = pods_in(Some(ns)).get(name).await.map_err(Error::Kube)?;
            return Ok(vec![pod]);
        }
        Named::Selector(s) => (s.clone(), format!("-l {s}")),
        Named::Workload(kind, name) => {
            let ns =
                namespace.ok_or_else(|| Error::Usage("a workload needs a namespace".into()))?;
            let c = client.clone();
            let selector = match kind {
                Workload::Deployment => get::<Deployment>(c, ns, name)
                    .await?
                    .spec
                    .map(|s| s.selector),
                Workload::StatefulSet => get::<StatefulSet>(c, ns, name)
                    .await?
                    .spec
                    .map(|s| s.selector),
                Workload::DaemonSet => get::<DaemonSet>(c, ns, name)
                    .await?
                    .spec
                    .map(|s| s.selector),
                Workload::ReplicaSet => get::<ReplicaSet>(c, ns, name)
                    .await?
                    .spec
                    .map(|s| s.selector),
                Workload::Job => get::<Job>(c, ns, name).await?.spec.and_then(|s| s.selector),
            };
            let what = format!("{kind:?} {ns}/{name}");
            let selector = selector
                .ok_or_else(|| Error::Usage(format!("{what} has no selector")))
                .and_then(|s| {
                    selector_text(&s).map_err(|e| Error::Usage(format!("{what}'s selector: {e}")))
                })?;
            (selector, what)
        }
    };
    let mut pods: Vec<Pod> = pods_in(namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::Kube)?
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect();
    if pods.is_empty() {
        return Err(Error::Usage(format!(
            "no running pod matches {what}{}",
            namespace.map_or(" in any namespace".into(), |ns| format!(
                " in namespace {ns}"
            ))
        )));
    }
    pods.sort_by_key(|p| (p.namespace().unwrap_or_default(), p.name_any()));
    Ok(pods)
}

/// The workload `name` in `ns`, as stored.
async fn get<K>(client: Client, ns: &str, name: &str) -> Result<K, Error>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::namespaced(client, ns)
        .get(name)
        .await
        .map_err(Error::Kube)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn args(target: Option<&str>, selector: Option<&str>) -> PodsArgs {
        PodsArgs {
            target: target.map(str::to_string),
            selector: selector.map(str::to_string),
        }
    }

    #[test]
    fn pods_are_named_as_kubectl_names_them() {
        let table = [
            ("web-1", Named::Pod("web-1".into())),
            ("pod/web-1", Named::Pod("web-1".into())),
            ("po/web-1", Named::Pod("web-1".into())),
            (
                "deploy/web",
                Named::Workload(Workload::Deployment, "web".into()),
            ),
            (
                "deployment.apps/web",
                Named::Workload(Workload::Deployment, "web".into()),
            ),
            (
                "sts/db",
                Named::Workload(Workload::StatefulSet, "db".into()),
            ),
            (
                "ds/agent",
                Named::Workload(Workload::DaemonSet, "agent".into()),
            ),
            (
                "rs/web-5d",
                Named::Workload(Workload::ReplicaSet, "web-5d".into()),
            ),
            ("job/batch", Named::Workload(Workload::Job, "batch".into())),
        ];
        for (target, want) in table {
            assert_eq!(args(Some(target), None).named(false).expect(target), want);
        }
        assert_eq!(
            args(None, Some("app=web")).named(true).expect("selector"),
            Named::Selector("app=web".into())
        );
    }

    #[test]
    fn what_cannot_name_pods_is_refused_with_the_way_that_can() {
        let table = [
            (args(Some("svc/api"), None), false, "pod/, deploy/"),
            (args(Some("deploy/"), None), false, "TYPE/NAME"),
            (args(Some("web"), Some("app=web")), false, "not both"),
            (args(None, None), false, "select pods with -l"),
            (args(Some("web"), None), true, "drop -A"),
            (args(None, Some(" ")), false, "-l needs a selector"),
        ];
        for (a, all, want) in table {
            let e = a.named(all).expect_err("refused").to_string();
            assert!(e.contains(want), "{a:?} -A={all}: {e}");
        }
    }

    #[test]
    fn a_workloads_selector_reads_as_kubectl_writes_it() {
        let s = LabelSelector {
            match_labels: Some(BTreeMap::from([
                ("app".to_string(), "web".to_string()),
                ("tier".to_string(), "front".to_string()),
            ])),
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "track".into(),
                    operator: "In".into(),
                    values: Some(vec!["stable".into(), "canary".into()]),
                },
                LabelSelectorRequirement {
                    key: "legacy".into(),
                    operator: "DoesNotExist".into(),
                    values: None,
                },
                LabelSelectorRequirement {
                    key: "zone".into(),
                    operator: "NotIn".into(),
                    values: Some(vec!["b".into()]),
                },
                LabelSelectorRequirement {
                    key: "team".into(),
                    operator: "Exists".into(),
                    values: None,
                },
            ]),
        };
        assert_eq!(
            selector_text(&s).expect("text"),
            "app=web,tier=front,track in (stable,canary),!legacy,zone notin (b),team"
        );
        assert!(selector_text(&LabelSelector::default()).is_err());
    }
}
