//! `REPRISE_TRACE_RETRIED`: with the head sampler dropping every trace, a
//! request that needed a second attempt (a retry or a hedge) is exported
//! whole, its first attempt under the span id its endpoint already saw, and
//! its log line and diagnostics entry name the trace; no other request is.
//! `sampled` and an `always_off` sampler export none of them.

use std::collections::BTreeMap;
use std::time::Duration;

use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use reprise_testkit::client;
use reprise_testkit::sidecar::Running;
use reprise_testkit::upstream::{first_then, Received as Request};

use super::collector::{attr, hex, int, text, Collector, Received};
use super::{exporting, unhex, PARENT, TRACE};
use crate::cli::{config_file, BIN};
use crate::support::{api, full_budget, retries, Action, Upstream, UpstreamConfig};

/// The head sampler drops every trace.
const RATIO_ZERO: [(&str, &str); 3] = [
    ("OTEL_TRACES_SAMPLER", "traceidratio"),
    ("OTEL_TRACES_SAMPLER_ARG", "0"),
    ("OTEL_BSP_SCHEDULE_DELAY", "100"),
];

/// `/down…` always 503; `/fail…` 503 on its first attempt, 200 on the
/// retry; anything else 200.
fn script(r: &Request) -> Action {
    if r.path.starts_with("/down") || (r.path.starts_with("/fail") && r.attempt == Some(1)) {
        Action::Reply(503)
    } else {
        Action::Reply(200)
    }
}

/// The status of `method path` through `sidecar`, with `traceparent` when given.
async fn status(sidecar: &Running, method: &str, path: &str, traceparent: Option<&str>) -> u16 {
    let parent = traceparent.map_or(String::new(), |t| format!("traceparent: {t}\r\n"));
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: api\r\n{parent}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    client::exchange(sidecar.listen, raw.as_bytes())
        .await
        .expect("response")
        .status
}

/// Spans by trace id (hex).
fn by_trace(spans: &[Received]) -> BTreeMap<String, Vec<Span>> {
    let mut traces: BTreeMap<String, Vec<Span>> = BTreeMap::new();
    for r in spans {
        traces
            .entry(hex(&r.span.trace_id))
            .or_default()
            .push(r.span.clone());
    }
    traces
}

/// The trace's SERVER span and its CLIENT spans in the order they started.
fn split(spans: &[Span]) -> (&Span, Vec<&Span>) {
    let server = spans
        .iter()
        .find(|s| s.kind == SpanKind::Server as i32)
        .unwrap_or_else(|| panic!("no SERVER span: {spans:#?}"));
    let mut clients: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Client as i32)
        .collect();
    clients.sort_by_key(|s| s.start_time_unix_nano);
    (server, clients)
}

/// The `traceparent` the upstream received with the request for `path`
/// that was attempt `attempt`, from whichever of `ups` got it.
fn traceparent_of(ups: [&Upstream; 2], path: &str, attempt: u32) -> String {
    ups.iter()
        .flat_map(|u| u.received())
        .find(|r| r.path == path && r.attempt == Some(attempt))
        .unwrap_or_else(|| panic!("no attempt {attempt} of {path}"))
        .header("traceparent")
        .expect("a traceparent")
        .to_string()
}

/// Clock readings converted after the fact may differ by this much.
const SLACK_NANOS: u64 = 1_000_000;

#[tokio::test]
async fn under_a_ratio_of_zero_every_recovered_request_and_no_other_is_exported() {
    let collector = Collector::start().await;
    let (a, b) = (Upstream::start(script).await, Upstream::start(script).await);
    let policy = retries().attempts(1).backoff_base_ms(1).backoff_cap_ms(1);
    let sidecar = exporting(
        "trace-retried",
        api(&[&a, &b]).retries(policy),
        &format!("http://{}", collector.addr),
        &RATIO_ZERO,
    )
    .await;
    let unsampled_parent = format!("00-{TRACE}-{PARENT}-00");
    for i in 0..4 {
        assert_eq!(
            status(&sidecar, "GET", &format!("/ok/{i}"), None).await,
            200
        );
        assert_eq!(
            status(&sidecar, "GET", &format!("/fail/{i}"), None).await,
            200
        );
    }
    let parent = Some(unsampled_parent.as_str());
    assert_eq!(status(&sidecar, "GET", "/ok/parent", parent).await, 200);
    assert_eq!(status(&sidecar, "GET", "/fail/parent", parent).await, 200);
    // Failed, not retried (POST): one attempt, not exported.
    assert_eq!(status(&sidecar, "POST", "/down/post", None).await, 503);

    // Five recovered requests, three spans each; then nothing more.
    collector.wait_for_all(15).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let spans = collector.all();
    assert_eq!(spans.len(), 15, "{spans:#?}");
    let traces = by_trace(&spans);
    assert_eq!(traces.len(), 5);

    let events = sidecar.events("reprise::request");
    let logged = |path: &str| -> String {
        let e = events
            .iter()
            .find(|e| e["path"] == path)
            .unwrap_or_else(|| panic!("no log line for {path}"));
        e["trace_id"].as_str().expect("trace_id").to_string()
    };
    for i in 0..4 {
        assert_eq!(logged(&format!("/ok/{i}")), "", "not retried: untraced");
    }
    assert_eq!(logged("/down/post"), "");

    let diagnostics = sidecar
        .admin_get("/diagnostics")
        .await
        .expect("/diagnostics");
    let diagnostics: serde_json::Value = serde_json::from_str(&diagnostics.text()).expect("JSON");
    let entries = diagnostics["requests"].as_array().expect("requests");
    let listed = |path: &str| -> String {
        let e = entries
            .iter()
            .find(|e| e["path"] == path)
            .unwrap_or_else(|| panic!("{path} not listed: {diagnostics}"));
        e["trace_id"].as_str().expect("trace_id").to_string()
    };
    assert_eq!(listed("/down/post"), "", "skipped, one attempt: untraced");

    for (trace, spans) in &traces {
        assert_eq!(spans.len(), 3, "{trace}: {spans:#?}");
        let (server, clients) = split(spans);
        let path = text(&server.attributes, "url.path").expect("url.path");
        assert!(path.starts_with("/fail/"), "{path}");
        assert_eq!(server.name, "GET api");
        let s = &server.attributes;
        assert_eq!(text(s, "reprise.outcome"), Some("recovered"));
        assert_eq!(text(s, "reprise.upstream"), Some("api"));
        assert_eq!(int(s, "reprise.attempts"), Some(2));
        assert_eq!(int(s, "http.response.status_code"), Some(200));
        assert_eq!(text(s, "http.request.method"), Some("GET"));
        assert_eq!(text(s, "network.protocol.version"), Some("1.1"));
        assert!(server.events.iter().any(|e| e.name == "backoff"));
        if path == "/fail/parent" {
            assert_eq!(trace, TRACE, "the application's trace");
            assert_eq!(hex(&server.parent_span_id), PARENT, "its span the parent");
        } else {
            assert!(server.parent_span_id.is_empty(), "a root: {server:#?}");
        }

        assert_eq!(clients.len(), 2);
        let (first, second) = (clients[0], clients[1]);
        for c in [first, second] {
            assert_eq!(c.parent_span_id, server.span_id, "attempts are children");
            assert_eq!(
                text(&c.attributes, "url.full"),
                Some(format!("http://api{path}").as_str())
            );
        }
        assert_eq!(
            text(&first.attributes, "error.type"),
            Some("upstream_status_503")
        );
        assert_eq!(
            int(&first.attributes, "http.response.status_code"),
            Some(503)
        );
        assert_eq!(int(&first.attributes, "http.request.resend_count"), None);
        assert_eq!(
            int(&second.attributes, "http.request.resend_count"),
            Some(1)
        );
        assert_eq!(
            int(&second.attributes, "http.response.status_code"),
            Some(200)
        );
        assert_ne!(
            int(&first.attributes, "server.port"),
            int(&second.attributes, "server.port"),
            "one attempt to each server"
        );
        // Recorded after the fact with the times they happened.
        assert!(server.start_time_unix_nano <= first.start_time_unix_nano + SLACK_NANOS);
        assert!(first.start_time_unix_nano < first.end_time_unix_nano);
        assert!(first.end_time_unix_nano <= second.start_time_unix_nano + SLACK_NANOS);
        assert!(second.end_time_unix_nano <= server.end_time_unix_nano + SLACK_NANOS);

        // The first attempt went out unsampled, under the id its span was
        // later exported with; the retry went out sampled.
        assert_eq!(
            traceparent_of([&a, &b], path, 1),
            format!("00-{trace}-{}-00", hex(&first.span_id))
        );
        assert_eq!(
            traceparent_of([&a, &b], path, 2),
            format!("00-{trace}-{}-01", hex(&second.span_id))
        );
        assert_eq!(&logged(path), trace, "the log line names the trace");
        assert_eq!(&listed(path), trace, "so does the diagnostics entry");
    }
}

#[tokio::test]
async fn a_hedge_under_a_ratio_of_zero_is_exported_with_the_attempt_it_beat() {
    let collector = Collector::start().await;
    // Whichever endpoint gets the very first request stalls; the hedge answers.
    let script = first_then(Action::Stall(Duration::from_secs(3)), Action::Reply(200));
    let (a, b) = (
        Upstream::start(script.clone()).await,
        Upstream::start(script).await,
    );
    let sidecar = exporting(
        "trace-retried-hedge",
        api(&[&a, &b]).retries(full_budget().attempts(1).hedge_delay_ms(100)),
        &format!("http://{}", collector.addr),
        &RATIO_ZERO,
    )
    .await;
    assert_eq!(status(&sidecar, "GET", "/", None).await, 200);
    let spans = collector.wait_for_all(3).await;
    let traces = by_trace(&spans);
    assert_eq!(traces.len(), 1);
    let (trace, spans) = traces.iter().next().expect("one trace");
    let (server, clients) = split(spans);
    assert_eq!(text(&server.attributes, "reprise.outcome"), Some("ok"));
    assert!(attr(&server.attributes, "reprise.hedged").is_some());
    assert!(server.events.iter().any(|e| e.name == "hedge"));
    assert_eq!(clients.len(), 2);
    let (beaten, hedge) = (clients[0], clients[1]);
    assert!(attr(&beaten.attributes, "reprise.attempt.cancelled").is_some());
    assert_eq!(int(&beaten.attributes, "http.response.status_code"), None);
    assert!(attr(&beaten.attributes, "reprise.hedge").is_none());
    assert!(attr(&hedge.attributes, "reprise.hedge").is_some());
    assert_eq!(
        int(&hedge.attributes, "http.response.status_code"),
        Some(200)
    );
    // The stalled attempt went out unsampled, the hedge sampled.
    let mut parents: Vec<String> = [&a, &b]
        .iter()
        .flat_map(|u| u.received())
        .filter_map(|r| r.header("traceparent").map(str::to_string))
        .collect();
    parents.sort();
    let mut want = vec![
        format!("00-{trace}-{}-00", hex(&beaten.span_id)),
        format!("00-{trace}-{}-01", hex(&hedge.span_id)),
    ];
    want.sort();
    assert_eq!(parents, want);
}

#[tokio::test]
async fn sampled_mode_and_an_always_off_sampler_export_no_unsampled_retry() {
    let policy = || retries().attempts(1).backoff_base_ms(1).backoff_cap_ms(1);
    // `sampled`: only what the sampler keeps. A sampled parent is kept (the
    // pipeline works); the recovered root is not.
    let collector = Collector::start().await;
    let (a, b) = (Upstream::start(script).await, Upstream::start(script).await);
    let sidecar = exporting(
        "trace-retried-sampled",
        api(&[&a, &b]).retries(policy()),
        &format!("http://{}", collector.addr),
        &[
            ("REPRISE_TRACE_RETRIED", "sampled"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    assert_eq!(status(&sidecar, "GET", "/fail/root", None).await, 200);
    let sampled_parent = format!("00-{TRACE}-{PARENT}-01");
    assert_eq!(
        status(&sidecar, "GET", "/ok", Some(sampled_parent.as_str())).await,
        200
    );
    collector.wait_for(&unhex(TRACE), 2).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let spans = collector.all();
    assert!(
        spans.iter().all(|r| hex(&r.span.trace_id) == TRACE),
        "only the sampled request: {spans:#?}"
    );

    // `always_off`: nothing, retried or not.
    let collector = Collector::start().await;
    let (a, b) = (Upstream::start(script).await, Upstream::start(script).await);
    let sidecar = exporting(
        "trace-retried-off",
        api(&[&a, &b]).retries(policy()),
        &format!("http://{}", collector.addr),
        &[
            ("OTEL_TRACES_SAMPLER", "always_off"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    assert_eq!(status(&sidecar, "GET", "/fail/root", None).await, 200);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(collector.all().is_empty(), "{:#?}", collector.all());
    assert_eq!(
        sidecar
            .metric("reprise_trace_spans_exported_total", &[])
            .await,
        Some(0.0)
    );
}

#[test]
fn another_value_is_refused_at_start_naming_the_variable() {
    let addr = "127.0.0.1:1".parse().expect("addr");
    let path = config_file(
        "trace-retried-never",
        UpstreamConfig::new("api").endpoint(addr),
    );
    let mut child = std::process::Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .env("REPRISE_TRACE_RETRIED", "never")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the sidecar");
    // A sidecar that accepted the value would serve until killed.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the sidecar started with REPRISE_TRACE_RETRIED=never");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("its output");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("REPRISE_TRACE_RETRIED: must be always or sampled (got \"never\")"),
        "{stderr}"
    );
}
