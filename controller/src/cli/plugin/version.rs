//! `kubectl reprise version`: this plugin's version beside the images the
//! cluster runs, as `kubectl version` shows client and server: the
//! controller pods' (in the namespace `check` finds) and the sidecars' of
//! every injected pod, each image with how many pods run it, so that a
//! rollout left half done shows as two images.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::{json, Value};

use super::sent::CONTROLLER_PODS;
use super::{as_data, Output};
use crate::inject::SIDECAR_NAME;
use crate::Error;

// The verb's help is the doc comment of `Verb::Version`.
#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// The namespace Reprise's controller runs in (default: found as
    /// `check` finds it, from the webhook configuration).
    #[arg(long)]
    reprise_namespace: Option<String>,
}

/// Images and how many pods run each.
type Counted = BTreeMap<String, usize>;

pub(super) async fn run(
    client: Client,
    args: &Args,
    output: Option<Output>,
) -> Result<String, Error> {
    let namespace =
        super::check::reprise_namespace(&client, args.reprise_namespace.as_deref()).await;
    let controllers = Api::<Pod>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default().labels(CONTROLLER_PODS))
        .await
        .map(|l| count(&l.items, controller_image))
        .map_err(reason);
    let sidecars = Api::<Pod>::all(client)
        .list(&ListParams::default())
        .await
        .map(|l| count(&l.items, sidecar_image))
        .map_err(reason);
    render(
        env!("CARGO_PKG_VERSION"),
        &namespace,
        &controllers,
        &sidecars,
        output,
    )
}

/// Why a list failed, in a line (a user without cluster-wide `list pods`
/// still sees the client's version and the rest).
fn reason(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.reason),
        e => e.to_string(),
    }
}

fn count(pods: &[Pod], image: impl Fn(&Pod) -> Option<String>) -> Counted {
    let mut counted = Counted::new();
    for image in pods.iter().filter_map(image) {
        *counted.entry(image).or_default() += 1;
    }
    counted
}

/// The controller pod's first container's image (the chart runs one).
fn controller_image(pod: &Pod) -> Option<String> {
    pod.spec.as_ref()?.containers.first()?.image.clone()
}

/// The image of the pod's sidecar (a native sidecar is an init container).
pub(super) fn sidecar_image(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| c.name == SIDECAR_NAME)?
        .image
        .clone()
}

/// The versions as `output` asks: an object for the data forms, else lines.
pub(super) fn render(
    client: &str,
    namespace: &str,
    controllers: &Result<Counted, String>,
    sidecars: &Result<Counted, String>,
    output: Option<Output>,
) -> Result<String, Error> {
    let images = |c: &Result<Counted, String>| match c {
        Ok(c) => {
            json!({ "images": c.iter().map(|(image, pods)| json!({"image": image, "pods": pods})).collect::<Vec<Value>>() })
        }
        Err(e) => json!({ "error": e }),
    };
    let mut controller = images(controllers);
    controller["namespace"] = json!(namespace);
    let data = json!({
        "client": { "version": client },
        "controller": controller,
        "sidecars": images(sidecars),
    });
    if let Some(printed) = as_data(&data, output) {
        return printed;
    }
    let line = |c: &Result<Counted, String>, none: &str| match c {
        Err(e) => format!("unknown: {e}"),
        Ok(c) if c.is_empty() => none.to_string(),
        Ok(c) => c
            .iter()
            .map(|(image, pods)| {
                format!("{image} ({pods} pod{})", if *pods == 1 { "" } else { "s" })
            })
            .collect::<Vec<_>>()
            .join(", "),
    };
    Ok(crate::untrusted::escaped(
        &format!(
            "Client:      kubectl-reprise {client}\nController:  {}\nSidecars:    {}\n",
            line(
                controllers,
                &format!("no controller pod in namespace {namespace} (--reprise-namespace)")
            ),
            line(sidecars, "no injected pod"),
        ),
        true,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(entries: &[(&str, usize)]) -> Counted {
        entries
            .iter()
            .map(|(i, n)| ((*i).to_string(), *n))
            .collect()
    }

    #[test]
    fn each_image_is_counted_so_a_half_done_rollout_shows() {
        let out = render(
            "0.1.0",
            "reprise-system",
            &Ok(counted(&[("r.example/reprise-controller:0.1.0", 2)])),
            &Ok(counted(&[
                ("r.example/reprise-sidecar:0.1.0", 14),
                ("r.example/reprise-sidecar:0.0.9", 1),
            ])),
            None,
        )
        .expect("text");
        assert_eq!(
            out,
            "Client:      kubectl-reprise 0.1.0\n\
             Controller:  r.example/reprise-controller:0.1.0 (2 pods)\n\
             Sidecars:    r.example/reprise-sidecar:0.0.9 (1 pod), r.example/reprise-sidecar:0.1.0 (14 pods)\n"
        );
    }

    #[test]
    fn what_cannot_be_listed_is_said_and_the_rest_shown() {
        let out = render(
            "0.1.0",
            "reprise-system",
            &Ok(Counted::new()),
            &Err("pods is forbidden (Forbidden)".into()),
            Some(Output::Json),
        )
        .expect("json");
        let v: Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(v["client"]["version"], "0.1.0");
        assert_eq!(v["controller"]["namespace"], "reprise-system");
        assert_eq!(v["controller"]["images"], json!([]));
        assert_eq!(v["sidecars"]["error"], "pods is forbidden (Forbidden)");
        let text = render(
            "0.1.0",
            "ops",
            &Ok(Counted::new()),
            &Err("forbidden".into()),
            None,
        )
        .expect("text");
        assert!(
            text.contains("Controller:  no controller pod in namespace ops"),
            "{text}"
        );
        assert!(text.contains("Sidecars:    unknown: forbidden"), "{text}");
    }
}
