//! `reprise-controller selftest`: checks an installation from inside the
//! cluster (the chart's `helm test` pod runs it): the CRD is served, a
//! controller replica leads and renews the Lease, and the webhook trusts the
//! controller's CA.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};

use super::ControllerNamespace;
use crate::leader::LEASE_NAME;

/// How recently the Lease must have been renewed.
const FRESH: Duration = Duration::from_secs(30);

// The subcommand's help is the doc comment of `Command::Selftest`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    namespace: ControllerNamespace,
    /// MutatingWebhookConfiguration to check.
    #[arg(long)]
    webhook_configuration: Option<String>,
}

/// One check's result.
#[derive(Debug)]
struct Check {
    /// What was checked.
    name: String,
    /// `Ok(detail)` or `Err(reason)`.
    result: Result<String, String>,
}

/// Runs every check and prints one line each; fails when one failed.
pub async fn print(args: Args) -> anyhow::Result<()> {
    let client = super::client().await?;
    let checks = run(
        client,
        &args.namespace.namespace,
        args.webhook_configuration.as_deref(),
        FRESH,
    )
    .await;
    let mut failed = 0;
    for c in &checks {
        match &c.result {
            Ok(detail) => println!("ok   {}: {detail}", c.name),
            Err(why) => {
                failed += 1;
                println!("FAIL {}: {why}", c.name);
            }
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} checks failed", checks.len());
    }
    Ok(())
}

/// Runs every check; the Lease must have been renewed within `fresh`.
async fn run(
    client: Client,
    namespace: &str,
    webhook: Option<&str>,
    fresh: Duration,
) -> Vec<Check> {
    let mut checks = vec![
        Check {
            name: "CRD retrypolicies.reprise.dev is established".into(),
            result: crd(&client).await,
        },
        Check {
            name: format!("a controller holds Lease {namespace}/{LEASE_NAME}"),
            result: lease(&client, namespace, fresh).await,
        },
    ];
    if let Some(name) = webhook {
        checks.push(Check {
            name: format!("MutatingWebhookConfiguration {name} has a caBundle"),
            result: ca_bundle(&client, name).await,
        });
    }
    checks
}

async fn crd(client: &Client) -> Result<String, String> {
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get("retrypolicies.reprise.dev")
        .await
        .map_err(|e| e.to_string())?;
    let established = crd
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True");
    if established {
        Ok("established".into())
    } else {
        Err("not established yet".into())
    }
}

async fn lease(client: &Client, namespace: &str, fresh: Duration) -> Result<String, String> {
    let lease = Api::<Lease>::namespaced(client.clone(), namespace)
        .get(LEASE_NAME)
        .await
        .map_err(|e| e.to_string())?;
    let spec = lease.spec.unwrap_or_default();
    let holder = spec.holder_identity.ok_or("nobody holds it")?;
    let renewed = spec.renew_time.ok_or("never renewed")?.0;
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(renewed);
    let age = Duration::try_from(age).unwrap_or_default();
    if age > fresh {
        return Err(format!("{holder} last renewed it {}s ago", age.as_secs()));
    }
    Ok(format!("held by {holder}, renewed {}s ago", age.as_secs()))
}

async fn ca_bundle(client: &Client, name: &str) -> Result<String, String> {
    let config = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get(name)
        .await
        .map_err(|e| e.to_string())?;
    let webhooks = config.webhooks.unwrap_or_default();
    if webhooks.is_empty() {
        return Err("it has no webhooks".into());
    }
    match webhooks.iter().find(|w| {
        w.client_config
            .ca_bundle
            .as_ref()
            .is_none_or(|b| b.0.is_empty())
    }) {
        Some(w) => Err(format!("webhook {} has no caBundle", w.name)),
        None => Ok(format!(
            "{} webhook(s) trust the controller's CA",
            webhooks.len()
        )),
    }
}
