//! The upkeep of the webhook configuration's `caBundle`: the API server must
//! trust the controller's CA to call the webhook.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Api, Patch, PatchParams};

/// Keeps every webhook of the configuration `name` trusting `ca_pem`: patches
/// it now and re-checks every minute (a re-install or a `kubectl apply` of
/// the chart's manifest may have emptied it).
pub(crate) async fn keep_ca_bundle(client: kube::Client, name: String, ca_pem: String) {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    let bundle = k8s_openapi::ByteString(ca_pem.into_bytes());
    loop {
        let wait = match patch_ca_bundle(&api, &name, &bundle).await {
            Ok(true) => {
                tracing::info!(%name, "webhook caBundle set");
                Duration::from_secs(60)
            }
            Ok(false) => Duration::from_secs(60),
            Err(e) => {
                tracing::warn!(%name, error = %e, "cannot set the webhook caBundle; retrying");
                Duration::from_secs(5)
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// Returns whether it changed anything.
async fn patch_ca_bundle(
    api: &Api<MutatingWebhookConfiguration>,
    name: &str,
    bundle: &k8s_openapi::ByteString,
) -> Result<bool, kube::Error> {
    let config = api.get(name).await?;
    let webhooks = config.webhooks.unwrap_or_default();
    if webhooks
        .iter()
        .all(|w| w.client_config.ca_bundle.as_ref() == Some(bundle))
    {
        return Ok(false);
    }
    // A JSON merge patch would replace the whole list; a JSON patch per entry
    // touches only caBundle and fails cleanly if the list changed meanwhile.
    let ops: Vec<json_patch::PatchOperation> = webhooks
        .iter()
        .enumerate()
        .flat_map(|(i, w)| {
            [
                json_patch::PatchOperation::Test(json_patch::TestOperation {
                    path: format!("/webhooks/{i}/name").try_into().unwrap_or_default(),
                    value: serde_json::Value::String(w.name.clone()),
                }),
                json_patch::PatchOperation::Add(json_patch::AddOperation {
                    path: format!("/webhooks/{i}/clientConfig/caBundle")
                        .try_into()
                        .unwrap_or_default(),
                    value: serde_json::to_value(bundle).unwrap_or_default(),
                }),
            ]
        })
        .collect();
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Json::<()>(json_patch::Patch(ops)),
    )
    .await?;
    Ok(true)
}
