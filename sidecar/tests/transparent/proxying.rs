//! The real sidecar (`--transparent 127.0.0.1:15006`, uid 65532) behind the
//! real rules, with clients that know nothing of it: requests to a virtual
//! address are retried across the upstream's endpoints with the app's Host
//! header unchanged, over IPv4 and IPv6, for HTTP/1.1 (Python, Node) and
//! gRPC (grpcio); other TCP passes through byte for byte with half-close;
//! excluded destinations bypass it; its own connections are never captured;
//! and once it stops, captured connections are refused at once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use reprise_testkit::config::{Config, Retries, UpstreamConfig};
use reprise_testkit::prometheus::Metrics;
use reprise_testkit::sidecar::write_temp;
use serde_json::Value;

use crate::clients::{get, grpc, node_fetch, probe};
use crate::helper::{Helper, Server};
use crate::lab::{v4, v6, wait_for, Lab, PROXY_UID};

const BIN: &str = env!("CARGO_BIN_EXE_reprise-sidecar");
const ADMIN: &str = "http://127.0.0.1:15000";
/// Longest the sidecar takes to answer `/ready`.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// The sidecar in the app namespace as uid 65532, once it is ready.
pub fn start_sidecar(lab: &Lab, label: &str, config: Config) -> Helper {
    let path: PathBuf = write_temp(&format!("transparent-{label}"), &config.to_yaml());
    let path = path.to_str().expect("a UTF-8 path").to_string();
    let sidecar = Helper::exec(
        lab,
        &lab.app,
        PROXY_UID,
        &[
            BIN,
            "--config",
            &path,
            "--listen",
            "127.0.0.1:15001",
            "--admin",
            "127.0.0.1:15000",
            "--transparent",
            "127.0.0.1:15006",
        ],
    );
    let ready = wait_for(READY_WITHIN, || {
        let v = probe(lab, &["get", &format!("{ADMIN}/ready")]);
        (v["status"] == 200).then_some(())
    });
    assert!(
        ready.is_some(),
        "the sidecar is ready within {READY_WITHIN:?}:\n{}",
        sidecar.lines().join("\n")
    );
    sidecar
}

/// The sidecar's metrics, parsed.
pub fn metrics(lab: &Lab) -> Metrics {
    let (status, body) = get(lab, &format!("{ADMIN}/metrics"));
    assert_eq!(status, 200);
    Metrics::parse(&body).expect("the metrics parse")
}

/// The sidecar's access log lines.
pub fn access_log(sidecar: &Helper) -> Vec<Value> {
    sidecar
        .lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "reprise::request")
        .collect()
}

/// Asserts the sidecar never refused a captured connection: no loop (its
/// own connections were not captured) and none without a destination.
pub fn assert_no_refusals(m: &Metrics) {
    for reason in ["loop", "no_original_destination"] {
        assert_eq!(
            m.sum("reprise_captured_refused_total", &[("reason", reason)]),
            0.0,
            "refused ({reason})"
        );
    }
}

fn http(bind: SocketAddr, name: &str, status: u16) -> Server {
    Server::Http {
        bind,
        name: name.to_string(),
        status,
    }
}

/// Upstream `name` at `virtual_addr` over a failing and a healthy endpoint,
/// one retry allowed.
pub fn flaky_upstream(
    name: &str,
    virtual_addr: SocketAddr,
    bad: SocketAddr,
    good: SocketAddr,
) -> UpstreamConfig {
    UpstreamConfig::new(name)
        .address(virtual_addr)
        .named_endpoint(bad, "bad")
        .named_endpoint(good, "good")
        .retries(
            Retries::new()
                .attempts(1)
                .budget_min_retries_per_second(1000),
        )
}

/// Each response of a client run: (status, endpoint, host seen upstream).
pub fn answers(v: &Value) -> Vec<(u64, String, String)> {
    v["responses"]
        .as_array()
        .unwrap_or_else(|| panic!("responses: {v}"))
        .iter()
        .map(|r| {
            (
                r["status"].as_u64().unwrap_or(0),
                r["body"]["endpoint"].as_str().unwrap_or("?").to_string(),
                r["body"]["host"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect()
}

/// The virtual-address test over one family: Python with a Host of its own,
/// Node with the URL's; every answer is 200 from the healthy endpoint, the
/// failing one was tried (so the 200s are retries), and both saw the Host
/// the app sent.
fn retried_across_endpoints(
    lab: &Lab,
    virtual_addr: SocketAddr,
    bad: SocketAddr,
    good: SocketAddr,
) {
    let svc = Helper::serve(
        lab,
        &lab.svc,
        vec![http(bad, "bad", 503), http(good, "good", 200)],
    );
    lab.install_rules();
    let sidecar = start_sidecar(
        lab,
        &format!("retry-{}", virtual_addr.ip()),
        Config::from(flaky_upstream("api", virtual_addr, bad, good)),
    );
    let host = virtual_addr.ip().to_string();
    let port = virtual_addr.port().to_string();
    let want = |host: &str, n: usize| vec![(200, "good".to_string(), host.to_string()); n];

    // Python: eight connections, each with a Host naming no upstream. Until
    // the failing endpoint has failed once the two cost the same and the
    // first attempt's pick is a coin toss, so it is tried unless 12 tosses
    // (8 here, 4 from Node) all miss it: 1 in 4096.
    let py = probe(
        lab,
        &["http", &host, &port, "/python", "shop.example.test", "8"],
    );
    assert_eq!(
        answers(&py),
        want("shop.example.test", 8),
        "{py}\nthe sidecar's log:\n{}",
        sidecar.lines().join("\n")
    );

    // Node's fetch sets Host from the URL; the upstream sees that unchanged
    // (not the endpoint's address).
    let url_host = match virtual_addr {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => format!("[{}]", a.ip()),
    };
    let node_host = if virtual_addr.port() == 80 {
        url_host
    } else {
        format!("{url_host}:{port}")
    };
    if let Some(node) = node_fetch(lab, &format!("http://{node_host}/node"), 4) {
        assert_eq!(answers(&node), want(&node_host, 4), "{node}");
    }

    let hits = svc.hits();
    let bad_hits: Vec<&Value> = hits.iter().filter(|h| h["endpoint"] == "bad").collect();
    assert!(
        !bad_hits.is_empty(),
        "the failing endpoint was tried: {hits:?}\nthe sidecar's log:\n{}",
        sidecar.lines().join("\n")
    );
    for h in &hits {
        assert!(
            h["host"] == "shop.example.test" || h["host"] == node_host.as_str(),
            "every attempt carried the app's Host: {h}"
        );
    }
    let m = metrics(lab);
    let retries = m.sum("reprise_retries_total", &[("upstream", "api")]);
    assert!(
        retries >= bad_hits.len() as f64,
        "a retry per failed attempt ({} failed, {retries} retries)",
        bad_hits.len()
    );
    assert!(
        m.sum(
            "reprise_captured_connections_total",
            &[("protocol", "http1")]
        ) >= 8.0,
        "Python's eight connections were captured"
    );
    assert_no_refusals(&m);
    let recovered: Vec<Value> = wait_for(Duration::from_secs(5), || {
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
    assert_eq!(recovered[0]["attempts"], 2);
    assert_eq!(recovered[0]["endpoints"], "bad,good", "{}", recovered[0]);
}

#[test]
fn http_to_a_virtual_address_is_retried_across_endpoints_with_the_host_unchanged() {
    let Some(lab) = Lab::new() else { return };
    retried_across_endpoints(&lab, v4(100, 80), v4(11, 8080), v4(12, 8080));
}

#[test]
fn ipv6_virtual_address_is_captured_by_ip6tables_and_retried() {
    let Some(lab) = Lab::new() else { return };
    retried_across_endpoints(&lab, v6(0x100, 80), v6(0x11, 8080), v6(0x12, 8080));
}

#[test]
fn grpc_to_a_virtual_address_is_retried() {
    let Some(lab) = Lab::new() else { return };
    let target = v4(101, 50051);
    let svc = Helper::serve(
        &lab,
        &lab.svc,
        vec![Server::Grpc {
            bind: v4(13, 50051),
            name: "g13".into(),
            fail: 1,
        }],
    );
    lab.install_rules();
    // gRPC calls are POSTs: retried only with the body kept for replay.
    let upstream = UpstreamConfig::new("echo")
        .address(target)
        .endpoint(v4(13, 50051))
        .h2c()
        .retries(
            Retries::new()
                .attempts(1)
                .retry_post(true)
                .buffer_max_bytes(64 * 1024)
                .reuse_endpoints(true)
                .budget_min_retries_per_second(1000),
        );
    let _sidecar = start_sidecar(&lab, "grpc", Config::from(upstream));
    let Some(results) = grpc(&lab, &target.to_string(), "Say", 3) else {
        return;
    };
    let got: Vec<(&str, &str)> = results
        .iter()
        .map(|r| {
            (
                r["code"].as_str().unwrap_or("?"),
                r["messages"][0].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("OK", "hi 0 from g13"),
            ("OK", "hi 1 from g13"),
            ("OK", "hi 2 from g13")
        ],
        "the first call's UNAVAILABLE was retried"
    );
    assert_eq!(
        svc.hits().len(),
        4,
        "three calls and one retry reached the server"
    );
    let m = metrics(&lab);
    assert_eq!(m.sum("reprise_retries_total", &[("upstream", "echo")]), 1.0);
    assert!(m.sum("reprise_captured_connections_total", &[("protocol", "h2c")]) >= 1.0);
    assert_no_refusals(&m);
}

#[test]
fn opaque_tcp_passes_through_with_half_close_and_exclusions_bypass_the_sidecar() {
    let Some(lab) = Lab::new() else { return };
    let svc = Helper::serve(
        &lab,
        &lab.svc,
        vec![
            Server::Echo {
                bind: v4(20, 5432),
                name: "echo4".into(),
            },
            Server::Echo {
                bind: v6(0x20, 5432),
                name: "echo6".into(),
            },
            Server::Tag {
                bind: v4(20, 5433),
                name: "server speaks first".into(),
            },
            Server::Tag {
                bind: v4(20, 53),
                name: "excluded port".into(),
            },
            Server::Tag {
                bind: v4(30, 5432),
                name: "excluded cidr".into(),
            },
        ],
    );
    lab.install_rules();
    // No upstream has these addresses: everything here is opaque.
    let api = UpstreamConfig::new("api")
        .address(v4(100, 80))
        .endpoint(v4(11, 8080));
    let _sidecar = start_sidecar(&lab, "opaque", Config::from(api));

    // 20 000 bytes: more than one segment and one read, echoed after the
    // client's FIN (the server reads to EOF first), so the reply arriving
    // at all shows the half-close went through and the return path stayed
    // open.
    let data: String = (0..20_000u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let mut sent = 0.0;
    let mut received = 0.0;
    for (addr, name) in [(v4(20, 5432), "echo4"), (v6(0x20, 5432), "echo6")] {
        let got = probe(
            &lab,
            &[
                "tcp",
                &addr.ip().to_string(),
                &addr.port().to_string(),
                &data,
            ],
        );
        let want = format!("{name} got 20000 bytes: {data}");
        assert_eq!(
            got["reply"].as_str(),
            Some(want.as_str()),
            "{addr}: {}",
            got["error"]
        );
        sent += data.len() as f64;
        received += want.len() as f64;
    }
    // A server-first protocol: nothing is waited for before relaying.
    let first = probe(&lab, &["tcp", "192.0.2.20", "5433", ""]);
    assert_eq!(first["reply"], "server speaks first", "{first}");
    let m = metrics(&lab);
    assert_eq!(
        m.sum(
            "reprise_captured_connections_total",
            &[("protocol", "opaque")]
        ),
        3.0
    );
    assert_eq!(
        m.sum("reprise_opaque_bytes_total", &[("direction", "sent")]),
        sent
    );
    assert_eq!(
        m.sum("reprise_opaque_bytes_total", &[("direction", "received")]),
        received + "server speaks first".len() as f64
    );
    // The sidecar dialled from the app namespace's address: its connections
    // left directly, not back into the listener.
    for h in svc.hits().iter().filter(|h| h["endpoint"] == "echo4") {
        assert!(
            h["peer"]
                .as_str()
                .is_some_and(|p| p.starts_with("192.0.2.1:")),
            "{h}"
        );
    }
    assert_no_refusals(&m);

    // Excluded port and CIDR: straight to the server, not counted by the
    // sidecar.
    for (addr, want) in [
        (v4(20, 53), "excluded port"),
        (v4(30, 5432), "excluded cidr"),
    ] {
        let got = probe(
            &lab,
            &["tcp", &addr.ip().to_string(), &addr.port().to_string(), ""],
        );
        assert_eq!(got["reply"], want, "{addr}: {got}");
    }
    let after = metrics(&lab);
    assert_eq!(
        after.sum("reprise_captured_connections_total", &[]),
        m.sum("reprise_captured_connections_total", &[]),
        "the excluded connections never reached the sidecar"
    );
}

#[test]
fn once_the_sidecar_stops_captured_connections_are_refused_at_once() {
    let Some(lab) = Lab::new() else { return };
    let _svc = Helper::serve(&lab, &lab.svc, vec![http(v4(11, 8080), "e11", 200)]);
    lab.install_rules();
    let api = UpstreamConfig::new("api")
        .address(v4(100, 80))
        .endpoint(v4(11, 8080));
    let mut sidecar = start_sidecar(&lab, "stop", Config::from(api));
    let ok = probe(&lab, &["http", "192.0.2.100", "80", "/", "api", "1"]);
    assert_eq!(answers(&ok)[0].0, 200, "{ok}");

    let pid = sidecar.pid().to_string();
    crate::lab::run(std::process::Command::new("kill").args(["-KILL", &pid]));
    assert!(
        sidecar.wait(Duration::from_secs(10)).is_some(),
        "the sidecar exited"
    );
    for addr in [v4(100, 80), v6(0x100, 80)] {
        let got = probe(
            &lab,
            &["tcp", &addr.ip().to_string(), &addr.port().to_string(), ""],
        );
        assert_eq!(got["error"], "ConnectionRefusedError", "{addr}: {got}");
        let ms = got["ms"].as_f64().expect("ms");
        eprintln!("{addr} with the sidecar stopped: refused after {ms:.2} ms");
        assert!(ms < 500.0, "refused at once, not after {ms} ms");
    }
    let http = probe(&lab, &["http", "192.0.2.100", "80", "/", "api", "1"]);
    assert_eq!(http["error"], "ConnectionRefusedError", "{http}");
}
