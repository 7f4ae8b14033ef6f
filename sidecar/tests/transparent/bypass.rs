//! What the rules capture and what they let by, seen from clients in the app
//! namespace with a plain listener standing in for the sidecar at the
//! redirect port: captured connections land there, excluded ports and CIDRs,
//! loopback, the app's own address and the proxy uid's connections go
//! straight to their destination, and with nothing at the redirect port a
//! captured connection is refused at once.

use std::net::SocketAddr;

use serde_json::Value;

use crate::clients::{probe, probe_as};
use crate::helper::{Helper, Server};
use crate::lab::{lo, lo6, v4, v6, Lab, APP_V4, PROXY_UID};

fn tag(bind: SocketAddr, name: &str) -> Server {
    Server::Tag {
        bind,
        name: name.to_string(),
    }
}

/// What a raw TCP connection to `addr` got: the server's name, or the error.
fn reached(v: &Value) -> String {
    match v["reply"].as_str() {
        Some(r) => r.to_string(),
        None => format!("error {}", v["error"].as_str().unwrap_or("?")),
    }
}

fn connect(lab: &Lab, addr: SocketAddr) -> String {
    reached(&probe(
        lab,
        &["tcp", &addr.ip().to_string(), &addr.port().to_string(), ""],
    ))
}

#[test]
fn captured_connections_reach_the_redirect_port_and_exclusions_bypass_it() {
    let Some(lab) = Lab::new() else { return };
    let _svc = Helper::serve(
        &lab,
        &lab.svc,
        vec![
            tag(v4(20, 5432), "svc 192.0.2.20:5432"),
            tag(v4(20, 53), "svc 192.0.2.20:53"),
            tag(v4(30, 5432), "svc 192.0.2.30:5432"),
            tag(v6(0x20, 5432), "svc [2001:db8::20]:5432"),
        ],
    );
    let _app = Helper::serve(
        &lab,
        &lab.app,
        vec![
            tag(lo(15006), "redirect port (IPv4)"),
            tag(lo6(15006), "redirect port (IPv6)"),
            tag(SocketAddr::from((APP_V4, 7000)), "app's own address"),
            tag(lo(7001), "app's loopback"),
        ],
    );
    lab.install_rules();
    let cases = [
        (v4(20, 5432), "redirect port (IPv4)"),
        (v6(0x20, 5432), "redirect port (IPv6)"),
        (v4(20, 53), "svc 192.0.2.20:53"),
        (v4(30, 5432), "svc 192.0.2.30:5432"),
        (SocketAddr::from((APP_V4, 7000)), "app's own address"),
        (lo(7001), "app's loopback"),
    ];
    for (addr, want) in cases {
        assert_eq!(connect(&lab, addr), want, "a connection to {addr}");
    }
    // The proxy's uid is never captured: its connections to upstreams must
    // not come back to it.
    for (addr, want) in [
        (v4(20, 5432), "svc 192.0.2.20:5432"),
        (v6(0x20, 5432), "svc [2001:db8::20]:5432"),
    ] {
        let got = probe_as(
            &lab,
            PROXY_UID,
            &["tcp", &addr.ip().to_string(), &addr.port().to_string(), ""],
        );
        assert_eq!(reached(&got), want, "uid {PROXY_UID} to {addr}");
    }

    // An include list: only those ports are captured, the rest go direct.
    lab.capture(&[
        "--redirect-port",
        "15006",
        "--proxy-uid",
        &PROXY_UID.to_string(),
        "--include-ports",
        "5432",
    ]);
    assert_eq!(connect(&lab, v4(20, 5432)), "redirect port (IPv4)");
    assert_eq!(connect(&lab, v4(30, 5432)), "redirect port (IPv4)");
    assert_eq!(connect(&lab, v4(20, 53)), "svc 192.0.2.20:53");
}

#[test]
fn a_captured_connection_is_refused_at_once_when_nothing_listens() {
    let Some(lab) = Lab::new() else { return };
    lab.capture(&[
        "--redirect-port",
        "15006",
        "--proxy-uid",
        &PROXY_UID.to_string(),
    ]);
    // 192.0.2.100 and 2001:db8::100 belong to no one: uncaptured, the
    // connect would wait for neighbour discovery (about 3 s) and fail.
    for addr in [v4(100, 80), v6(0x100, 80)] {
        let got = probe(
            &lab,
            &["tcp", &addr.ip().to_string(), &addr.port().to_string(), ""],
        );
        assert_eq!(got["error"], "ConnectionRefusedError", "{addr}: {got}");
        assert_eq!(got["errno"], 111, "ECONNREFUSED: {got}");
        let ms = got["ms"].as_f64().expect("ms");
        eprintln!("{addr}: refused after {ms:.2} ms");
        assert!(ms < 500.0, "{addr}: refused at once, not after {ms} ms");
    }
}
