//! Which host a request names, when it names more than one: the sidecar
//! routes by one host and must forward that same host, or refuse. Two
//! upstreams, `alpha` and `beta`, on loopback: a request routed to one must
//! never reach the other's endpoints with the other's name, nor reach an
//! HTTP/1.1 endpoint without a `Host`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use reprise_testkit::client;

use crate::support::{Action, Config, Sidecar, Upstream, UpstreamConfig};

/// Upstreams `alpha` and `beta`, each one echoing endpoint, behind a sidecar.
async fn alpha_and_beta() -> (Upstream, Upstream, Sidecar) {
    let alpha = Upstream::always(Action::Echo).await;
    let beta = Upstream::always(Action::Echo).await;
    let config = Config::new()
        .upstream(UpstreamConfig::new("alpha").endpoint(alpha.addr))
        .upstream(UpstreamConfig::new("beta").endpoint(beta.addr));
    let sidecar = Sidecar::start(config).await;
    (alpha, beta, sidecar)
}

/// Time for a request the sidecar might still forward to arrive.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn an_absolute_form_target_is_the_host_forwarded_whatever_host_says() {
    // RFC 9112 §3.2.2: a proxy given absolute-form ignores `Host` and sends
    // the target's authority in its place.
    let (alpha, beta, sidecar) = alpha_and_beta().await;
    for raw in [
        &b"GET http://alpha/x HTTP/1.1\r\nHost: beta\r\nConnection: close\r\n\r\n"[..],
        b"GET http://alpha/x HTTP/1.1\r\nHost: BETA:8080\r\nConnection: close\r\n\r\n",
        b"GET http://alpha/x HTTP/1.1\r\nHost: alpha\r\nConnection: close\r\n\r\n",
    ] {
        let r = client::exchange(sidecar.addr, raw)
            .await
            .expect("an answer");
        assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(raw));
    }
    let got = alpha.received();
    assert_eq!(got.len(), 3);
    for r in &got {
        assert_eq!(r.header_values("host"), ["alpha"], "{:?}", r.headers);
    }
    // The port and case of the target are kept as the client wrote them.
    let raw = b"GET http://Alpha:8080/x HTTP/1.1\r\nHost: beta\r\nConnection: close\r\n\r\n";
    let r = client::exchange(sidecar.addr, raw)
        .await
        .expect("an answer");
    assert_eq!(r.status, 200);
    assert_eq!(alpha.received()[3].header_values("host"), ["Alpha:8080"]);
    assert_eq!(beta.count(), 0);
}

#[tokio::test]
async fn two_host_lines_get_400_and_reach_no_upstream() {
    // RFC 9112 §3.2: more than one Host line is a 400 (nginx: "client sent
    // duplicate host header").
    let (alpha, beta, sidecar) = alpha_and_beta().await;
    for raw in [
        &b"GET /x HTTP/1.1\r\nHost: alpha\r\nHost: beta\r\n\r\n"[..],
        b"GET /x HTTP/1.1\r\nHost: alpha\r\nHost: alpha\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: beta\r\nX-A: 1\r\nhost: alpha\r\n\r\n",
        b"GET http://alpha/x HTTP/1.1\r\nHost: alpha\r\nHost: beta\r\n\r\n",
    ] {
        let r = client::exchange(sidecar.addr, raw)
            .await
            .expect("an answer");
        assert_eq!(r.status, 400, "{:?}", String::from_utf8_lossy(raw));
        assert_eq!(r.header("x-reprise-error"), Some("duplicate_host"));
        assert!(r.closes(), "the connection closes after a refused head");
    }
    settle().await;
    assert_eq!((alpha.count(), beta.count()), (0, 0));
}

#[tokio::test]
async fn connection_cannot_name_host_away() {
    // `Host` is end-to-end: a `Connection` option naming it is ignored, as
    // nginx and HAProxy (which remove no field `Connection` names) do.
    let (alpha, _beta, sidecar) = alpha_and_beta().await;
    for raw in [
        &b"GET /x HTTP/1.1\r\nHost: alpha\r\nConnection: host\r\n\r\n"[..],
        b"GET /x HTTP/1.1\r\nHost: alpha\r\nConnection: close, Host, x-private\r\nx-private: 1\r\n\r\n",
    ] {
        let r = client::exchange(sidecar.addr, raw).await.expect("an answer");
        assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(raw));
    }
    let got = alpha.received();
    assert_eq!(got.len(), 2);
    for r in &got {
        assert_eq!(r.header_values("host"), ["alpha"], "{:?}", r.headers);
        assert_eq!(r.header("x-private"), None, "other named fields still go");
    }
}

#[tokio::test]
async fn an_h2c_host_that_differs_from_authority_gets_400() {
    // RFC 9113 §8.3.1: a `host` naming another authority than `:authority`
    // makes the request malformed; the same one is fine.
    let (alpha, beta, sidecar) = alpha_and_beta().await;
    let (mut sender, _conn) = client::http2(sidecar.addr).await;
    let mut send = |host: &'static str| {
        let req = http::Request::get("http://alpha/x")
            .header("host", host)
            .body(Full::new(Bytes::new()))
            .expect("request");
        sender.send_request(req)
    };
    let refused = send("beta").await.expect("a response");
    assert_eq!(refused.status(), 400);
    assert_eq!(
        refused
            .headers()
            .get("x-reprise-error")
            .map(|v| v.as_bytes()),
        Some(&b"host_mismatch"[..])
    );
    let refused = send("alpha:8080").await.expect("a response");
    assert_eq!(refused.status(), 400, "another port is another authority");
    let ok = send("ALPHA").await.expect("a response");
    assert_eq!(ok.status(), 200, "case does not matter");
    let _ = ok.into_body().collect().await;
    settle().await;
    assert_eq!((alpha.count(), beta.count()), (1, 0));
    let host = alpha.received()[0].header_values("host").join(",");
    assert!(host.eq_ignore_ascii_case("alpha"), "{host}");
}
