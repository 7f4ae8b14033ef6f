//! The sidecar-injecting mutating admission webhook: the HTTPS server the API
//! server calls on Pod creation, answering each AdmissionReview with the
//! JSON patch of [`decide`]'s Pod.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::DynamicObject;
use tokio::net::TcpListener;

use super::config::InjectionConfig;
use super::pod::{decide, Decision};
use crate::metrics::{Counter, Metrics};

/// Path the webhook configuration points at.
const PATH: &str = "/inject";
/// Admission reviews are small; anything larger is not one.
const MAX_REVIEW_BYTES: usize = 3 * 1024 * 1024;

/// Answers admission reviews for Pods.
#[derive(Debug)]
pub(crate) struct Webhook {
    config: InjectionConfig,
    ca_pem: String,
    native: bool,
    metrics: Arc<Metrics>,
}

impl Webhook {
    /// A webhook injecting per `config`; `native` when the API server runs
    /// native sidecars (init containers with `restartPolicy: Always`).
    pub(crate) fn new(
        config: InjectionConfig,
        ca_pem: String,
        native: bool,
        metrics: Arc<Metrics>,
    ) -> Self {
        Webhook {
            config,
            ca_pem,
            native,
            metrics,
        }
    }

    /// The response to one AdmissionReview body.
    fn review(&self, body: &[u8]) -> AdmissionReview<DynamicObject> {
        let review: AdmissionReview<Pod> = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => {
                return AdmissionResponse::invalid(format!("not an AdmissionReview: {e}"))
                    .into_review()
            }
        };
        let request: AdmissionRequest<Pod> = match review.try_into() {
            Ok(r) => r,
            Err(e) => return AdmissionResponse::invalid(e.to_string()).into_review(),
        };
        let response = AdmissionResponse::from(&request);
        let Some(pod) = &request.object else {
            return response.into_review();
        };
        let name = pod
            .metadata
            .name
            .clone()
            .or_else(|| pod.metadata.generate_name.clone())
            .unwrap_or_default();
        match decide(pod, &self.config, &self.ca_pem, self.native) {
            Decision::Skip(why) => {
                self.metrics.add(Counter::InjectionSkips);
                tracing::debug!(namespace = ?request.namespace, pod = %name, why, "not injected");
                response.into_review()
            }
            Decision::Refuse(why) => {
                self.metrics.add(Counter::InjectionRefusals);
                tracing::info!(namespace = ?request.namespace, pod = %name, %why, "pod refused");
                response.deny(why).into_review()
            }
            Decision::Inject(mutated) => {
                let patch = match (serde_json::to_value(pod), serde_json::to_value(&*mutated)) {
                    (Ok(before), Ok(after)) => json_patch::diff(&before, &after),
                    (Err(e), _) | (_, Err(e)) => {
                        return AdmissionResponse::invalid(e.to_string()).into_review()
                    }
                };
                match response.clone().with_patch(patch) {
                    Ok(r) => {
                        self.metrics.add(Counter::Injections);
                        tracing::info!(namespace = ?request.namespace, pod = %name, native = self.native, "sidecar injected");
                        r.into_review()
                    }
                    // Admit the pod as it is rather than block it.
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot serialise the injection patch");
                        response.into_review()
                    }
                }
            }
        }
    }

    /// Serves HTTPS on `listener` until the process ends.
    pub(crate) async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Arc<rustls::ServerConfig>,
    ) {
        crate::tls::accept(
            listener,
            tls,
            std::future::pending(),
            "webhook",
            move |tls| {
                let webhook = Arc::clone(&self);
                async move {
                    let service = service_fn(move |req| {
                        let webhook = Arc::clone(&webhook);
                        async move { Ok::<_, std::convert::Infallible>(webhook.handle(req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                }
            },
        )
        .await;
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        if req.method() != Method::POST || req.uri().path() != PATH {
            return plain(StatusCode::NOT_FOUND, format!("POST {PATH} only\n"));
        }
        let body = match Limited::new(req.into_body(), MAX_REVIEW_BYTES)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                return plain(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the body: {e}\n"),
                )
            }
        };
        match serde_json::to_vec(&self.review(&body)) {
            Ok(json) => {
                let mut resp = Response::new(Full::new(Bytes::from(json)));
                resp.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                resp
            }
            Err(e) => plain(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        }
    }
}

fn plain(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(text)));
    *resp.status_mut() = status;
    resp
}

/// Whether the API server runs native sidecars: beta and on by default since
/// Kubernetes 1.29.
pub(crate) async fn supports_native_sidecars(client: &kube::Client) -> bool {
    match client.apiserver_version().await {
        Ok(v) => {
            let minor: u32 = v.minor.trim_end_matches('+').parse().unwrap_or(0);
            v.major == "1" && minor >= 29
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the API server version; injecting regular containers");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn webhook() -> Webhook {
        let config =
            InjectionConfig::from_yaml("image: sidecar:test\ncontrollerAddress: https://c:15010\n")
                .expect("config");
        Webhook::new(config, "CA".into(), true, Arc::default())
    }

    fn review(pod: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "shop",
                "operation": "CREATE",
                "userInfo": {"username": "admin"},
                "object": pod,
                "dryRun": false
            }
        }))
        .expect("json")
    }

    fn response(review: &AdmissionReview<DynamicObject>) -> serde_json::Value {
        serde_json::to_value(review).expect("json")["response"].clone()
    }

    #[test]
    fn a_pod_gets_a_json_patch_that_adds_the_sidecar() {
        let w = webhook();
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "app", "namespace": "shop"},
            "spec": {"containers": [{"name": "app", "image": "app:1"}]}
        });
        let r = response(&w.review(&review(pod.clone())));
        assert_eq!(r["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(r["allowed"], true);
        assert_eq!(r["patchType"], "JSONPatch");
        // kube serialises the patch bytes as a JSON array of numbers, which
        // the API server's decoder accepts for a []byte field.
        let bytes: Vec<u8> = serde_json::from_value(r["patch"].clone()).expect("patch bytes");
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("patch");
        let mut patched = pod;
        json_patch::patch(&mut patched, &patch).expect("applies");
        assert_eq!(
            patched["spec"]["initContainers"][0]["name"],
            "reprise-sidecar"
        );
        assert_eq!(
            patched["spec"]["initContainers"][0]["restartPolicy"],
            "Always"
        );
        assert_eq!(w.metrics.get(Counter::Injections), 1);
    }

    #[test]
    fn a_bad_override_is_denied_with_the_annotation_named() {
        let w = webhook();
        let r = response(&w.review(&review(serde_json::json!({
            "metadata": {"name": "app", "annotations": {"reprise.dev/sidecar-memory-limit": "big"}},
            "spec": {"containers": [{"name": "app"}]}
        }))));
        assert_eq!(r["allowed"], false);
        let msg = r["status"]["message"].as_str().expect("message");
        assert!(msg.contains("reprise.dev/sidecar-memory-limit"), "{msg}");
    }

    #[test]
    fn garbage_is_answered_not_crashed() {
        let r = response(&webhook().review(b"{not json"));
        assert_eq!(r["allowed"], false);
    }
}
