//! The sidecar-injecting mutating admission webhook: the HTTPS server the API
//! server calls on Pod creation, answering each AdmissionReview with the
//! JSON patch of [`decide`]'s Pod.
//!
//! Two paths, one per entry of the chart's webhook configuration: `/inject`
//! for injected namespaces, `/inject/transparent` for those also labelled
//! `reprise.dev/transparent=enabled`. The API server's namespace selectors
//! decide which one a Pod reaches, so honouring the label needs no access to
//! Namespaces. The `reprise.dev/deadline-*` annotations a namespace sets
//! for its pods are read by name (`namespaces.rs`).
//!
//! The API server sends AdmissionReviews of up to [`MAX_REVIEW_BYTES`], so
//! that cap stays; what a client that never finishes its body can hold is
//! bounded instead: at most [`WebhookLimits::pending_bodies`] bodies are
//! read at once (their bytes, their time), and a request gets the
//! webhook's `timeoutSeconds` in all (the API server gives up then), its
//! wait for a body slot included. Each request the webhook could not answer
//! is counted in `reprise_controller_webhook_failed_open_total`: with
//! `failurePolicy: Ignore` its Pod was admitted without the sidecar.
//!
//! `GET /certificate` answers the serving certificate chain this listener
//! presents (public, as in every handshake): `kubectl reprise check` reads it
//! through the API server's service proxy, which terminates TLS itself, to
//! verify it against the webhook configuration's caBundle.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::DynamicObject;
use tokio::net::TcpListener;

use super::config::InjectionConfig;
use super::namespaces::Namespaces;
use super::pod::{decide, Context, Decision};
use crate::cache::Cache;
use crate::metrics::{Counter, Metrics};

/// Path the webhook configuration points at.
const PATH: &str = "/inject";
/// Path of the entry for namespaces opted into transparent mode.
const TRANSPARENT_PATH: &str = "/inject/transparent";
/// Path of the serving certificate chain (PEM), for `kubectl reprise check`.
const CERTIFICATE_PATH: &str = "/certificate";
/// The largest AdmissionReview the API server sends (its request limit).
const MAX_REVIEW_BYTES: usize = 3 * 1024 * 1024;

/// What the webhook's listener holds a request to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WebhookLimits {
    /// The listener's connections.
    pub(crate) listener: crate::listen::Limits,
    /// Bodies read at once; a request waits for a slot within its time.
    pub(crate) pending_bodies: usize,
    /// A whole request's time, its body's included: the webhook
    /// configuration's `timeoutSeconds`.
    pub(crate) request_timeout: std::time::Duration,
}

impl Default for WebhookLimits {
    fn default() -> Self {
        WebhookLimits {
            listener: crate::listen::Limits {
                max_connections: 64,
                max_per_source: None,
                header_timeout: std::time::Duration::from_secs(10),
                idle_timeout: std::time::Duration::from_secs(60),
            },
            pending_bodies: 8,
            request_timeout: std::time::Duration::from_secs(10),
        }
    }
}

/// Concurrent h2 streams on one webhook connection.
const WEBHOOK_MAX_STREAMS: u32 = 32;

/// Where the webhook learns the API server's addresses, which transparent
/// pods never capture.
#[derive(Debug, Default)]
pub(crate) struct ApiServer {
    /// The shared cache: `default/kubernetes`'s ClusterIPs.
    pub(crate) services: Option<Cache>,
    /// Until the cache has it: the controller's own `KUBERNETES_SERVICE_HOST`.
    pub(crate) fallback: Vec<IpAddr>,
}

impl ApiServer {
    /// The shared cache, falling back to this process's
    /// `KUBERNETES_SERVICE_HOST` (an IP in a pod; anything else is ignored).
    pub(crate) fn from_cache_and_env(services: Cache) -> Self {
        ApiServer {
            services: Some(services),
            fallback: std::env::var("KUBERNETES_SERVICE_HOST")
                .ok()
                .and_then(|h| h.trim_matches(['[', ']']).parse().ok())
                .into_iter()
                .collect(),
        }
    }

    fn addresses(&self) -> Vec<IpAddr> {
        let found = self
            .services
            .as_ref()
            .map(Cache::api_server_ips)
            .unwrap_or_default();
        if found.is_empty() {
            self.fallback.clone()
        } else {
            found
        }
    }
}

/// Answers admission reviews for Pods.
#[derive(Debug)]
pub(crate) struct Webhook {
    config: InjectionConfig,
    ca_pem: String,
    /// The serving certificate chain (PEM), for `GET /certificate`.
    certificate_pem: String,
    native: bool,
    metrics: Arc<Metrics>,
    api_server: ApiServer,
    /// Reads the annotations of a new pod's namespace; `None` reads none.
    namespaces: Option<Namespaces>,
    limits: WebhookLimits,
    /// Slots for bodies being read.
    bodies: tokio::sync::Semaphore,
    /// The certificate the listener serves now (renewed while it runs).
    serving: Option<Arc<crate::tls::Reloadable>>,
}

impl Webhook {
    /// A webhook injecting per `config`; `native` when the API server runs
    /// native sidecars (init containers with `restartPolicy: Always`).
    pub(crate) fn new(
        config: InjectionConfig,
        ca_pem: String,
        native: bool,
        metrics: Arc<Metrics>,
        api_server: ApiServer,
    ) -> Self {
        let limits = WebhookLimits::default();
        Webhook {
            config,
            ca_pem,
            certificate_pem: String::new(),
            native,
            metrics,
            api_server,
            namespaces: None,
            bodies: tokio::sync::Semaphore::new(limits.pending_bodies),
            limits,
            serving: None,
        }
    }

    /// Reads the `reprise.dev/deadline-*` annotations of a new pod's
    /// namespace with `namespaces`.
    pub(crate) fn with_namespaces(mut self, namespaces: Namespaces) -> Self {
        self.namespaces = Some(namespaces);
        self
    }

    /// The annotations of the namespace the review `body` is about, when
    /// namespaces are read.
    async fn namespace_of(&self, body: &[u8]) -> (String, BTreeMap<String, String>) {
        #[derive(serde::Deserialize)]
        struct Review {
            request: Option<Named>,
        }
        #[derive(serde::Deserialize)]
        struct Named {
            namespace: Option<String>,
        }
        let name = serde_json::from_slice::<Review>(body)
            .ok()
            .and_then(|r| r.request?.namespace)
            .unwrap_or_default();
        let annotations = match &self.namespaces {
            Some(n) if !name.is_empty() => n.annotations(&name).await,
            _ => BTreeMap::new(),
        };
        (name, annotations)
    }

    /// Answers `GET /certificate` with what `serving` presents now.
    pub(crate) fn with_serving(mut self, serving: Arc<crate::tls::Reloadable>) -> Self {
        self.serving = Some(serving);
        self
    }

    /// This webhook held to `limits`.
    pub(crate) fn with_limits(mut self, limits: WebhookLimits) -> Self {
        self.bodies = tokio::sync::Semaphore::new(limits.pending_bodies.max(1));
        self.limits = limits;
        self
    }

    /// Its listener's limits.
    pub(crate) fn listener_limits(&self) -> crate::listen::Limits {
        self.limits.listener
    }

    /// Answers `GET /certificate` with `pem`, the chain the listener serves.
    pub(crate) fn with_certificate(mut self, pem: String) -> Self {
        self.certificate_pem = pem;
        self
    }

    /// The response to one AdmissionReview body; `transparent_by_default`
    /// when it came through the transparent namespaces' path.
    #[cfg(test)]
    fn review(&self, body: &[u8], transparent_by_default: bool) -> AdmissionReview<DynamicObject> {
        self.review_in(
            body,
            transparent_by_default,
            (String::new(), BTreeMap::new()),
        )
    }

    /// [`Webhook::review`] of a pod in `namespace` (its name and
    /// annotations).
    fn review_in(
        &self,
        body: &[u8],
        transparent_by_default: bool,
        namespace: (String, BTreeMap<String, String>),
    ) -> AdmissionReview<DynamicObject> {
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
        let ctx = Context {
            native: self.native,
            transparent_by_default,
            api_server: self.api_server.addresses(),
            namespace,
        };
        match decide(pod, &self.config, &self.ca_pem, &ctx) {
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
                let transparent = mutated
                    .spec
                    .iter()
                    .flat_map(|s| s.init_containers.iter().flatten())
                    .any(|c| c.name == super::INIT_NAME);
                match response.clone().with_patch(patch) {
                    Ok(r) => {
                        self.metrics.add(Counter::Injections);
                        tracing::info!(namespace = ?request.namespace, pod = %name, native = self.native, transparent, "sidecar injected");
                        if transparent && ctx.api_server.is_empty() {
                            tracing::warn!(pod = %name, "the API server's address is unknown: this pod's connections to it go through the sidecar");
                        }
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

    /// Serves HTTPS on `listener` until the process ends, its connections
    /// held to `gate`.
    pub(crate) async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Arc<rustls::ServerConfig>,
        gate: Arc<crate::listen::Gate>,
    ) {
        crate::tls::accept(
            listener,
            tls,
            std::future::pending(),
            gate,
            move |tls, _peer| {
                let webhook = Arc::clone(&self);
                let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                async move {
                    let limits = webhook.limits.listener;
                    let service = service_fn(move |req| {
                        let webhook = Arc::clone(&webhook);
                        async move { Ok::<_, std::convert::Infallible>(webhook.answer(req).await) }
                    });
                    crate::listen::serve_http(
                        TokioIo::new(tls),
                        h2,
                        &limits,
                        WEBHOOK_MAX_STREAMS,
                        service,
                    )
                    .await;
                }
            },
        )
        .await;
    }

    /// One request, within the whole-request time; one not answered in it
    /// is counted as failed open.
    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        match tokio::time::timeout(self.limits.request_timeout, self.handle(req)).await {
            Ok(resp) => resp,
            Err(_) => {
                self.failed_open("timeout");
                plain(
                    StatusCode::GATEWAY_TIMEOUT,
                    "not answered within the webhook's timeout\n".into(),
                )
            }
        }
    }

    fn failed_open(&self, reason: &'static str) {
        self.metrics
            .count(crate::metrics::Labelled::WebhookFailedOpen, reason, 1);
        tracing::warn!(
            reason,
            "an admission request went unanswered: under failurePolicy Ignore its pod starts without the sidecar"
        );
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let transparent = match req.uri().path() {
            PATH => false,
            TRANSPARENT_PATH => true,
            CERTIFICATE_PATH if req.method() == Method::GET => return self.certificate(),
            _ => return not_found(),
        };
        if req.method() != Method::POST {
            return not_found();
        }
        // A slot for the body, then the body, all within the request's time.
        let Ok(_slot) = self.bodies.acquire().await else {
            return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n".into());
        };
        let body = match Limited::new(req.into_body(), MAX_REVIEW_BYTES)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                let too_large = e
                    .downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some();
                self.failed_open(if too_large { "too_large" } else { "unreadable" });
                return plain(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the body: {e}\n"),
                );
            }
        };
        let namespace = self.namespace_of(&body).await;
        match serde_json::to_vec(&self.review_in(&body, transparent, namespace)) {
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

impl Webhook {
    /// `GET /certificate`: the serving chain, or 404 when none was given.
    fn certificate(&self) -> Response<Full<Bytes>> {
        let pem = match &self.serving {
            Some(serving) => serving.serving_pem(),
            None => self.certificate_pem.clone(),
        };
        if pem.is_empty() {
            return not_found();
        }
        let mut resp = plain(StatusCode::OK, pem);
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-pem-file"),
        );
        resp
    }
}

fn not_found() -> Response<Full<Bytes>> {
    plain(
        StatusCode::NOT_FOUND,
        format!("POST {PATH} or {TRANSPARENT_PATH}, GET {CERTIFICATE_PATH} only\n"),
    )
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
        Webhook::new(
            config,
            "CA".into(),
            true,
            Arc::default(),
            ApiServer::default(),
        )
    }

    /// The JSON patch of a response, applied to `pod`.
    fn patched(r: &serde_json::Value, mut pod: serde_json::Value) -> serde_json::Value {
        // kube serialises the patch bytes as a JSON array of numbers, which
        // the API server's decoder accepts for a []byte field.
        let bytes: Vec<u8> = serde_json::from_value(r["patch"].clone()).expect("patch bytes");
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("patch");
        json_patch::patch(&mut pod, &patch).expect("applies");
        pod
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
        let r = response(&w.review(&review(pod.clone()), false));
        assert_eq!(r["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(r["allowed"], true);
        assert_eq!(r["patchType"], "JSONPatch");
        let patched = patched(&r, pod);
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
        })), false));
        assert_eq!(r["allowed"], false);
        let msg = r["status"]["message"].as_str().expect("message");
        assert!(msg.contains("reprise.dev/sidecar-memory-limit"), "{msg}");
    }

    #[test]
    fn the_serving_chain_is_served_only_when_given() {
        assert_eq!(webhook().certificate().status(), StatusCode::NOT_FOUND);
        let w = webhook().with_certificate("-----BEGIN CERTIFICATE-----\n".into());
        let resp = w.certificate();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.headers()[http::header::CONTENT_TYPE],
            "application/x-pem-file"
        );
    }

    #[test]
    fn garbage_is_answered_not_crashed() {
        let r = response(&webhook().review(b"{not json", false));
        assert_eq!(r["allowed"], false);
    }

    fn kubernetes_service(ips: &[&str]) -> k8s_openapi::api::core::v1::Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "spec": {"clusterIP": ips[0], "clusterIPs": ips, "ports": [{"port": 443}]}
        }))
        .expect("service")
    }

    /// `reprise-init`'s `--exclude-cidrs`, when the patched pod has it.
    fn excluded_cidrs(pod: &serde_json::Value) -> Option<String> {
        let init = pod["spec"]["initContainers"].as_array()?;
        let args = init.iter().find(|c| c["name"] == "reprise-init")?["args"].as_array()?;
        let at = args.iter().position(|a| a == "--exclude-cidrs")?;
        args[at + 1].as_str().map(String::from)
    }

    #[test]
    fn the_transparent_path_captures_by_default_excluding_the_api_server() {
        let config =
            InjectionConfig::from_yaml("image: sidecar:test\ncontrollerAddress: https://c:15010\n")
                .expect("config");
        let cache = Cache::fixed([], [kubernetes_service(&["10.96.0.1", "fd00:96::1"])], []);
        let w = Webhook::new(
            config,
            "CA".into(),
            true,
            Arc::default(),
            ApiServer {
                services: Some(cache),
                fallback: vec!["192.0.2.1".parse().expect("ip")],
            },
        );
        let pod = serde_json::json!({
            "metadata": {"name": "app"},
            "spec": {"containers": [{"name": "app"}]}
        });
        let transparent = patched(
            &response(&w.review(&review(pod.clone()), true)),
            pod.clone(),
        );
        assert_eq!(
            transparent["spec"]["initContainers"][0]["name"],
            "reprise-init"
        );
        assert_eq!(
            excluded_cidrs(&transparent).as_deref(),
            Some("10.96.0.1/32,fd00:96::1/128"),
            "the cache's ClusterIPs win over the fallback"
        );
        let plain = patched(
            &response(&w.review(&review(pod), false)),
            serde_json::json!({
                "metadata": {"name": "app"},
                "spec": {"containers": [{"name": "app"}]}
            }),
        );
        assert_eq!(
            plain["spec"]["initContainers"][0]["name"],
            "reprise-sidecar"
        );
        assert_eq!(excluded_cidrs(&plain), None);
    }

    #[test]
    fn without_the_kubernetes_service_the_env_fallback_is_excluded() {
        let config =
            InjectionConfig::from_yaml("image: sidecar:test\ncontrollerAddress: https://c:15010\n")
                .expect("config");
        let w = Webhook::new(
            config,
            "CA".into(),
            true,
            Arc::default(),
            ApiServer {
                services: Some(Cache::fixed([], [], [])),
                fallback: vec!["192.0.2.1".parse().expect("ip")],
            },
        );
        let pod = serde_json::json!({
            "metadata": {"name": "app", "annotations": {"reprise.dev/transparent": "true"}},
            "spec": {"containers": [{"name": "app"}]}
        });
        let p = patched(&response(&w.review(&review(pod.clone()), false)), pod);
        assert_eq!(excluded_cidrs(&p).as_deref(), Some("192.0.2.1/32"));
    }
}
