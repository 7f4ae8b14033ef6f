//! Routing by absolute-form URI or Host, unknown upstreams, hop-by-hop headers
//! and HTTP/2 on both sides.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use reprise_testkit::client;

use crate::support::{api, retries, Action, Config, Sidecar, Upstream, UpstreamConfig};

#[tokio::test]
async fn absolute_form_uris_route_by_host_and_ignore_the_port() {
    let api = Upstream::always(Action::Reply(200)).await;
    let web = Upstream::always(Action::Reply(201)).await;
    let config = Config::new()
        .upstream(UpstreamConfig::new("api").endpoint(api.addr))
        .upstream(UpstreamConfig::new("web").endpoint(web.addr));
    let sidecar = Sidecar::start(config).await;
    let raw = b"GET http://web:8080/x HTTP/1.1\r\nHost: web:8080\r\nConnection: close\r\n\r\n";
    let answer = client::exchange(sidecar.addr, raw)
        .await
        .expect("an answer");
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!((api.count(), web.count()), (0, 1));
    // Host header routing, port ignored, case-insensitive.
    assert_eq!(sidecar.send("GET", "API:9999", "/", b"").await.status, 200);
    assert_eq!(api.count(), 1);
}

#[tokio::test]
async fn an_unknown_upstream_gets_an_immediate_error_naming_it() {
    let up = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(api(&[&up])).await;
    let r = sidecar.send("GET", "nosuch", "/", b"").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.header("x-reprise-error"), Some(&b"unknown_upstream"[..]));
    assert!(
        r.text().contains("no upstream named \"nosuch\""),
        "{}",
        r.text()
    );
    assert!(r.elapsed < Duration::from_secs(1));
}

#[tokio::test]
async fn hop_by_hop_headers_are_not_forwarded() {
    let up = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(api(&[&up])).await;
    let r = sidecar
        .get_with(
            "/",
            &[
                ("connection", "x-private"),
                ("x-private", "1"),
                ("keep-alive", "timeout=5"),
                ("x-kept", "yes"),
            ],
        )
        .await;
    assert_eq!(r.status, 200);
    let rec = &up.received()[0];
    let names: Vec<&str> = rec.headers.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        !names.contains(&"x-private") && !names.contains(&"keep-alive"),
        "{names:?}"
    );
    assert!(names.contains(&"x-kept"));
    assert!(
        rec.header_values("host").contains(&"api"),
        "the Host header is kept"
    );
}

#[tokio::test]
async fn h2c_on_both_sides() {
    // An h2c upstream (hyper's server) that answers with what it saw.
    let up = Upstream::start(|r| {
        let seen = format!(
            "{:?} {} {}",
            r.version,
            r.authority.as_deref().unwrap_or("-"),
            r.header("host").unwrap_or("-")
        );
        Action::ReplyWith(200, Vec::new(), seen.into())
    })
    .await;
    let sidecar = Sidecar::start(UpstreamConfig::new("grpc").h2c().endpoint(up.addr)).await;
    // An h2c client to the sidecar.
    let (mut sender, _conn) = client::http2(sidecar.addr).await;
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let req = http::Request::get("http://grpc/x")
            .body(Full::new(Bytes::new()))
            .expect("request");
        tasks.push(sender.send_request(req));
    }
    for t in tasks {
        let resp = t.await.expect("response");
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"HTTP/2.0 grpc -", "the upstream saw HTTP/2, :authority as the client addressed it, and no conflicting Host");
    }
    assert_eq!(up.count(), 20, "every request reached the upstream once");
}

#[tokio::test]
async fn h2c_answers_carry_date_and_content_length() {
    // A local answer (no endpoint wrote it): the h2c server adds `date`, as
    // a proxy must (RFC 9110 §6.6.1), and the length it knows.
    let sidecar =
        Sidecar::start(UpstreamConfig::new("api").endpoint("127.0.0.1:9".parse().expect("addr")))
            .await;
    let (mut sender, _conn) = client::http2(sidecar.addr).await;
    let req = http::Request::get("http://elsewhere/x")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    assert_eq!(resp.status(), 502, "{resp:?}");
    let date = resp
        .headers()
        .get("date")
        .expect("a date")
        .to_str()
        .expect("text");
    assert!(
        httpdate::parse_http_date(date).is_ok(),
        "an HTTP date: {date}"
    );
    let length: usize = resp.headers()["content-length"]
        .to_str()
        .expect("text")
        .parse()
        .expect("a number");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(length, body.len());
    assert!(!body.is_empty());
}

#[tokio::test]
async fn h2c_answers_without_content_end_with_their_head_and_keep_their_length() {
    // An h2c upstream whose answers to HEAD, and its 304s, carry the length
    // of a body they do not send.
    let up = Upstream::start(|r| {
        let status = if r.path == "/cached" { 304 } else { 200 };
        Action::ReplyWith(status, vec![("content-length", "5".into())], Bytes::new())
    })
    .await;
    let sidecar = Sidecar::start(UpstreamConfig::new("api").h2c().endpoint(up.addr)).await;
    let (mut sender, _conn) = client::http2(sidecar.addr).await;
    for (method, path, status) in [("HEAD", "/x", 200), ("GET", "/cached", 304)] {
        let req = http::Request::builder()
            .method(method)
            .uri(format!("http://api{path}"))
            .body(Full::new(Bytes::new()))
            .expect("request");
        let resp = sender.send_request(req).await.expect("response");
        assert_eq!(resp.status(), status, "{method} {path}: {resp:?}");
        assert_eq!(
            resp.headers()["content-length"],
            "5",
            "{method} {path}: the length is kept"
        );
        let body = resp.into_body().collect().await.expect("no error");
        assert!(body.to_bytes().is_empty(), "{method} {path}: no content");
    }
    // On the wire, with the h2 crate's client: the head ends the stream.
    let io = tokio::net::TcpStream::connect(sidecar.addr)
        .await
        .expect("connect");
    let (h2, conn) = h2::client::handshake(io).await.expect("h2 handshake");
    tokio::spawn(conn);
    let mut h2 = h2.ready().await.expect("ready");
    let req = http::Request::head("http://api/x")
        .body(())
        .expect("request");
    let (response, _) = h2.send_request(req, true).expect("sent");
    let response = response.await.expect("response");
    assert!(
        response.body().is_end_stream(),
        "END_STREAM came with the HEADERS (no empty DATA frame after them)"
    );
}

#[tokio::test]
async fn an_h2c_retry_sends_the_same_fields_as_the_first_attempt() {
    // The first attempt's header map goes to the h2 crate; a retry's head
    // is rebuilt from the fields kept for it (up to eight), or copied
    // (more). Either way the upstream sees the same fields, in order,
    // repeated ones included, and only the attempt number changes.
    let up = Upstream::start(|r| {
        let first = r.header("x-reprise-attempt") == Some("1");
        Action::Reply(if first { 503 } else { 200 })
    })
    .await;
    let sidecar = Sidecar::start(
        UpstreamConfig::new("api").h2c().endpoint(up.addr).retries(
            retries()
                .attempts(1)
                .reuse_endpoints(true)
                .backoff_base_ms(0)
                .backoff_cap_ms(0),
        ),
    )
    .await;
    let (mut sender, _conn) = client::http2(sidecar.addr).await;
    for extra in [2, 12] {
        let mut req = http::Request::get("http://api/x")
            .header("x-order", "a")
            .header("x-other", "b")
            .header("x-order", "c");
        for i in 0..extra {
            req = req.header(format!("x-extra-{i}"), i.to_string());
        }
        let req = req.body(Full::new(Bytes::new())).expect("request");
        let before = up.count();
        let resp = sender.send_request(req).await.expect("response");
        assert_eq!(resp.status(), 200, "{extra} extra fields: retried");
        let seen = up.received();
        let [first, retry] = &seen[before..] else {
            panic!(
                "{extra} extra fields: two attempts, got {}",
                seen.len() - before
            );
        };
        let fields = |r: &reprise_testkit::upstream::Received| {
            r.headers
                .iter()
                .filter(|(k, _)| k != "x-reprise-attempt")
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(fields(first), fields(retry), "{extra} extra fields");
        assert_eq!(first.header_values("x-order"), ["a", "c"]);
        assert_eq!(retry.header("x-reprise-attempt"), Some("2"));
        assert_eq!(fields(retry).len(), 3 + extra, "{:?}", retry.headers);
    }
}
