//! `GET /diagnostics` on the admin listener: the requests that were retried
//! or failed, newest first, each with its attempts; bounded by
//! `proxy.diagnostics_retained`, filtered by `upstream`, `outcome` and
//! `limit`, off at 0.

use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::future::join_all;
use reprise_sidecar::server::{serve_admin, Admin};
use reprise_sidecar::Proxy;
use reprise_testkit::client;
use reprise_testkit::upstream::Received;
use serde_json::Value;
use tokio::net::TcpListener;

use crate::support::{
    api, retries, Action, Config, ProxyConfig, Sidecar, Upstream, UpstreamConfig,
};

/// `/down…` always 503; `/fail…` 503 on its first attempt, 200 on the
/// retry; anything else 200.
fn script(r: &Received) -> Action {
    if r.path.starts_with("/down") || (r.path.starts_with("/fail") && r.attempt == Some(1)) {
        Action::Reply(503)
    } else {
        Action::Reply(200)
    }
}

/// Upstreams `api` and `web` over `a` and `b`, one retry each, with
/// `proxy.diagnostics_retained: retained` when given.
fn config(a: &Upstream, b: &Upstream, retained: Option<usize>) -> Config {
    let retries = retries().attempts(1).backoff_base_ms(1).backoff_cap_ms(1);
    let mut config = Config::new()
        .upstream(api(&[a, b]).retries(retries.clone()))
        .upstream(
            UpstreamConfig::new("web")
                .endpoints([a.addr, b.addr])
                .retries(retries),
        );
    if let Some(n) = retained {
        config = config.proxy(ProxyConfig::new().diagnostics_retained(n));
    }
    config
}

/// An admin listener for `proxy`, in this process.
async fn admin(proxy: &Arc<Proxy>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let admin = Admin {
        proxy: Arc::clone(proxy),
        set_log_level: None,
        health_only: false,
    };
    tokio::spawn(serve_admin(listener, admin));
    addr
}

/// `GET /diagnostics{query}`: its status and body.
async fn diagnostics(admin: SocketAddr, query: &str) -> (u16, String) {
    let r = client::get(admin, "admin", &format!("/diagnostics{query}"))
        .await
        .expect("an answer");
    (r.status, r.text())
}

/// The entries `GET /diagnostics{query}` lists.
async fn entries(admin: SocketAddr, query: &str) -> Vec<Value> {
    let (status, body) = diagnostics(admin, query).await;
    assert_eq!(status, 200, "{body}");
    let page: Value = serde_json::from_str(&body).expect("JSON");
    page["requests"]
        .as_array()
        .expect("a requests list")
        .clone()
}

fn paths(entries: &[Value]) -> Vec<&str> {
    entries
        .iter()
        .map(|e| e["path"].as_str().expect("path"))
        .collect()
}

#[tokio::test]
async fn retried_and_failed_requests_are_listed_newest_first_with_their_attempts() {
    let (a, b) = (Upstream::start(script).await, Upstream::start(script).await);
    let sidecar = Sidecar::start(config(&a, &b, None)).await;
    let admin = admin(&sidecar.proxy).await;
    let send = |host: &'static str, path: &'static str| sidecar.send("GET", host, path, b"");
    assert_eq!(send("api", "/ok").await.status, 200);
    assert_eq!(send("api", "/fail/1?token=secret").await.status, 200);
    assert_eq!(send("api", "/down").await.status, 503);
    assert_eq!(send("web", "/fail/2").await.status, 200);

    let all = entries(admin, "").await;
    assert_eq!(paths(&all), ["/fail/2", "/down", "/fail/1"], "not /ok");
    let recovered = &all[2];
    assert_eq!(recovered["upstream"], "api");
    assert_eq!(recovered["rule"], "upstream");
    assert_eq!(recovered["method"], "GET");
    assert_eq!(recovered["status"], 200);
    assert_eq!(recovered["outcome"], "recovered");
    assert_eq!(recovered["reason"], "");
    assert_eq!(recovered["trace_id"], "", "tracing is off");
    assert!(
        recovered["time"]
            .as_str()
            .is_some_and(|t| t.len() == 27 && t.ends_with('Z') && t.as_bytes()[10] == b'T'),
        "{recovered}"
    );
    let attempts = recovered["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{recovered}");
    assert_eq!(attempts[0]["error"], "upstream_status_503");
    assert_eq!(attempts[1]["error"], Value::Null, "the one that answered");
    let endpoints: Vec<&str> = attempts
        .iter()
        .map(|a| a["endpoint"].as_str().expect("endpoint"))
        .collect();
    let mut servers = [a.addr.to_string(), b.addr.to_string()];
    servers.sort();
    let mut seen = [endpoints[0].to_string(), endpoints[1].to_string()];
    seen.sort();
    assert_eq!(seen, servers, "one attempt to each server");
    assert!(attempts
        .iter()
        .all(|a| a["duration_ms"].as_f64().is_some_and(|ms| ms >= 0.0)));

    let exhausted = &all[1];
    assert_eq!(
        (
            &exhausted["outcome"],
            &exhausted["reason"],
            &exhausted["status"]
        ),
        (
            &Value::from("exhausted"),
            &Value::from("attempts"),
            &Value::from(503)
        )
    );
    let errors: Vec<&Value> = exhausted["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| &a["error"])
        .collect();
    assert_eq!(errors, [&Value::from("upstream_status_503"); 2]);

    // Filters, applied before the limit.
    assert_eq!(
        paths(&entries(admin, "?upstream=api").await),
        ["/down", "/fail/1"]
    );
    assert_eq!(paths(&entries(admin, "?upstream=WEB").await), ["/fail/2"]);
    assert_eq!(
        paths(&entries(admin, "?outcome=recovered").await),
        ["/fail/2", "/fail/1"]
    );
    assert_eq!(
        paths(&entries(admin, "?outcome=recovered&upstream=api&limit=1").await),
        ["/fail/1"]
    );
    assert_eq!(
        paths(&entries(admin, "?limit=2").await),
        ["/fail/2", "/down"]
    );
    assert!(entries(admin, "?outcome=skipped").await.is_empty());
    let (status, body) = diagnostics(admin, "?outcome=ok").await;
    assert_eq!(status, 400);
    assert!(body.contains("recovered, exhausted, skipped"), "{body}");
}

#[tokio::test]
async fn the_ring_keeps_exactly_the_retained_number_under_load() {
    let (a, b) = (Upstream::start(script).await, Upstream::start(script).await);
    let sidecar = Sidecar::start(config(&a, &b, Some(10))).await;
    let admin = admin(&sidecar.proxy).await;
    // 490 in batches of 49 in flight at once, then 10 in order: the ring
    // holds the last 10, newest first.
    for batch in 0..10 {
        let sent = join_all((0..49).map(|i| {
            let path = format!("/fail/load-{batch}-{i}");
            let sidecar = &sidecar;
            async move { sidecar.send("GET", "api", &path, b"").await.status }
        }))
        .await;
        assert!(sent.iter().all(|s| *s == 200), "{sent:?}");
    }
    for i in 0..10 {
        let path = format!("/fail/last-{i}");
        assert_eq!(sidecar.send("GET", "api", &path, b"").await.status, 200);
    }
    assert_eq!(sidecar.outcomes("api", "recovered"), 500);
    let listed = entries(admin, "").await;
    let want: Vec<String> = (0..10).rev().map(|i| format!("/fail/last-{i}")).collect();
    assert_eq!(paths(&listed), want);
    assert!(listed
        .iter()
        .all(|e| e["attempts"].as_array().is_some_and(|a| a.len() == 2)));
}

#[tokio::test]
async fn zero_turns_diagnostics_off_and_records_nothing() {
    let (a, b) = (Upstream::start(script).await, Upstream::start(script).await);
    let sidecar = Sidecar::start(config(&a, &b, Some(0))).await;
    let admin = admin(&sidecar.proxy).await;
    assert_eq!(sidecar.send("GET", "api", "/fail/1", b"").await.status, 200);
    assert_eq!(sidecar.outcomes("api", "recovered"), 1);
    let (status, body) = diagnostics(admin, "").await;
    assert_eq!(status, 404);
    assert!(
        body.contains("diagnostics are off: proxy.diagnostics_retained is 0"),
        "{body}"
    );
    // Turned on by a reload: what happened while off was never kept.
    sidecar.proxy.reload(config(&a, &b, Some(5)).resolve());
    assert!(entries(admin, "").await.is_empty());
    assert_eq!(sidecar.send("GET", "api", "/fail/2", b"").await.status, 200);
    assert_eq!(paths(&entries(admin, "").await), ["/fail/2"]);
}
