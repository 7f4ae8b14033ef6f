//! The reconciler against a mocked API server and a filled cache: that it
//! reads nothing from the API (every read comes from the shared cache), what
//! status it writes, that an unchanged policy writes nothing, and the span it
//! records.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use kube::Client;
use opentelemetry::trace::{SpanKind, Status};
use opentelemetry::Value as AttrValue;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SpanData};
use reprise_controller::cache::Cache;
use reprise_controller::metrics::Counter;
use reprise_controller::reconcile::{reconcile, Context};
use reprise_controller::telemetry::{self, Tracing};
use reprise_crds::resource::{RetryPolicy, RetryPolicyStatus};
use reprise_telemetry::{BatchSettings, Pipeline};
use serde_json::{json, Value};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// The Service `shop/api` (one port, `http` 80) and its EndpointSlice with
/// two ready pods, or nothing when `service_exists` is false.
fn cache(service_exists: bool) -> Cache {
    if !service_exists {
        return Cache::fixed([], [], []);
    }
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": "api", "namespace": "shop" },
        "spec": { "ports": [{ "name": "http", "port": 80 }] }
    }))
    .expect("service");
    let slice: EndpointSlice = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": { "name": "api-1", "namespace": "shop", "labels": { "kubernetes.io/service-name": "api" } },
        "addressType": "IPv4",
        "ports": [{ "name": "http", "port": 8080 }],
        "endpoints": [
            { "addresses": ["127.0.0.11"], "conditions": { "ready": true }, "targetRef": { "kind": "Pod", "name": "api-a" } },
            { "addresses": ["127.0.0.12"], "conditions": { "ready": true }, "targetRef": { "kind": "Pod", "name": "api-b" } }
        ]
    }))
    .expect("slice");
    // A slice of another Service in the namespace: not an endpoint of `api`.
    let mut other = slice.clone();
    other.metadata.name = Some("web-1".into());
    other.metadata.labels =
        Some([("kubernetes.io/service-name".to_string(), "web".to_string())].into());
    Cache::fixed([], [service], [slice, other])
}

fn context(service_exists: bool) -> (Arc<Context>, Handle) {
    context_with(service_exists, Tracing::off(), false)
}

/// A context on a mocked API server reading a filled cache; `events` records
/// Kubernetes Events through the API.
fn context_with(service_exists: bool, tracing: Tracing, events: bool) -> (Arc<Context>, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let mut ctx = Context::new(client.clone(), cache(service_exists), tracing);
    if events {
        ctx = ctx.with_recorder(Recorder::new(
            client,
            Reporter {
                controller: "reprise-controller".into(),
                instance: None,
            },
        ));
    }
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

/// Serves the status patch, the only request a reconcile makes before its
/// Events (it reads from the cache, never from the API); returns its body if
/// one came.
async fn serve(mut handle: Handle) -> Option<Value> {
    serve_on(&mut handle).await
}

/// Like [`serve`], on a handle the caller keeps to serve what comes next.
async fn serve_on(handle: &mut Handle) -> Option<Value> {
    let next =
        tokio::time::timeout(std::time::Duration::from_millis(500), handle.next_request()).await;
    let (req, send) = next.ok()??;
    assert_eq!(
        req.method(),
        Method::PATCH,
        "no GET or LIST: reads come from the cache ({} {})",
        req.method(),
        req.uri()
    );
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
    let (ctx, handle) = context(true);
    let server = tokio::spawn(serve(handle));
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
    let (ctx, handle) = context(false);
    let server = tokio::spawn(serve(handle));
    let p = policy(json!({ "targetRef": { "name": "api" } }), None);
    reconcile(Arc::new(p), ctx).await.expect("reconcile");
    let patch = server.await.expect("server").expect("a status patch");
    assert_eq!(patch["status"]["conditions"][0]["status"], "False");
    assert_eq!(patch["status"]["conditions"][0]["reason"], "TargetNotFound");
    assert_eq!(patch["status"]["state"], "Rejected");
}

#[tokio::test]
async fn an_invalid_spec_is_rejected_with_the_field_named() {
    let (ctx, handle) = context(true);
    let server = tokio::spawn(serve(handle));
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
    let (ctx, handle) = context(true);
    let server = tokio::spawn(serve(handle));
    let p = policy(json!({ "targetRef": { "name": "api" } }), None);
    reconcile(Arc::new(p.clone()), ctx)
        .await
        .expect("reconcile");
    let patch = server.await.expect("server").expect("patch");
    let status: RetryPolicyStatus =
        serde_json::from_value(patch["status"].clone()).expect("status");

    let (ctx, handle) = context(true);
    let server = tokio::spawn(serve(handle));
    let again = policy(json!({ "targetRef": { "name": "api" } }), Some(status));
    reconcile(Arc::new(again), Arc::clone(&ctx))
        .await
        .expect("reconcile");
    assert!(
        server.await.expect("server").is_none(),
        "no write when nothing changed"
    );
    assert_eq!(ctx.metrics().get(Counter::StatusWrites), 0);
    assert_eq!(ctx.metrics().get(Counter::Reconciles), 1);
}

#[tokio::test]
async fn a_status_written_is_not_written_again_before_the_cache_holds_it() {
    // The cache still holds the object the write was computed from (its
    // watch event has not arrived): a second reconcile of it computes the
    // same status and writes nothing.
    let (ctx, handle) = context(true);
    let server = tokio::spawn(serve(handle));
    let p = policy(json!({ "targetRef": { "name": "api" } }), None);
    reconcile(Arc::new(p), ctx).await.expect("reconcile");
    let patch = server.await.expect("server").expect("patch");
    let mut stale: RetryPolicyStatus =
        serde_json::from_value(patch["status"].clone()).expect("status");
    stale.endpoints = 9; // what the object said before the slice changed

    let (ctx, mut handle) = context(true);
    let mut p = policy(json!({ "targetRef": { "name": "api" } }), Some(stale));
    p.metadata.resource_version = Some("7".into());
    let p = Arc::new(p);
    let first = tokio::spawn(reconcile(Arc::clone(&p), Arc::clone(&ctx)));
    assert!(serve_on(&mut handle).await.is_some(), "the first write");
    first.await.expect("task").expect("reconcile");
    let second = tokio::spawn(reconcile(Arc::clone(&p), Arc::clone(&ctx)));
    assert!(serve_on(&mut handle).await.is_none(), "no second write");
    second.await.expect("task").expect("reconcile");
    assert_eq!(ctx.metrics().get(Counter::StatusWrites), 1);
    // Another version of the object (someone else wrote its status) is written again.
    let mut newer = (*p).clone();
    newer.metadata.resource_version = Some("8".into());
    let third = tokio::spawn(reconcile(Arc::new(newer), Arc::clone(&ctx)));
    assert!(serve_on(&mut handle).await.is_some(), "written again");
    third.await.expect("task").expect("reconcile");
    assert_eq!(ctx.metrics().get(Counter::StatusWrites), 2);
}

/// Tracing into memory, exporting only when flushed.
fn in_memory_pipeline() -> (Pipeline, InMemorySpanExporter) {
    let exporter = InMemorySpanExporter::default();
    let batch = BatchSettings {
        schedule_delay: Duration::from_secs(3600),
        export_timeout: Duration::from_secs(5),
        max_queue_size: 64,
        max_export_batch_size: 64,
    };
    let pipeline = Pipeline::with_exporter(exporter.clone(), batch, telemetry::SERVICE);
    (pipeline, exporter)
}

/// The one span exported after a flush.
async fn the_span(tracing: &Tracing, exporter: &InMemorySpanExporter) -> SpanData {
    assert!(tracing.flush(Duration::from_secs(5)).await);
    let mut spans = exporter.get_finished_spans().expect("spans");
    assert_eq!(spans.len(), 1, "{spans:#?}");
    spans.remove(0)
}

fn attr(attributes: &[opentelemetry::KeyValue], key: &str) -> Option<AttrValue> {
    attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.clone())
}

#[tokio::test]
async fn a_reconcile_is_one_span_with_its_verdict_and_writes() {
    // The chart sets these from the downward API; the SDK's detector must read them.
    std::env::set_var(
        "OTEL_RESOURCE_ATTRIBUTES",
        "k8s.pod.name=reprise-controller-0,k8s.namespace.name=reprise-system,k8s.node.name=node-a",
    );
    std::env::remove_var("OTEL_SERVICE_NAME");
    let (pipeline, exporter) = in_memory_pipeline();
    let resource = pipeline.resource();
    for (key, value) in [
        ("service.name", "reprise-controller"),
        ("k8s.pod.name", "reprise-controller-0"),
        ("k8s.namespace.name", "reprise-system"),
        ("k8s.node.name", "node-a"),
    ] {
        assert_eq!(
            resource.get(&opentelemetry::Key::from_static_str(key)),
            Some(AttrValue::from(value)),
            "{key}"
        );
    }
    let tracing = Tracing::on(pipeline);
    let (ctx, mut handle) = context_with(true, tracing.clone(), true);
    let server = tokio::spawn(async move {
        serve_on(&mut handle).await.expect("a status patch");
        // Then the Events the reconcile records, until it stops sending.
        let mut reasons = Vec::new();
        while let Ok(Some((req, send))) =
            tokio::time::timeout(Duration::from_millis(500), handle.next_request()).await
        {
            assert_eq!(req.method(), Method::POST);
            assert_eq!(
                req.uri().path(),
                "/apis/events.k8s.io/v1/namespaces/shop/events"
            );
            let event: Value =
                serde_json::from_slice(&req.into_body().collect_bytes().await.expect("body"))
                    .expect("json");
            reasons.push(event["reason"].as_str().unwrap_or_default().to_string());
            respond(send, StatusCode::CREATED, event);
        }
        reasons
    });
    let p = policy(json!({ "targetRef": { "name": "api" } }), None);
    reconcile(Arc::new(p), Arc::clone(&ctx))
        .await
        .expect("reconcile");
    let reasons = server.await.expect("server");
    assert_eq!(reasons.first().map(String::as_str), Some("Accepted"));

    let span = the_span(&tracing, &exporter).await;
    assert_eq!(span.name, "reconcile");
    assert_eq!(span.span_kind, SpanKind::Internal);
    assert_eq!(span.status, Status::Unset);
    for (key, value) in [
        ("k8s.namespace.name", AttrValue::from("shop")),
        ("reprise.policy", AttrValue::from("reads")),
        ("reprise.policy.generation", AttrValue::I64(2)),
        ("reprise.reconcile.result", AttrValue::from("accepted")),
        ("reprise.endpoints", AttrValue::I64(2)),
        ("reprise.sidecars.selected", AttrValue::I64(0)),
        ("reprise.sidecars.in_sync", AttrValue::I64(0)),
    ] {
        assert_eq!(attr(&span.attributes, key), Some(value), "{key}");
    }
    let events: Vec<_> = span.events.iter().collect();
    assert_eq!(events[0].name, "status_written");
    let recorded: Vec<_> = events
        .iter()
        .filter(|e| e.name == "event_recorded")
        .map(|e| attr(&e.attributes, "reprise.event.reason"))
        .collect();
    assert_eq!(
        recorded,
        reasons
            .iter()
            .map(|r| Some(AttrValue::from(r.clone())))
            .collect::<Vec<_>>(),
        "one span event per Kubernetes Event"
    );
    assert_eq!(
        attr(&events[1].attributes, "reprise.event.type"),
        Some(AttrValue::from("Normal"))
    );
    assert_eq!(tracing.counters().map(|c| c.exported()), Some(1));
}

#[tokio::test]
async fn a_failed_reconcile_span_is_an_error_with_its_type() {
    let (pipeline, exporter) = in_memory_pipeline();
    let tracing = Tracing::on(pipeline);
    let (ctx, mut handle) = context_with(true, tracing.clone(), false);
    let server = tokio::spawn(async move {
        let (req, send) = handle.next_request().await.expect("PATCH status");
        assert_eq!(req.method(), Method::PATCH);
        respond(
            send,
            StatusCode::FORBIDDEN,
            json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403, "message": "retrypolicies.reprise.dev \"reads\" is forbidden" }),
        );
    });
    let p = policy(json!({ "targetRef": { "name": "api" } }), None);
    let error = reconcile(Arc::new(p.clone()), Arc::clone(&ctx))
        .await
        .expect_err("the API refused");
    server.await.expect("server");
    // The error policy counts it by what failed, and retries soon.
    let action = reprise_controller::reconcile::error_policy(Arc::new(p), &error, Arc::clone(&ctx));
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(Duration::from_secs(1))
    );
    assert_eq!(ctx.metrics().reconcile_errors("kube"), 1);
    assert!(ctx
        .metrics()
        .render(&Default::default(), None)
        .contains("reprise_controller_reconcile_errors_total{error=\"kube\"} 1\n"));

    let span = the_span(&tracing, &exporter).await;
    assert!(
        matches!(&span.status, Status::Error { description } if description.contains("forbidden")),
        "{:?}",
        span.status
    );
    assert_eq!(
        attr(&span.attributes, "reprise.reconcile.result"),
        Some(AttrValue::from("error"))
    );
    assert_eq!(
        attr(&span.attributes, "error.type"),
        Some(AttrValue::from("Forbidden"))
    );
    assert_eq!(attr(&span.attributes, "reprise.endpoints"), None);
    assert!(span.events.is_empty(), "nothing was written");
}
