//! gRPC through the sidecar, against tonic's real server and client over h2c
//! with `:authority` routing: calls pass through (`te: trailers` kept), a
//! listed `grpc-status` in a Trailers-Only response or before the first
//! message is retried, `grpc-retry-pushback-ms` is honoured (a negative one
//! ends the retries), a stream that has sent a message is never retried,
//! retries carry `grpc-previous-rpc-attempts`, the client's `grpc-timeout`
//! bounds them, and local failures are gRPC statuses, never HTTP 502.
//!
//! One endpoint with `reuse_endpoints`, so a retry goes back to it and the
//! script decides exactly what each attempt gets.

use std::time::{Duration, Instant};

use reprise_testkit::grpc::{self, GrpcAction, GrpcServer};
use tonic::Code;

use crate::support::{Retries, Sidecar, Upstream, UpstreamConfig};

/// Two retries of POST (every gRPC call is a POST, with a body to replay)
/// to the one endpoint, without backoff; gRPC statuses: the retries block's
/// default, `unavailable`.
fn retries() -> Retries {
    Retries::new()
        .attempts(2)
        .retry_post(true)
        .buffer_max_bytes(64 * 1024)
        .reuse_endpoints(true)
        .backoff_base_ms(0)
        .backoff_cap_ms(0)
        .budget_min_retries_per_second(1000)
}

/// A sidecar in front of `server` (upstream `echo`, h2c) with `retries`, and
/// a channel to it addressing `echo`.
async fn through(server: &GrpcServer, retries: Retries) -> (Sidecar, tonic::transport::Channel) {
    let upstream = UpstreamConfig::new("echo")
        .endpoint(server.addr)
        .h2c()
        .retries(retries);
    let sidecar = Sidecar::start(upstream).await;
    let channel = grpc::channel(sidecar.addr, "echo:50051").await;
    (sidecar, channel)
}

/// A server answering the `n`th call with `script[n]`, then normally.
async fn scripted(script: Vec<GrpcAction>) -> GrpcServer {
    GrpcServer::start("a", move |n| {
        script.get(n).cloned().unwrap_or(GrpcAction::Ok)
    })
    .await
}

#[tokio::test]
async fn unary_calls_pass_through_with_te_trailers() {
    let server = GrpcServer::healthy("a").await;
    let (_sidecar, channel) = through(&server, Retries::new()).await;
    for i in 0..30 {
        let got = grpc::say(&channel, &format!("hi {i}"), &[])
            .await
            .unwrap_or_else(|s| panic!("call {i}: {s:?}"));
        assert_eq!(got.text, format!("hi {i} from a"));
    }
    let calls = server.calls();
    assert_eq!(calls.len(), 30, "each call reached the server once");
    assert!(
        calls.iter().all(|c| c.get("te") == Some("trailers")),
        "{:?}",
        calls[0]
    );
    assert!(calls
        .iter()
        .all(|c| c.get("grpc-previous-rpc-attempts").is_none()));
}

#[tokio::test]
async fn a_trailers_only_unavailable_is_retried_with_the_previous_attempts_counted() {
    let server = scripted(vec![
        GrpcAction::TrailersOnly(Code::Unavailable, None),
        GrpcAction::TrailersOnly(Code::Unavailable, None),
    ])
    .await;
    let (sidecar, channel) = through(&server, retries()).await;
    let got = grpc::say(&channel, "hi", &[])
        .await
        .expect("the third attempt answers");
    assert_eq!(got.text, "hi from a");
    let calls = server.calls();
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[0].get("grpc-previous-rpc-attempts"), None);
    assert_eq!(calls[1].get("grpc-previous-rpc-attempts"), Some("1"));
    assert_eq!(calls[2].get("grpc-previous-rpc-attempts"), Some("2"));
    let stats = sidecar.stats("echo");
    assert_eq!(stats.retries.get("grpc_status_unavailable"), Some(&2));
    assert_eq!(stats.outcome("recovered"), 1);
}

#[tokio::test]
async fn an_unlisted_status_is_passed_on_unretried() {
    let server = scripted(vec![GrpcAction::TrailersOnly(Code::Internal, None)]).await;
    let (sidecar, channel) = through(&server, retries()).await;
    let status = grpc::say(&channel, "hi", &[]).await.expect_err("INTERNAL");
    assert_eq!(status.code(), Code::Internal);
    assert_eq!(
        status.message(),
        "scripted Internal",
        "the server's own status"
    );
    assert_eq!(server.count(), 1);
    assert_eq!(sidecar.stats("echo").grpc_statuses.get(&13), Some(&1));
}

#[tokio::test]
async fn pushback_delays_the_retry_and_a_negative_one_ends_the_retries() {
    let server = scripted(vec![GrpcAction::TrailersOnly(
        Code::Unavailable,
        Some("400"),
    )])
    .await;
    let (_sidecar, channel) = through(&server, retries()).await;
    let started = Instant::now();
    grpc::say(&channel, "hi", &[])
        .await
        .expect("answered after the pushback");
    assert!(
        started.elapsed() >= Duration::from_millis(390),
        "waited {:?}",
        started.elapsed()
    );
    assert_eq!(server.count(), 2);

    let server = scripted(vec![GrpcAction::TrailersOnly(
        Code::Unavailable,
        Some("-1"),
    )])
    .await;
    let (sidecar, channel) = through(&server, retries()).await;
    let status = grpc::say(&channel, "hi", &[]).await.expect_err("no retry");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(server.count(), 1, "the server asked for no retry");
    assert_eq!(
        sidecar.stats("echo").outcomes.get(&("skipped", "pushback")),
        Some(&1)
    );
}

#[tokio::test]
async fn a_stream_is_retried_before_its_first_message_and_never_after() {
    let server = scripted(vec![GrpcAction::BeforeFirstMessage(Code::Unavailable)]).await;
    let (_sidecar, channel) = through(&server, retries()).await;
    let (messages, end) = grpc::stream_call(&channel, "s").await;
    assert_eq!(end.map_err(|s| s.code()), Ok(()));
    assert_eq!(messages, ["s from a #1", "s from a #2", "s from a #3"]);
    assert_eq!(server.count(), 2, "retried: no message had been sent");

    let server = scripted(vec![GrpcAction::AfterFirstMessage(Code::Unavailable)]).await;
    let (_sidecar, channel) = through(&server, retries()).await;
    let (messages, end) = grpc::stream_call(&channel, "s").await;
    assert_eq!(messages, ["s from a #1"], "the message reached the client");
    assert_eq!(end.map_err(|s| s.code()), Err(Code::Unavailable));
    assert_eq!(
        server.count(),
        1,
        "a stream that sent a message is never retried"
    );
}

#[tokio::test]
async fn a_local_failure_is_a_grpc_status_not_an_http_502() {
    let down = Upstream::refusing().await;
    let upstream = UpstreamConfig::new("echo")
        .endpoint(down.addr)
        .h2c()
        .retries(retries());
    let sidecar = Sidecar::start(upstream).await;
    let channel = grpc::channel(sidecar.addr, "echo").await;
    let status = grpc::say(&channel, "hi", &[])
        .await
        .expect_err("nothing listens");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "connect_refused", "{status:?}");
    assert_eq!(
        status
            .metadata()
            .get("x-reprise-error")
            .and_then(|v| v.to_str().ok()),
        Some("connect_refused")
    );
    // An unknown host too.
    let channel = grpc::channel(sidecar.addr, "nowhere").await;
    let status = grpc::say(&channel, "hi", &[])
        .await
        .expect_err("no upstream");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "unknown_upstream");
}

#[tokio::test]
async fn the_clients_grpc_timeout_bounds_the_retries() {
    let server = GrpcServer::start("a", |_| {
        GrpcAction::Delay(Duration::from_secs(2), Box::new(GrpcAction::Ok))
    })
    .await;
    let (sidecar, channel) = through(&server, retries()).await;
    drop(channel);
    let started = Instant::now();
    // A client that does not enforce its own deadline: the sidecar gives up.
    let (code, message) = grpc::raw_say(sidecar.addr, "echo", &[("grpc-timeout", "300m")]).await;
    assert_eq!(code.as_deref(), Some("4"), "DEADLINE_EXCEEDED: {message:?}");
    assert_eq!(message.as_deref(), Some("deadline_exceeded"));
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "gave up at the client's deadline, not after the server's 2 s: {:?}",
        started.elapsed()
    );
    let sent = server.calls()[0]
        .get("grpc-timeout")
        .and_then(|v| v.strip_suffix('m'))
        .and_then(|v| v.parse::<u64>().ok())
        .expect("the attempt carried grpc-timeout in ms");
    assert!(sent <= 300, "the time left, at most the client's: {sent}m");
}
