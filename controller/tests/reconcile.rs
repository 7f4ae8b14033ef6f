//! The reconciler against a mocked API server: what it reads, what status it
//! writes, and that an unchanged policy writes nothing.

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use kube::Client;
use reprise_controller::reconcile::{reconcile, Context};
use reprise_crds::resource::{RetryPolicy, RetryPolicyStatus};
use serde_json::{json, Value};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn context() -> (Arc<Context>, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = Context {
        client: Client::new(service, "default"),
        recorder: None,
        metrics: Arc::default(),
        sidecars: Arc::default(),
        failures: Default::default(),
        peers: None,
    };

    (Arc::new(ctx), handle)
}

fn policy(spec: Value, status: Option<RetryPolicyStatus>) -> RetryPolicy {
    let mut p: RetryPolicy = serde_json::from_value(json!({
        "apiVersion": "reprise.dev/v1alpha1",
        "kind": "RetryPolicy",
        "metadata": { "name": "reads", "namespace": "shop", "generation": 2 },
        "spec": spec
    }))
    .expect("policy");
    p.status = status;
    p
}

fn respond(send: tower_test::mock::SendResponse<Response<Body>>, code: StatusCode, body: Value) {
    send.send_response(
        Response::builder()
            .status(code)
            .body(Body::from(serde_json::to_vec(&body).expect("json")))
            .expect("response"),
    );
}

/// Serves the service GET and the EndpointSlice LIST; returns the status patch body if one came.
async fn serve(mut handle: Handle, service_exists: bool) -> Option<Value> {
    let (req, send) = handle.next_request().await.expect("GET service");
    assert_eq!(req.method(), Method::GET);
    assert_eq!(req.uri().path(), "/api/v1/namespaces/shop/services/api");
    if !service_exists {
        respond(
            send,
            StatusCode::NOT_FOUND,
            json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "services \"api\" not found" }),
        );
    } else {
        respond(
            send,
            StatusCode::OK,
            json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": "api", "namespace": "shop" }, "spec": { "ports": [{ "name": "http", "port": 80 }] } }),
        );
        let (req, send) = handle.next_request().await.expect("LIST slices");
        assert_eq!(
            req.uri().path(),
            "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices"
        );
        assert!(
            req.uri()
                .query()
                .unwrap_or("")
                .contains("labelSelector=kubernetes.io%2Fservice-name%3Dapi"),
            "{:?}",
            req.uri()
        );
        respond(
            send,
            StatusCode::OK,
            json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {},
                "items": [{
                    "metadata": { "name": "api-1", "namespace": "shop" }, "addressType": "IPv4",
                    "ports": [{ "name": "http", "port": 8080 }],
                    "endpoints": [
                        { "addresses": ["127.0.0.11"], "conditions": { "ready": true }, "targetRef": { "kind": "Pod", "name": "api-a" } },
                        { "addresses": ["127.0.0.12"], "conditions": { "ready": true }, "targetRef": { "kind": "Pod", "name": "api-b" } }
                    ]
                }]
            }),
        );
    }
    let next =
        tokio::time::timeout(std::time::Duration::from_millis(500), handle.next_request()).await;
    let (req, send) = next.ok()??;
    assert_eq!(req.method(), Method::PATCH);
    assert_eq!(
        req.uri().path(),
        "/apis/reprise.dev/v1alpha1/namespaces/shop/retrypolicies/reads/status"
    );
    let query = req.uri().query().unwrap_or("").to_string();
    assert!(
        query.contains("fieldManager=reprise-controller") && query.contains("force=true"),
        "server-side apply: {query}"
    );
    assert_eq!(
        req.headers().get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/apply-patch+yaml"[..])
    );
    let body: Value = serde_json::from_slice(&req.into_body().collect_bytes().await.expect("body"))
        .expect("json");
    respond(
        send,
        StatusCode::OK,
        json!({ "apiVersion": "reprise.dev/v1alpha1", "kind": "RetryPolicy", "metadata": { "name": "reads", "namespace": "shop" }, "spec": { "targetRef": { "name": "api" } } }),
    );
    Some(body)
}

#[tokio::test]
async fn a_valid_policy_is_accepted_with_its_endpoints() {
    let (ctx, handle) = context();
    let server = tokio::spawn(serve(handle, true));
    let p = policy(json!({ "targetRef": { "name": "api" } }), None);
    reconcile(Arc::new(p), Arc::clone(&ctx))
        .await
        .expect("reconcile");
    let patch = server.await.expect("server").expect("a status patch");
    let status = &patch["status"];
    assert_eq!(status["observedGeneration"], 2);
    assert_eq!(status["endpoints"], 2);
    assert_eq!(status["state"], "Active");
    assert_eq!(status["inSync"], "0/0");
    assert_eq!(status["conditions"][0]["type"], "Accepted");
    assert_eq!(status["conditions"][0]["status"], "True");
    assert_eq!(patch["apiVersion"], "reprise.dev/v1alpha1");
}

#[tokio::test]
async fn a_missing_target_is_reported_not_failed() {
    let (ctx, handle) = context();
    let server = tokio::spawn(serve(handle, false));
    let p = policy(json!({ "targetRef": { "name": "api" } }), None);
    reconcile(Arc::new(p), ctx).await.expect("reconcile");
    let patch = server.await.expect("server").expect("a status patch");
    assert_eq!(patch["status"]["conditions"][0]["status"], "False");
    assert_eq!(patch["status"]["conditions"][0]["reason"], "TargetNotFound");
    assert_eq!(patch["status"]["state"], "Rejected");
}

#[tokio::test]
async fn an_invalid_spec_is_rejected_with_the_field_named() {
    let (ctx, handle) = context();
    let server = tokio::spawn(serve(handle, true));
    // Slipped past the schema (e.g. applied before the CRD was updated).
    let p = policy(
        json!({ "targetRef": { "name": "api" }, "retries": { "attempts": 11 } }),
        None,
    );
    reconcile(Arc::new(p), ctx).await.expect("reconcile");
    let patch = server.await.expect("server").expect("a status patch");
    let accepted = &patch["status"]["conditions"][0];
    assert_eq!(accepted["reason"], "InvalidSpec");
    assert_eq!(
        accepted["message"],
        "spec.retries.attempts: must be in 0..=10 (got 11)"
    );
}

#[tokio::test]
async fn reconcile_is_idempotent() {
    // First pass computes the status; second pass, with that status on the object, writes nothing.
    let (ctx, handle) = context();
    let server = tokio::spawn(serve(handle, true));
    let p = policy(json!({ "targetRef": { "name": "api" } }), None);
    reconcile(Arc::new(p.clone()), ctx)
        .await
        .expect("reconcile");
    let patch = server.await.expect("server").expect("patch");
    let status: RetryPolicyStatus =
        serde_json::from_value(patch["status"].clone()).expect("status");

    let (ctx, handle) = context();
    let server = tokio::spawn(serve(handle, true));
    let again = policy(json!({ "targetRef": { "name": "api" } }), Some(status));
    reconcile(Arc::new(again), Arc::clone(&ctx))
        .await
        .expect("reconcile");
    assert!(
        server.await.expect("server").is_none(),
        "no write when nothing changed"
    );
    assert_eq!(
        ctx.metrics
            .status_writes
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}
