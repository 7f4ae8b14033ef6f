//! Routing by absolute-form URI or Host, unknown upstreams, hop-by-hop headers
//! and HTTP/2 on both sides.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{config, upstream_yaml, Action, Sidecar, Upstream};

#[tokio::test]
async fn absolute_form_uris_route_by_host_and_ignore_the_port() {
    let api = Upstream::always(Action::Reply(200)).await;
    let web = Upstream::always(Action::Reply(201)).await;
    let yaml = format!(
        "upstreams:\n{}{}",
        upstream_yaml("api", &[&api], ""),
        upstream_yaml("web", &[&web], "")
    );
    let sidecar = Sidecar::start(&yaml).await;
    let mut s = tokio::net::TcpStream::connect(sidecar.addr)
        .await
        .expect("connect");
    s.write_all(b"GET http://web:8080/x HTTP/1.1\r\nHost: web:8080\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.expect("read");
    assert!(
        out.starts_with(b"HTTP/1.1 201"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!((api.count(), web.count()), (0, 1));
    // Host header routing, port ignored, case-insensitive.
    assert_eq!(sidecar.send("GET", "API:9999", "/", b"").await.status, 200);
    assert_eq!(api.count(), 1);
}

#[tokio::test]
async fn an_unknown_upstream_gets_an_immediate_error_naming_it() {
    let api = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(&config(&[&api], "")).await;
    let r = sidecar.send("GET", "nosuch", "/", b"").await;
    assert_eq!(r.status, 502);
    assert_eq!(
        r.headers.get("x-reprise-error").map(|v| v.as_bytes()),
        Some(&b"unknown_upstream"[..])
    );
    assert!(
        r.text().contains("no upstream named \"nosuch\""),
        "{}",
        r.text()
    );
    assert!(r.elapsed < Duration::from_secs(1));
}

#[tokio::test]
async fn hop_by_hop_headers_are_not_forwarded() {
    let api = Upstream::always(Action::Reply(200)).await;
    let sidecar = Sidecar::start(&config(&[&api], "")).await;
    let r = sidecar
        .send_with(
            "GET",
            "api",
            "/",
            b"",
            &[
                ("connection", "x-private"),
                ("x-private", "1"),
                ("keep-alive", "timeout=5"),
                ("x-kept", "yes"),
            ],
        )
        .await;
    assert_eq!(r.status, 200);
    let rec = &api.received()[0];
    let names: Vec<&str> = rec.headers.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        !names.contains(&"x-private") && !names.contains(&"keep-alive"),
        "{names:?}"
    );
    assert!(names.contains(&"x-kept"));
    assert!(
        rec.headers.iter().any(|(k, v)| k == "host" && v == "api"),
        "the Host header is kept"
    );
}

#[tokio::test]
async fn h2c_on_both_sides() {
    // An h2c upstream served by hyper.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let version = format!(
                            "{:?} {} {}",
                            req.version(),
                            req.uri().authority().map_or("-", |a| a.as_str()),
                            req.headers()
                                .get("host")
                                .map_or("-", |h| h.to_str().unwrap_or("?"))
                        );

                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from(version),
                        )))
                    },
                );
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let yaml = format!("upstreams:\n  - name: grpc\n    protocol: h2c\n    endpoints: [{{ address: 127.0.0.1, port: {} }}]\n", addr.port());
    let sidecar = Sidecar::start(&yaml).await;
    // An h2c client to the sidecar.
    let stream = tokio::net::TcpStream::connect(sidecar.addr)
        .await
        .expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
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
}
