//! `kubectl reprise sent POD`: what the controller last sent to a pod's
//! sidecar (a whole snapshot or a delta, its version, how long ago) and
//! what the sidecar answered, from `GET /debug/sidecars/NAMESPACE/POD` on
//! the controller replica that holds the pod's stream. That page answers
//! only on the controller's loopback, so each running replica is asked
//! through the API server's port-forward, as `diagnose` asks a sidecar,
//! until one holds the stream. Pods are named as `diagnose` names them
//! (`pods.rs`); the controller's namespace is found as `check` finds it.
//!
//! The answer is read leniently, as `diagnose` reads its: missing fields
//! draw as `-`. `-o json` and `-o yaml` print a kubectl `List` of one
//! `SidecarPush` item per pod: the page as read, and the replica that
//! answered.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde_json::Value;

use super::diagnose::get;
use super::pods::PodsArgs;
use super::{as_list, list_item, Output};
use crate::inject::SIDECAR_NAME;
use crate::Error;

/// How long one replica's port-forward and answer may take together.
const TIMEOUT: Duration = Duration::from_secs(20);

/// The chart's controller pods.
pub(super) const CONTROLLER_PODS: &str =
    "app.kubernetes.io/part-of=reprise,app.kubernetes.io/component=controller";

// The verb's help is the doc comment of `Verb::Sent`.
#[derive(Debug, clap::Args)]
pub(super) struct Args {
    #[command(flatten)]
    pub(super) pods: PodsArgs,
    /// The namespace Reprise's controller runs in (default: found as
    /// `check` finds it, from the webhook configuration).
    #[arg(long)]
    reprise_namespace: Option<String>,
    /// The controller's metrics port (its `--metrics-addr`).
    #[arg(long, default_value_t = 15020)]
    metrics_port: u16,
}

/// What the controller last sent each of `pods`, rendered; the pods no
/// replica could tell about come back beside the output. One pod that
/// cannot be read is the verb's error.
pub(super) async fn run(
    client: Client,
    pods: &[Pod],
    args: &Args,
    output: Option<Output>,
) -> Result<(String, Vec<Error>), Error> {
    let reprise_namespace =
        super::check::reprise_namespace(&client, args.reprise_namespace.as_deref()).await;
    let controllers: Api<Pod> = Api::namespaced(client, &reprise_namespace);
    let replicas: Vec<String> = controllers
        .list(&ListParams::default().labels(CONTROLLER_PODS))
        .await
        .map_err(Error::Kube)?
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(ResourceExt::name_any)
        .collect();
    if replicas.is_empty() {
        return Err(Error::Usage(format!(
            "no running controller pod in namespace {reprise_namespace} (labels {CONTROLLER_PODS}): is Reprise installed there? (--reprise-namespace)"
        )));
    }
    let mut read = Vec::with_capacity(pods.len());
    let mut failed = Vec::new();
    for pod in pods {
        let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        match ask(
            &controllers,
            &replicas,
            &namespace,
            &name,
            args.metrics_port,
        )
        .await
        {
            Ok(answer) => read.push(answer),
            Err(e) if pods.len() == 1 => return Err(e),
            Err(e) => failed.push(e),
        }
    }
    Ok((render_all(&read, output)?, failed))
}

/// Asks each replica in turn until one holds `namespace/name`'s stream:
/// that replica and its page.
async fn ask(
    controllers: &Api<Pod>,
    replicas: &[String],
    namespace: &str,
    name: &str,
    port: u16,
) -> Result<(String, Value), Error> {
    let id = format!("{namespace}/{name}");
    let fail = |reason: String| Error::Diagnostics {
        pod: id.clone(),
        reason,
    };
    let path = format!("/debug/sidecars/{namespace}/{name}");
    for replica in replicas {
        let (status, body) = tokio::time::timeout(TIMEOUT, get(controllers, replica, port, &path))
            .await
            .map_err(|_| {
                fail(format!(
                    "no answer from {replica}'s port {port} in {TIMEOUT:?}"
                ))
            })??;
        match status {
            200 => {
                let raw: Value = serde_json::from_slice(&body)
                    .map_err(|e| fail(format!("{replica}: {path} is not JSON: {e}")))?;
                return Ok((replica.clone(), raw));
            }
            // Another replica may hold the stream.
            404 if body.starts_with(id.as_bytes()) => {}
            404 => {
                return Err(fail(format!(
                    "{replica} has no {path}: a controller release before this plugin's; upgrade it"
                )))
            }
            _ => {
                return Err(fail(format!(
                    "{replica}: GET {path} answered {status}: {}",
                    String::from_utf8_lossy(&body).trim()
                )))
            }
        }
    }
    Err(fail(format!(
        "no controller replica ({}) holds a snapshot stream from it: its sidecar is not connected (kubectl -n {namespace} logs {name} -c {SIDECAR_NAME})",
        replicas.join(", "),
    )))
}

/// Every pod's page, `read` as `(replica, page)`, drawn as `output` asks: a
/// `List` for the data forms, else each pod's text (each names its pod).
pub(super) fn render_all(
    read: &[(String, Value)],
    output: Option<Output>,
) -> Result<String, Error> {
    let items = || {
        read.iter()
            .map(|(replica, raw)| {
                let id = format!(
                    "{}/{}",
                    raw["namespace"].as_str().unwrap_or_default(),
                    raw["pod"].as_str().unwrap_or_default()
                );
                let mut fields = raw.clone();
                if let Some(map) = fields.as_object_mut() {
                    map.insert("replica".into(), Value::String(replica.clone()));
                }
                list_item("reprise.dev/v1alpha1", "SidecarPush", &id, fields)
            })
            .collect()
    };
    if let Some(printed) = as_list(items, output) {
        return printed;
    }
    let mut out = String::new();
    for (replica, raw) in read {
        out += &render(replica, raw)?;
    }
    Ok(out)
}

/// The page `raw` that `replica` answered, as text.
pub(super) fn render(replica: &str, raw: &Value) -> Result<String, Error> {
    // A NACK's message is the sidecar's to write: shown escaped.
    Ok(crate::untrusted::escaped(&text(replica, raw), true))
}

fn text(replica: &str, raw: &Value) -> String {
    let str_of = |v: &Value| v.as_str().map_or_else(|| "-".to_string(), str::to_string);
    let sent = &raw["sent"];
    let state = if raw["nack"].is_string() {
        "refused the last push"
    } else if raw["inSync"].as_bool() == Some(true) {
        "in sync"
    } else if sent["version"].is_string() {
        "waiting for its answer"
    } else {
        "nothing sent yet"
    };
    let mut out = format!(
        "{}/{}: {state}, through {replica}\n",
        str_of(&raw["namespace"]),
        str_of(&raw["pod"])
    );
    let what = match (sent["kind"].as_str(), sent["bytes"].as_u64()) {
        (Some("resumed"), _) => "nothing (it resumed the version it runs)".to_string(),
        (Some(kind), Some(bytes)) => format!("a {kind} line of {bytes} bytes"),
        (kind, _) => kind.unwrap_or("-").to_string(),
    };
    let ago = sent["secondsAgo"]
        .as_f64()
        .map_or_else(String::new, |s| format!(", {s:.1}s ago"));
    out += &format!("  sent       {what}{ago}\n");
    out += &format!("  version    {}\n", str_of(&sent["version"]));
    out += &format!("  acked      {}\n", str_of(&raw["acked"]));
    if let Some(nack) = raw["nack"].as_str() {
        out += &format!("  nack       {nack}\n");
    }
    let policies: Vec<String> = sent["policies"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| format!("{} (generation {})", str_of(&p["policy"]), p["generation"]))
        .collect();
    out += &format!("  policies   {}\n", listed(&policies));
    let announces: Vec<String> = raw["capabilities"]
        .as_array()
        .into_iter()
        .flatten()
        .map(str_of)
        .collect();
    out += &format!("  announces  {}\n", listed(&announces));
    if !sent["line"].is_null() {
        out += "  last line:\n";
        let line = serde_json::to_string_pretty(&sent["line"]).unwrap_or_default();
        for l in line.lines() {
            out += &format!("    {l}\n");
        }
    }
    out
}

/// `items` comma-separated, or `-` when there are none.
fn listed(items: &[String]) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn page(kind: &str, acked: Value, nack: Value) -> Value {
        json!({
            "namespace": "shop",
            "pod": "web-0",
            "connection": 3,
            "capabilities": ["delta", "dns", "tls", "traffic"],
            "sent": {
                "version": "00000000000000a2",
                "secondsAgo": 4.2,
                "kind": kind,
                "bytes": 132,
                "policies": [{"policy": "shop/reads", "generation": 3}],
                "line": {"delta": {"base": "00000000000000a1", "version": "00000000000000a2",
                    "endpoints": [{"upstream": "api.shop", "added": [{"address": "10.0.0.9", "port": 8080}]}]}},
            },
            "acked": acked,
            "inSync": acked == json!("00000000000000a2"),
            "nack": nack,
        })
    }

    #[test]
    fn a_delta_in_sync_shows_what_it_carried() {
        let out = text(
            "reprise-controller-0",
            &page("delta", json!("00000000000000a2"), Value::Null),
        );
        assert!(
            out.starts_with("shop/web-0: in sync, through reprise-controller-0\n"),
            "{out}"
        );
        assert!(
            out.contains("  sent       a delta line of 132 bytes, 4.2s ago\n"),
            "{out}"
        );
        assert!(
            out.contains("  policies   shop/reads (generation 3)\n"),
            "{out}"
        );
        assert!(
            out.contains("  announces  delta, dns, tls, traffic\n"),
            "{out}"
        );
        assert!(out.contains("\"address\": \"10.0.0.9\""), "{out}");
        assert!(!out.contains("nack"), "{out}");
    }

    #[test]
    fn a_refusal_and_an_awaited_answer_are_told_apart() {
        let refused = text(
            "c",
            &page(
                "whole",
                json!("00000000000000a1"),
                json!("shop/reads: spec.retries.attempts: must be in 0..=10 (got 11)"),
            ),
        );
        assert!(
            refused.starts_with("shop/web-0: refused the last push"),
            "{refused}"
        );
        assert!(
            refused.contains("  nack       shop/reads: spec.retries.attempts"),
            "{refused}"
        );
        let waiting = text("c", &page("delta", json!("00000000000000a1"), Value::Null));
        assert!(
            waiting.starts_with("shop/web-0: waiting for its answer"),
            "{waiting}"
        );
    }

    #[test]
    fn a_nacks_message_is_printed_escaped() {
        let raw = page(
            "whole",
            json!("00000000000000a1"),
            json!("bad\u{1b}]52;c;aGk=\u{7}\nfake line"),
        );
        let out = render("c", &raw).expect("text");
        assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
        assert!(out.contains("bad\\u{1b}]52;c;aGk=\\u{7}"), "{out}");
    }

    #[test]
    fn a_sparse_or_foreign_answer_still_draws() {
        let out = text("c", &json!({"namespace": "shop", "pod": "p", "extra": 1}));
        assert!(
            out.starts_with("shop/p: nothing sent yet, through c\n"),
            "{out}"
        );
        assert!(out.contains("  version    -\n"), "{out}");
        let list: Value = serde_json::from_str(
            &render_all(&[("c".into(), json!({"pod": "p"}))], Some(Output::Json)).expect("json"),
        )
        .expect("JSON");
        assert_eq!(list["kind"], "List");
        assert_eq!(
            list["items"][0],
            json!({"apiVersion": "reprise.dev/v1alpha1", "kind": "SidecarPush",
                   "metadata": {"namespace": "", "name": "p"}, "pod": "p", "replica": "c"})
        );
    }
}
