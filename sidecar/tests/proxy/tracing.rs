//! OpenTelemetry tracing: the real binary exporting to an in-process OTLP
//! collector over HTTP/protobuf and gRPC; trace context in and out; a down
//! collector costs spans, never requests; off by default; retried requests
//! exported whatever the sampler said (`retried`).

mod collector;
mod retried;

use std::time::Duration;

use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::Span;
use reprise_testkit::client;
use reprise_testkit::sidecar::{free_addr, Running};
use reprise_testkit::upstream::first_then;

use crate::cli::{config_file, start, EXIT_WITHIN};
use crate::support::{api, full_budget, retries, Action, Config, Sidecar, Upstream};
use collector::{hex, int, text, Collector, Received};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Two endpoints running `script` (one script: its clones share a count).
async fn two(
    script: impl Fn(&reprise_testkit::upstream::Received) -> Action + Clone + Send + Sync + 'static,
) -> (Upstream, Upstream) {
    (
        Upstream::start(script.clone()).await,
        Upstream::start(script).await,
    )
}

/// Two endpoints; the very first request (whichever endpoint gets it) answers
/// 503, every other one 200: one request recovers on its retry, deterministically.
async fn first_request_fails() -> (Upstream, Upstream) {
    two(first_then(Action::Reply(503), Action::Reply(200))).await
}

/// The binary from `config` (written for `label`), exporting to `endpoint`
/// with `env` besides.
async fn exporting(
    label: &str,
    config: impl Into<Config>,
    endpoint: &str,
    env: &[(&str, &str)],
) -> Running {
    let mut all = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)];
    all.extend_from_slice(env);
    start(&config_file(label, config), &all).await
}

/// The status of one traced GET of `path` through `sidecar`.
async fn traced_status(sidecar: &Running, path: &str) -> u16 {
    client::exchange(sidecar.listen, traced_get(path).as_bytes())
        .await
        .expect("response")
        .status
}

/// The first span of `kind` in `spans`; panics naming `what` when there is none.
fn only<'a>(spans: &'a [Received], kind: SpanKind, what: &str) -> &'a Span {
    &spans
        .iter()
        .find(|r| r.span.kind == kind as i32)
        .unwrap_or_else(|| panic!("no {what}: {spans:#?}"))
        .span
}

fn traced_get(path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: api\r\ntraceparent: 00-{TRACE}-{PARENT}-01\r\ntracestate: vendor=abc\r\nConnection: close\r\n\r\n"
    )
}

/// Runs the recovered-request scenario over `protocol`; returns the spans.
async fn recovered_request(protocol: &str, extra_env: &[(&str, &str)]) -> Vec<Received> {
    let collector = Collector::start().await;
    let (a, b) = first_request_fails().await;
    let mut env = vec![
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    env.extend_from_slice(extra_env);
    let sidecar = exporting(
        &format!("trace-{}", protocol.replace('/', "-")),
        api(&[&a, &b]).retries(retries().attempts(1)),
        &format!("http://{}", collector.addr),
        &env,
    )
    .await;
    assert_eq!(traced_status(&sidecar, "/items?token=secret").await, 200);
    let spans = collector.wait_for(&unhex(TRACE), 3).await;
    assert_eq!(
        spans.len(),
        3,
        "one SERVER and two CLIENT spans: {spans:#?}"
    );

    let server: Vec<_> = spans
        .iter()
        .filter(|r| r.span.kind == SpanKind::Server as i32)
        .collect();
    assert_eq!(server.len(), 1);
    let server = &server[0].span;
    assert_eq!(
        hex(&server.parent_span_id),
        PARENT,
        "child of the app's span"
    );
    assert_eq!(server.name, "GET api");
    let s = &server.attributes;
    assert_eq!(text(s, "reprise.outcome"), Some("recovered"));
    assert_eq!(text(s, "reprise.rule"), Some("upstream"));
    assert_eq!(text(s, "reprise.upstream"), Some("api"));
    assert_eq!(int(s, "reprise.attempts"), Some(2));
    assert_eq!(int(s, "reprise.max_attempts"), Some(2));
    assert_eq!(text(s, "http.request.method"), Some("GET"));
    assert_eq!(text(s, "url.path"), Some("/items"));
    assert_eq!(int(s, "http.response.status_code"), Some(200));
    let backoff = server
        .events
        .iter()
        .find(|e| e.name == "backoff")
        .expect("a backoff event");
    assert!(int(&backoff.attributes, "reprise.backoff_ms").is_some());

    let mut clients: Vec<_> = spans
        .iter()
        .filter(|r| r.span.kind == SpanKind::Client as i32)
        .map(|r| &r.span)
        .collect();
    clients.sort_by_key(|s| s.start_time_unix_nano);
    assert_eq!(clients.len(), 2);
    for c in &clients {
        assert_eq!(c.parent_span_id, server.span_id, "attempts are children");
        assert_eq!(text(&c.attributes, "url.full"), Some("http://api/items"));
    }
    let (first, second) = (&clients[0].attributes, &clients[1].attributes);
    assert_eq!(text(first, "error.type"), Some("upstream_status_503"));
    assert_eq!(int(first, "http.response.status_code"), Some(503));
    assert_eq!(int(first, "http.request.resend_count"), None);
    assert_eq!(
        clients[0].status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32)
    );
    assert_eq!(int(second, "http.request.resend_count"), Some(1));
    assert_eq!(int(second, "http.response.status_code"), Some(200));
    assert_eq!(text(second, "error.type"), None);

    // Each attempt went to a different endpoint, and each endpoint saw that
    // attempt's own span as its parent, in a single traceparent.
    let mut ports: Vec<i64> = clients
        .iter()
        .map(|c| int(&c.attributes, "server.port").expect("port"))
        .collect();
    ports.sort_unstable();
    let mut expected = vec![i64::from(a.addr.port()), i64::from(b.addr.port())];
    expected.sort_unstable();
    assert_eq!(ports, expected);
    for up in [&a, &b] {
        let received = up.received();
        assert_eq!(received.len(), 1);
        let parents = received[0].header_values("traceparent");
        let attempt = clients
            .iter()
            .find(|c| int(&c.attributes, "server.port") == Some(i64::from(up.addr.port())))
            .expect("the attempt to this endpoint");
        assert_eq!(
            text(&attempt.attributes, "server.address"),
            Some("127.0.0.1")
        );
        assert_eq!(
            parents,
            [format!("00-{TRACE}-{}-01", hex(&attempt.span_id))],
            "replaced, not appended"
        );
        assert!(received[0]
            .header_values("tracestate")
            .contains(&"vendor=abc"));
    }
    spans
}

#[tokio::test]
async fn a_recovered_request_is_one_server_span_and_a_client_span_per_attempt_over_http() {
    let spans = recovered_request("http/protobuf", &[]).await;
    assert!(spans.iter().all(|r| r.transport == "http"));
    assert_eq!(
        text(&spans[0].resource, "service.name"),
        Some("reprise-sidecar")
    );
}

#[tokio::test]
async fn grpc_export_and_resource_from_the_environment() {
    let spans = recovered_request(
        "grpc",
        &[
            ("OTEL_SERVICE_NAME", "checkout-sidecar"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment.name=test",
            ),
        ],
    )
    .await;
    assert!(spans.iter().all(|r| r.transport == "grpc"));
    let resource = &spans[0].resource;
    assert_eq!(text(resource, "service.name"), Some("checkout-sidecar"));
    assert_eq!(text(resource, "deployment.environment.name"), Some("test"));
}

#[tokio::test]
async fn a_hedge_is_its_own_attempt_and_the_loser_ends_cancelled() {
    let collector = Collector::start().await;
    // Whichever endpoint gets the very first request stalls; the hedge answers.
    let (a, b) = two(first_then(
        Action::Stall(Duration::from_secs(3)),
        Action::Reply(200),
    ))
    .await;
    let sidecar = exporting(
        "trace-hedge",
        api(&[&a, &b]).retries(full_budget().attempts(1).hedge_delay_ms(100)),
        &format!("http://{}", collector.addr),
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    )
    .await;
    assert_eq!(traced_status(&sidecar, "/").await, 200);
    let spans = collector.wait_for(&unhex(TRACE), 3).await;
    let server = only(&spans, SpanKind::Server, "server span");
    assert_eq!(text(&server.attributes, "reprise.outcome"), Some("ok"));
    assert!(server.events.iter().any(|e| e.name == "hedge"));
    let clients: Vec<_> = spans
        .iter()
        .filter(|r| r.span.kind == SpanKind::Client as i32)
        .map(|r| &r.span.attributes)
        .collect();
    assert_eq!(clients.len(), 2);
    let hedge = clients
        .iter()
        .find(|c| collector::attr(c, "reprise.hedge").is_some())
        .expect("the hedge");
    assert_eq!(int(hedge, "http.request.resend_count"), Some(1));
    assert_eq!(int(hedge, "http.response.status_code"), Some(200));
    let loser = clients
        .iter()
        .find(|c| collector::attr(c, "reprise.hedge").is_none())
        .expect("the first attempt");
    assert!(collector::attr(loser, "reprise.attempt.cancelled").is_some());
    assert_eq!(int(loser, "http.response.status_code"), None);
}

#[tokio::test]
async fn an_unreachable_collector_drops_and_counts_spans_and_requests_still_succeed() {
    let up = Upstream::always(Action::Reply(200)).await;
    let sidecar = exporting(
        "trace-down",
        api(&[&up]),
        &format!("http://{}", free_addr()),
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    for _ in 0..5 {
        assert_eq!(traced_status(&sidecar, "/").await, 200);
    }
    let dropped = sidecar
        .wait_for_metric(
            "reprise_trace_spans_dropped_total",
            &[],
            Duration::from_secs(10),
            |v| v > 0.0,
        )
        .await
        .unwrap_or(0.0);
    assert!(dropped > 0.0, "no span counted as dropped");
    assert_eq!(
        sidecar
            .metric("reprise_trace_spans_exported_total", &[])
            .await,
        Some(0.0)
    );
}

#[tokio::test]
async fn sigterm_flushes_queued_spans() {
    let collector = Collector::start().await;
    let up = Upstream::always(Action::Reply(200)).await;
    let mut sidecar = exporting(
        "trace-flush",
        api(&[&up]),
        &format!("http://{}", collector.addr),
        // No timed export before the signal: only the shutdown flush sends.
        &[("OTEL_BSP_SCHEDULE_DELAY", "600000")],
    )
    .await;
    assert_eq!(traced_status(&sidecar, "/").await, 200);
    assert!(collector.trace(&unhex(TRACE)).is_empty());
    let exit = sidecar.stop(EXIT_WITHIN).await.expect("exit after SIGTERM");
    assert_eq!(exit.code, Some(0));
    assert_eq!(collector.trace(&unhex(TRACE)).len(), 2, "SERVER and CLIENT");
    // The request's log event names its trace, to jump from a log to Jaeger.
    let events = sidecar.events("reprise::request");
    let event = events.first().expect("the request's log event");
    assert_eq!(event["trace_id"], TRACE);
}

#[tokio::test]
async fn tracing_off_passes_the_apps_traceparent_through() {
    let up = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(api(&[&up])).await;
    assert!(!sidecar.proxy.tracing().is_on());
    let traceparent = format!("00-{TRACE}-{PARENT}-01");
    let r = sidecar
        .get_with("/", &[("traceparent", &traceparent)])
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(up.received()[0].header_values("traceparent"), [traceparent]);
}

#[tokio::test]
async fn a_request_forwarded_outside_every_upstream_gets_a_client_span() {
    let collector = Collector::start().await;
    // Built here with an explicit endpoint: `Tracing::start` reads the OTLP
    // endpoint from the process environment, which other tests share.
    let exporter = {
        use opentelemetry_otlp::WithExportConfig;
        opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(format!("http://{}/v1/traces", collector.addr))
            .build()
            .expect("exporter")
    };
    let batch = reprise_telemetry::BatchSettings {
        schedule_delay: Duration::from_millis(100),
        export_timeout: Duration::from_secs(5),
        max_queue_size: 2048,
        max_export_batch_size: 512,
    };
    let tracing =
        reprise_sidecar::observe::Tracing::on(reprise_telemetry::Pipeline::with_exporter(
            exporter,
            batch,
            reprise_sidecar::observe::SERVICE,
        ));
    // Kubernetes mode forwards hosts no policy covers, once, as a plain proxy.
    let mesh = Upstream::always(Action::Reply(200)).await;
    let outside = Upstream::always(Action::Reply(200)).await;
    let mut cfg = Config::from(api(&[&mesh])).resolve();
    cfg.proxy.forward_unknown_hosts = true;
    let sidecar = Sidecar::serve(reprise_sidecar::Proxy::with_tracing(cfg, tracing)).await;

    let port = outside.addr.port();
    let raw = format!(
        "GET http://127.0.0.1:{port}/outside?token=x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\ntraceparent: 00-{TRACE}-{PARENT}-01\r\nConnection: close\r\n\r\n"
    );
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        client::exchange(sidecar.addr, raw.as_bytes()),
    )
    .await
    .expect("answered in time")
    .expect("an HTTP response");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(mesh.count(), 0);

    let spans = collector.wait_for(&unhex(TRACE), 2).await;
    let server = only(&spans, SpanKind::Server, "server span");
    let client = only(&spans, SpanKind::Client, "client span");
    assert_eq!(client.parent_span_id, server.span_id);
    assert_eq!(
        text(&client.attributes, "server.address"),
        Some("127.0.0.1")
    );
    assert_eq!(
        int(&client.attributes, "server.port"),
        Some(i64::from(port))
    );
    assert_eq!(
        text(&client.attributes, "url.full"),
        Some(format!("http://127.0.0.1:{port}/outside").as_str()),
        "no query: it may carry credentials"
    );
    assert_eq!(
        int(&client.attributes, "http.response.status_code"),
        Some(200)
    );
    // The outside server received the CLIENT span's context.
    assert_eq!(
        outside.received()[0].header_values("traceparent"),
        [format!("00-{TRACE}-{}-01", hex(&client.span_id))]
    );
}
