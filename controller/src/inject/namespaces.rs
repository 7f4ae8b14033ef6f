//! The namespace annotations injection reads: `reprise.dev/deadline-*`
//! (deadlines across hops, `docs/src/tasks/deadlines.md`), a namespace's
//! default for its pods' sidecars, which a pod's own annotation overrides.
//!
//! Read by name (`get` on Namespaces, the one namespace a new Pod is created
//! in; the chart's ClusterRole says why), metadata only, when a Pod of it is
//! created, and kept for [`KEEP`]: a burst of pods of one namespace (a
//! Deployment scaled up) costs one read. A read that fails or takes longer
//! than [`READ_WITHIN`] leaves the pod's annotations and the defaults: the
//! pod is never refused or held for it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};
use tokio::time::Instant;

/// How long a namespace's annotations are kept once read.
pub(crate) const KEEP: Duration = Duration::from_secs(30);
/// Longest a read may take before the pod is injected without it.
pub(crate) const READ_WITHIN: Duration = Duration::from_secs(2);
/// The annotations a namespace may set for its pods (the prefix of the
/// ones kept).
const PREFIX: &str = "reprise.dev/deadline-";
/// Namespaces kept at most; past it the oldest reads go.
const KEPT_AT_MOST: usize = 4096;

/// Each namespace read: when, and its `reprise.dev/deadline-*` annotations.
type Kept = HashMap<String, (Instant, BTreeMap<String, String>)>;

/// Reads namespaces' injection annotations, kept for a while.
pub(crate) struct Namespaces {
    api: Api<Namespace>,
    kept: Mutex<Kept>,
}

impl std::fmt::Debug for Namespaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespaces").finish_non_exhaustive()
    }
}

impl Namespaces {
    /// Reads through `client`.
    pub(crate) fn new(client: Client) -> Self {
        Namespaces {
            api: Api::all(client),
            kept: Mutex::new(HashMap::new()),
        }
    }

    /// The `reprise.dev/deadline-*` annotations of namespace `name`; none
    /// when it cannot be read.
    pub(crate) async fn annotations(&self, name: &str) -> BTreeMap<String, String> {
        let now = Instant::now();
        if let Some((at, kept)) = self.lock().get(name) {
            if now.duration_since(*at) < KEEP {
                return kept.clone();
            }
        }
        let read = tokio::time::timeout(READ_WITHIN, self.api.get_metadata(name)).await;
        let annotations: BTreeMap<String, String> = match read {
            Ok(Ok(ns)) => ns
                .metadata
                .annotations
                .unwrap_or_default()
                .into_iter()
                .filter(|(k, _)| k.starts_with(PREFIX))
                .collect(),
            Ok(Err(e)) => {
                tracing::warn!(namespace = name, error = %e, "cannot read the namespace's annotations; injecting with the pod's own and the defaults");
                return BTreeMap::new();
            }
            Err(_) => {
                tracing::warn!(namespace = name, within = ?READ_WITHIN, "the namespace's annotations did not come in time; injecting with the pod's own and the defaults");
                return BTreeMap::new();
            }
        };
        let mut kept = self.lock();
        if kept.len() >= KEPT_AT_MOST {
            kept.retain(|_, (at, _)| now.duration_since(*at) < KEEP);
        }
        if kept.len() < KEPT_AT_MOST {
            kept.insert(name.to_string(), (now, annotations.clone()));
        }
        annotations
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use http::{Request, Response, StatusCode};
    use kube::client::Body;

    use super::*;

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    fn answer(
        send: tower_test::mock::SendResponse<Response<Body>>,
        code: StatusCode,
        body: serde_json::Value,
    ) {
        send.send_response(
            Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(&body).expect("json")))
                .expect("response"),
        );
    }

    /// Serves one read of namespace `name` with `annotations`; returns the
    /// request's path and `Accept`.
    async fn serve_one(handle: &mut Handle, annotations: serde_json::Value) -> (String, String) {
        let (request, send) = handle.next_request().await.expect("a read");
        let path = request.uri().path().to_string();
        let accept = request
            .headers()
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        answer(
            send,
            StatusCode::OK,
            serde_json::json!({
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadata",
                "metadata": { "name": "shop", "annotations": annotations }
            }),
        );
        (path, accept)
    }

    #[tokio::test(start_paused = true)]
    async fn a_namespace_is_read_once_by_name_metadata_only_and_kept_a_while() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let namespaces = Namespaces::new(Client::new(service, "default"));
        let annotations = serde_json::json!({
            "reprise.dev/deadline-propagate": "false",
            "reprise.dev/inject": "enabled",
            "team": "shop"
        });
        let served = tokio::spawn(async move {
            let first = serve_one(&mut handle, annotations.clone()).await;
            let second = serve_one(&mut handle, annotations).await;
            (first, second)
        });
        let want: BTreeMap<String, String> = [(
            "reprise.dev/deadline-propagate".to_string(),
            "false".to_string(),
        )]
        .into();
        assert_eq!(
            namespaces.annotations("shop").await,
            want,
            "only the deadline ones"
        );
        assert_eq!(namespaces.annotations("shop").await, want, "kept");
        tokio::time::advance(KEEP).await;
        assert_eq!(namespaces.annotations("shop").await, want, "read again");
        let ((path, accept), (again, _)) = served.await.expect("served");
        assert_eq!(path, "/api/v1/namespaces/shop");
        assert!(accept.contains("PartialObjectMetadata"), "{accept}");
        assert_eq!(again, path);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_that_fails_or_hangs_leaves_no_annotations_and_is_not_kept() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let namespaces = Namespaces::new(Client::new(service, "default"));
        let served = tokio::spawn(async move {
            let (_, send) = handle.next_request().await.expect("a read");
            answer(
                send,
                StatusCode::FORBIDDEN,
                serde_json::json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403, "message": "forbidden" }),
            );
            // The next read is never answered.
            let (_, _send) = handle.next_request().await.expect("a second read");
            std::future::pending::<()>().await;
        });
        assert!(namespaces.annotations("shop").await.is_empty());
        assert!(
            namespaces.annotations("shop").await.is_empty(),
            "not kept: read again, times out"
        );
        served.abort();
    }
}
