//! Upstreams with a `tls` block behind the real rules: an app that speaks
//! plain HTTP to the virtual address gets TLS originated to the endpoints
//! (and retried across them), while TLS the app starts itself is relayed
//! opaque to an endpoint, its handshake the endpoint's, and never retried.
//! Every endpoint is the test kit's TLS front, so it answers only over TLS.

use std::net::SocketAddr;
use std::time::Duration;

use reprise_testkit::config::Config;
use reprise_testkit::tls::TestCa;
use serde_json::Value;

use crate::clients::probe;
use crate::helper::{Helper, Server};
use crate::lab::{v4, wait_for, Lab};
use crate::proxying::{
    access_log, answers, assert_no_refusals, flaky_upstream, metrics, start_sidecar,
};

/// The name the endpoints' certificates carry and the sidecar verifies.
const SERVER_NAME: &str = "api.example.test";
/// The app's Host, which names no upstream.
const HOST: &str = "shop.example.test";
/// Longest a TLS server takes to report its handshakes.
const REPORTED_WITHIN: Duration = Duration::from_secs(5);

/// The virtual address, a 503 endpoint and a 200 one, all port 443-like.
fn addrs() -> (SocketAddr, SocketAddr, SocketAddr) {
    (v4(100, 443), v4(11, 8443), v4(12, 8443))
}

/// A TLS endpoint answering `status`, with a certificate from `ca`.
fn tls_server(ca: &TestCa, bind: SocketAddr, name: &str, status: u16) -> Server {
    let identity = ca.issue(name, &[SERVER_NAME]);
    Server::Tls {
        bind,
        name: name.to_string(),
        status,
        cert_pem: identity.cert_pem,
        key_pem: identity.key_pem,
    }
}

/// The servers, the rules and the sidecar with upstream `api` over TLS to
/// a failing and a healthy endpoint, trusting `ca`.
fn start(lab: &Lab, ca: &TestCa, label: &str) -> (Helper, Helper) {
    let (virtual_addr, bad, good) = addrs();
    let svc = Helper::serve(
        lab,
        &lab.svc,
        vec![
            tls_server(ca, bad, "bad", 503),
            tls_server(ca, good, "good", 200),
        ],
    );
    lab.install_rules();
    let upstream =
        flaky_upstream("api", virtual_addr, bad, good).tls(Some(&ca.ca_file()), Some(SERVER_NAME));
    let sidecar = start_sidecar(lab, label, Config::from(upstream));
    (svc, sidecar)
}

/// Waits for the TLS servers' reports to add up to at least `want`
/// handshakes; (bad's, good's).
fn handshakes(svc: &Helper, want: u64) -> (u64, u64) {
    let counts = || (svc.handshakes("bad"), svc.handshakes("good"));
    wait_for(REPORTED_WITHIN, || {
        let (bad, good) = counts();
        (bad + good >= want).then_some(())
    });
    counts()
}

#[test]
fn plain_http_to_a_tls_upstream_is_originated_as_tls_and_retried() {
    let Some(lab) = Lab::new() else { return };
    let ca = TestCa::new("transparent-origin");
    let (svc, sidecar) = start(&lab, &ca, "tls-origin");
    let (virtual_addr, _, _) = addrs();
    let host = virtual_addr.ip().to_string();
    let port = virtual_addr.port().to_string();

    // Twelve connections: until the failing endpoint has failed once the
    // first attempt's pick is a coin toss, so it is tried unless all twelve
    // miss it (1 in 4096).
    let py = probe(&lab, &["http", &host, &port, "/plain", HOST, "12"]);
    assert_eq!(
        answers(&py),
        vec![(200, "good".to_string(), HOST.to_string()); 12],
        "{py}\nthe sidecar's log:\n{}",
        sidecar.lines().join("\n")
    );
    let requests: Vec<Value> = svc
        .hits()
        .into_iter()
        .filter(|h| h.get("path").is_some())
        .collect();
    let bad_requests = requests.iter().filter(|h| h["endpoint"] == "bad").count();
    assert!(
        bad_requests > 0,
        "the failing endpoint was tried: {requests:?}\nthe sidecar's log:\n{}",
        sidecar.lines().join("\n")
    );
    for h in &requests {
        assert_eq!(h["host"], HOST, "every attempt carried the app's Host: {h}");
    }
    // The endpoints answer only behind TLS, so the requests above already
    // crossed it; the fronts' counts say the sidecar shook hands with each.
    let (bad, good) = handshakes(&svc, 2);
    assert!(bad >= 1 && good >= 1, "handshakes: bad {bad}, good {good}");

    let m = metrics(&lab);
    let retries = m.sum("reprise_retries_total", &[("upstream", "api")]);
    assert!(
        retries >= bad_requests as f64,
        "a retry per failed attempt ({bad_requests} failed, {retries} retries)"
    );
    assert_eq!(
        m.sum(
            "reprise_captured_connections_total",
            &[("protocol", "http1")]
        ),
        12.0,
        "every connection was served as HTTP"
    );
    assert_eq!(
        m.sum(
            "reprise_captured_connections_total",
            &[("protocol", "opaque")]
        ),
        0.0
    );
    assert_no_refusals(&m);
    let recovered: Vec<Value> = wait_for(REPORTED_WITHIN, || {
        let r: Vec<Value> = access_log(&sidecar)
            .into_iter()
            .filter(|l| l["outcome"] == "recovered")
            .collect();
        (!r.is_empty()).then_some(r)
    })
    .unwrap_or_else(|| {
        panic!(
            "an access log line shows the retry:\n{}",
            sidecar.lines().join("\n")
        )
    });
    assert_eq!(recovered[0]["upstream"], "api");
    assert_eq!(recovered[0]["endpoints"], "bad,good", "{}", recovered[0]);
}

#[test]
fn tls_the_app_starts_itself_stays_opaque_and_is_not_retried() {
    let Some(lab) = Lab::new() else { return };
    let ca = TestCa::new("transparent-opaque");
    let (svc, sidecar) = start(&lab, &ca, "tls-opaque");
    let (virtual_addr, _, _) = addrs();
    let ca_file = ca.ca_file();
    let ca_file = ca_file.to_str().expect("a UTF-8 path");

    // Twelve connections, each relayed to an endpoint picked at random: the
    // failing one is picked unless all twelve miss it (1 in 4096), and its
    // 503 then reaches the app, which nothing retried.
    let py = probe(
        &lab,
        &[
            "https",
            &virtual_addr.ip().to_string(),
            &virtual_addr.port().to_string(),
            "/own-tls",
            HOST,
            "12",
            ca_file,
            SERVER_NAME,
        ],
    );
    assert!(py.get("error").is_none(), "the app's own TLS failed: {py}");
    let got = answers(&py);
    assert_eq!(got.len(), 12, "{py}");
    for (status, endpoint, host) in &got {
        let want = if endpoint == "bad" { 503 } else { 200 };
        assert_eq!(
            (*status, host.as_str()),
            (want, HOST),
            "{endpoint} answered the app itself: {py}"
        );
    }
    assert!(
        got.iter().any(|(_, e, _)| e == "bad"),
        "a 503 reached the app unretried: {py}"
    );
    for r in py["responses"].as_array().expect("responses") {
        assert!(
            r["tls"].as_str().is_some_and(|v| v.starts_with("TLSv1")),
            "the app's own TLS: {r}"
        );
    }
    // One handshake per app connection and none of the sidecar's own: the
    // endpoints verified the app's TLS, not TLS the sidecar originated.
    let (bad, good) = handshakes(&svc, 12);
    assert_eq!(bad + good, 12, "handshakes: bad {bad}, good {good}");

    let m = metrics(&lab);
    assert_eq!(
        m.sum(
            "reprise_captured_connections_total",
            &[("protocol", "opaque")]
        ),
        12.0,
        "every connection was relayed opaque"
    );
    assert_eq!(
        m.sum(
            "reprise_captured_connections_total",
            &[("protocol", "http1")]
        ),
        0.0
    );
    assert_eq!(m.sum("reprise_retries_total", &[("upstream", "api")]), 0.0);
    assert_eq!(m.sum("reprise_opaque_connect_failures_total", &[]), 0.0);
    assert_no_refusals(&m);
    assert!(
        access_log(&sidecar).is_empty(),
        "no request went through the retry path"
    );
}
