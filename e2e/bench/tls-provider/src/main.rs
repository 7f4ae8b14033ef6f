//! The client side of TLS with rustls' ring and aws-lc-rs providers, as the
//! sidecar originates it towards an upstream: full TLS 1.3 handshakes
//! (ECDSA P-256 and RSA-2048 chains), resumed ones, and record protection
//! for a keep-alive connection (16 KiB records each way, and a small
//! request/response exchange).
//!
//! Client and server run in this one thread over memory buffers, with no
//! sockets; only the client's calls are timed, in CPU time of the thread
//! (CLOCK_THREAD_CPUTIME_ID), so the server's work (its signature, above
//! all with RSA) and the machine's other load count for little. The server
//! uses ring in every case but `aws-lc-rs+pq`, so only the client's provider
//! changes between the two columns.
//!
//! Rounds alternate the providers (ring first in odd rounds, aws-lc-rs first
//! in even ones); each line prints the median over rounds of each provider
//! and the aws-lc-rs / ring ratio of every round.
//!
//!     reprise-bench-tls-provider CERT_DIR [ROUNDS] [SCALE]
//!
//! CERT_DIR holds ecdsa-ca.pem, ecdsa.pem, ecdsa.key, rsa-ca.pem, rsa.pem,
//! rsa.key for `upstream.bench` (run.sh makes them with the openssl CLI, as
//! e2e/bench/bench.py's scenario 8 does). SCALE multiplies the iterations.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustls::client::Resumption;
use rustls::crypto::{aws_lc_rs, ring, CryptoProvider, SupportedKxGroup};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{
    ClientConfig, ClientConnection, HandshakeKind, RootCertStore, ServerConfig, ServerConnection,
    SupportedCipherSuite,
};

const NAME: &str = "upstream.bench";

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the one given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What an empty interval measures: the clock's own cost inside each
/// interval, taken off every interval timed (set once, by `calibrate`).
static CLOCK_NS: AtomicU64 = AtomicU64::new(0);

/// The median of 20,001 empty intervals, in ns.
fn calibrate() -> u64 {
    let mut v: Vec<u64> = (0..20_001)
        .map(|_| {
            let t0 = thread_cpu_ns();
            thread_cpu_ns() - t0
        })
        .collect();
    v.sort_unstable();
    let ns = v[v.len() / 2];
    CLOCK_NS.store(ns, Ordering::Relaxed);
    ns
}

/// The client's share of the CPU time.
#[derive(Default)]
struct Clock {
    ns: u64,
    intervals: u64,
}

impl Clock {
    fn time<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let t0 = thread_cpu_ns();
        let r = f();
        self.ns += thread_cpu_ns() - t0;
        self.intervals += 1;
        r
    }

    /// The time measured, less the clock's own share.
    fn client_ns(&self) -> u64 {
        self.ns
            .saturating_sub(self.intervals * CLOCK_NS.load(Ordering::Relaxed))
    }
}

/// What the client has queued, delivered to the server (client's side timed).
fn to_server(
    c: &mut ClientConnection,
    s: &mut ServerConnection,
    clock: &mut Clock,
    buf: &mut Vec<u8>,
) {
    buf.clear();
    clock.time(|| {
        while c.wants_write() {
            c.write_tls(buf).expect("client write_tls");
        }
    });
    let mut rd = &buf[..];
    while !rd.is_empty() {
        s.read_tls(&mut rd).expect("server read_tls");
        s.process_new_packets().expect("server process");
    }
}

/// What the server has queued, delivered to the client (client's side timed).
fn to_client(
    c: &mut ClientConnection,
    s: &mut ServerConnection,
    clock: &mut Clock,
    buf: &mut Vec<u8>,
) {
    buf.clear();
    while s.wants_write() {
        s.write_tls(buf).expect("server write_tls");
    }
    clock.time(|| {
        let mut rd = &buf[..];
        while !rd.is_empty() {
            c.read_tls(&mut rd).expect("client read_tls");
            c.process_new_packets().expect("client process");
        }
    });
}

/// One handshake, and the tickets the server sends after it.
fn handshake(
    cc: &Arc<ClientConfig>,
    sc: &Arc<ServerConfig>,
    clock: &mut Clock,
    buf: &mut Vec<u8>,
) -> (ClientConnection, ServerConnection) {
    let name = ServerName::try_from(NAME).expect("name");
    let mut c = clock.time(|| ClientConnection::new(Arc::clone(cc), name).expect("client"));
    let mut s = ServerConnection::new(Arc::clone(sc)).expect("server");
    while c.is_handshaking() || s.is_handshaking() || s.wants_write() || c.wants_write() {
        to_server(&mut c, &mut s, clock, buf);
        to_client(&mut c, &mut s, clock, buf);
    }
    (c, s)
}

struct Material {
    roots: RootCertStore,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

fn material(dir: &Path, kind: &str) -> Material {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(dir.join(format!("{kind}-ca.pem"))).expect("ca") {
        roots.add(cert.expect("ca cert")).expect("add root");
    }
    let chain = CertificateDer::pem_file_iter(dir.join(format!("{kind}.pem")))
        .expect("chain")
        .collect::<Result<Vec<_>, _>>()
        .expect("chain certs");
    let key = PrivateKeyDer::from_pem_file(dir.join(format!("{kind}.key"))).expect("key");
    Material { roots, chain, key }
}

/// The sidecar's client configuration (balance/client/tls.rs): the provider,
/// safe default versions, the upstream's CA, no client certificate,
/// HTTP/1.1 in ALPN.
fn client_config(
    provider: CryptoProvider,
    m: &Material,
    resumption: Resumption,
) -> Arc<ClientConfig> {
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(m.roots.clone())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.resumption = resumption;
    Arc::new(config)
}

fn server_config(provider: CryptoProvider, m: &Material, tickets: usize) -> Arc<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(m.chain.clone(), m.key.clone_key())
        .expect("server cert");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.send_tls13_tickets = tickets;
    Arc::new(config)
}

fn with_suite(mut p: CryptoProvider, suite: SupportedCipherSuite) -> CryptoProvider {
    p.cipher_suites = vec![suite];
    p
}

/// aws-lc-rs as rustls' `prefer-post-quantum` feature orders its groups.
fn aws_pq() -> CryptoProvider {
    let mut p = aws_lc_rs::default_provider();
    let pq: &'static dyn SupportedKxGroup = aws_lc_rs::kx_group::X25519MLKEM768;
    p.kx_groups.retain(|g| g.name() != pq.name());
    p.kx_groups.insert(0, pq);
    p
}

#[derive(Clone, Copy, PartialEq)]
enum Who {
    Ring,
    Aws,
    AwsPq,
}

impl Who {
    fn label(self) -> &'static str {
        match self {
            Who::Ring => "ring",
            Who::Aws => "aws-lc-rs",
            Who::AwsPq => "aws-lc-rs+pq",
        }
    }
    fn provider(self) -> CryptoProvider {
        match self {
            Who::Ring => ring::default_provider(),
            Who::Aws => aws_lc_rs::default_provider(),
            Who::AwsPq => aws_pq(),
        }
    }
    /// The server's provider: ring, but for the post-quantum group.
    fn server_provider(self) -> CryptoProvider {
        match self {
            Who::AwsPq => aws_lc_rs::default_provider(),
            _ => ring::default_provider(),
        }
    }
}

/// One line of the table.
struct Test {
    name: String,
    /// What one iteration is, in µs.
    unit: &'static str,
    iterations: usize,
    /// Runs `n` iterations with a provider; the client's CPU ns.
    run: Box<dyn Fn(Who, usize) -> u64>,
    /// Bytes per iteration (MB/s is printed too) or 0.
    bytes: usize,
    /// The providers compared, ring first and aws-lc-rs second.
    who: Vec<Who>,
}

fn full_handshakes(m: Arc<Material>) -> Box<dyn Fn(Who, usize) -> u64> {
    Box::new(move |who, n| {
        let cc = client_config(who.provider(), &m, Resumption::disabled());
        let sc = server_config(who.server_provider(), &m, 0);
        let mut clock = Clock::default();
        let mut buf = Vec::with_capacity(1 << 16);
        for _ in 0..n {
            let (c, _) = handshake(&cc, &sc, &mut clock, &mut buf);
            debug_assert_eq!(c.handshake_kind(), Some(HandshakeKind::Full));
        }
        clock.client_ns()
    })
}

fn resumed_handshakes(m: Arc<Material>) -> Box<dyn Fn(Who, usize) -> u64> {
    Box::new(move |who, n| {
        let cc = client_config(who.provider(), &m, Resumption::in_memory_sessions(256));
        let sc = server_config(who.server_provider(), &m, 2);
        let mut buf = Vec::with_capacity(1 << 16);
        // The first one full, for a ticket; each resumed one brings two more.
        handshake(&cc, &sc, &mut Clock::default(), &mut buf);
        let mut clock = Clock::default();
        for _ in 0..n {
            let (c, _) = handshake(&cc, &sc, &mut clock, &mut buf);
            assert_eq!(c.handshake_kind(), Some(HandshakeKind::Resumed), "resumed");
        }
        clock.client_ns()
    })
}

/// A connection with `suite` and the client's side of `n` exchanges, timed
/// `batch` at a time: `up` bytes client to server, encrypted and sent,
/// `down` bytes server to client (encrypted by the server, untimed), received
/// and decrypted. With a batch of 1 the server reads each request before it
/// answers, so its work comes between the client's as in a real exchange;
/// with more, the client's records go nowhere and its work runs back to
/// back (the crypto's throughput with warm caches).
fn exchanges(
    m: Arc<Material>,
    suite: fn(Who) -> SupportedCipherSuite,
    up: usize,
    down: usize,
    batch: usize,
) -> Box<dyn Fn(Who, usize) -> u64> {
    Box::new(move |who, n| {
        let cs = suite(who);
        let ss = if who == Who::AwsPq {
            cs
        } else {
            suite(Who::Ring)
        };
        let cc = client_config(with_suite(who.provider(), cs), &m, Resumption::disabled());
        let sc = server_config(with_suite(who.server_provider(), ss), &m, 0);
        let mut buf = Vec::with_capacity(batch * (down + 64) + 4096);
        let (mut c, mut s) = handshake(&cc, &sc, &mut Clock::default(), &mut buf);
        assert_eq!(
            c.negotiated_cipher_suite().map(|s| s.suite()),
            Some(cs.suite())
        );
        let request = vec![0x61u8; up];
        let response = vec![0x62u8; down];
        let mut out = Vec::with_capacity(up + 4096);
        let mut got = vec![0u8; 1 << 16];
        let mut clock = Clock::default();
        let mut done = 0;
        while done < n {
            let k = batch.min(n - done);
            if up > 0 {
                clock.time(|| {
                    for _ in 0..k {
                        c.writer().write_all(&request).expect("client write");
                        out.clear();
                        while c.wants_write() {
                            c.write_tls(&mut out).expect("client write_tls");
                        }
                    }
                });
                if batch == 1 {
                    let mut rd = &out[..];
                    let mut left = up;
                    while left > 0 {
                        if !rd.is_empty() {
                            s.read_tls(&mut rd).expect("server read_tls");
                        }
                        s.process_new_packets().expect("server process");
                        match s.reader().read(&mut got) {
                            Ok(r) => left -= r,
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(e) => panic!("server read: {e}"),
                        }
                    }
                }
            }
            if down > 0 {
                buf.clear();
                for _ in 0..k {
                    s.writer().write_all(&response).expect("server write");
                    while s.wants_write() {
                        s.write_tls(&mut buf).expect("server write_tls");
                    }
                }
                clock.time(|| {
                    let mut rd = &buf[..];
                    let mut left = k * down;
                    while left > 0 {
                        if !rd.is_empty() {
                            c.read_tls(&mut rd).expect("client read_tls");
                        }
                        c.process_new_packets().expect("client process");
                        loop {
                            match c.reader().read(&mut got) {
                                Ok(0) => break,
                                Ok(r) => left -= r,
                                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                                Err(e) => panic!("client read: {e}"),
                            }
                        }
                    }
                    assert!(rd.is_empty(), "all records read");
                });
            }
            done += k;
        }
        clock.client_ns()
    })
}

fn aes128(who: Who) -> SupportedCipherSuite {
    match who {
        Who::Ring => ring::cipher_suite::TLS13_AES_128_GCM_SHA256,
        _ => aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256,
    }
}
fn aes256(who: Who) -> SupportedCipherSuite {
    match who {
        Who::Ring => ring::cipher_suite::TLS13_AES_256_GCM_SHA384,
        _ => aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384,
    }
}
fn chacha(who: Who) -> SupportedCipherSuite {
    match who {
        Who::Ring => ring::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        _ => aws_lc_rs::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// What each provider negotiates with the bench's server (printed once).
fn negotiated(m: &Arc<Material>, who: Who) -> String {
    let cc = client_config(who.provider(), m, Resumption::disabled());
    let sc = server_config(who.server_provider(), m, 0);
    let (c, _) = handshake(&cc, &sc, &mut Clock::default(), &mut Vec::new());
    format!(
        "{}: {:?}, {:?}, {:?}",
        who.label(),
        c.protocol_version().expect("version"),
        c.negotiated_cipher_suite().expect("suite").suite(),
        c.negotiated_key_exchange_group().expect("group").name(),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = Path::new(args.get(1).map(String::as_str).unwrap_or_else(|| {
        eprintln!("usage: reprise-bench-tls-provider CERT_DIR [ROUNDS] [SCALE]");
        std::process::exit(2)
    }));
    let rounds: usize = args.get(2).map_or(7, |r| r.parse().expect("rounds"));
    let scale: f64 = args.get(3).map_or(1.0, |s| s.parse().expect("scale"));
    let it = |n: usize| ((n as f64 * scale) as usize).max(1);

    let ecdsa = Arc::new(material(dir, "ecdsa"));
    let rsa = Arc::new(material(dir, "rsa"));
    let both = vec![Who::Ring, Who::Aws];
    for who in [Who::Ring, Who::Aws, Who::AwsPq] {
        println!("negotiated, ECDSA chain, {}", negotiated(&ecdsa, who));
    }
    println!(
        "an empty interval of CLOCK_THREAD_CPUTIME_ID: {} ns (taken off every interval timed)",
        calibrate()
    );

    let tests = vec![
        Test {
            name: "full handshake, ECDSA P-256".into(),
            unit: "µs/handshake",
            iterations: it(2000),
            run: full_handshakes(Arc::clone(&ecdsa)),
            bytes: 0,
            who: vec![Who::Ring, Who::Aws, Who::AwsPq],
        },
        Test {
            name: "full handshake, RSA-2048".into(),
            unit: "µs/handshake",
            iterations: it(2000),
            run: full_handshakes(Arc::clone(&rsa)),
            bytes: 0,
            who: both.clone(),
        },
        Test {
            name: "resumed handshake (ECDSA P-256 server)".into(),
            unit: "µs/handshake",
            iterations: it(4000),
            run: resumed_handshakes(Arc::clone(&ecdsa)),
            bytes: 0,
            who: both.clone(),
        },
        Test {
            name: "send 16 KiB, AES-128-GCM".into(),
            unit: "µs/16 KiB",
            iterations: it(40000),
            run: exchanges(Arc::clone(&ecdsa), aes128, 16384, 0, 64),
            bytes: 16384,
            who: both.clone(),
        },
        Test {
            name: "receive 16 KiB, AES-128-GCM".into(),
            unit: "µs/16 KiB",
            iterations: it(40000),
            run: exchanges(Arc::clone(&ecdsa), aes128, 0, 16384, 64),
            bytes: 16384,
            who: both.clone(),
        },
        Test {
            name: "send 16 KiB, AES-256-GCM".into(),
            unit: "µs/16 KiB",
            iterations: it(40000),
            run: exchanges(Arc::clone(&ecdsa), aes256, 16384, 0, 64),
            bytes: 16384,
            who: both.clone(),
        },
        Test {
            name: "receive 16 KiB, AES-256-GCM".into(),
            unit: "µs/16 KiB",
            iterations: it(40000),
            run: exchanges(Arc::clone(&ecdsa), aes256, 0, 16384, 64),
            bytes: 16384,
            who: both.clone(),
        },
        Test {
            name: "send 16 KiB, ChaCha20-Poly1305".into(),
            unit: "µs/16 KiB",
            iterations: it(40000),
            run: exchanges(Arc::clone(&ecdsa), chacha, 16384, 0, 64),
            bytes: 16384,
            who: both.clone(),
        },
        Test {
            name: "receive 16 KiB, ChaCha20-Poly1305".into(),
            unit: "µs/16 KiB",
            iterations: it(40000),
            run: exchanges(Arc::clone(&ecdsa), chacha, 0, 16384, 64),
            bytes: 16384,
            who: both.clone(),
        },
        Test {
            name: "request 300 B + response 1 KiB, AES-256-GCM, back to back".into(),
            unit: "µs/exchange",
            iterations: it(200000),
            run: exchanges(Arc::clone(&ecdsa), aes256, 300, 1024, 64),
            bytes: 0,
            who: both.clone(),
        },
        Test {
            name: "request 300 B + response 1 KiB, AES-256-GCM, server between".into(),
            unit: "µs/exchange",
            iterations: it(200000),
            run: exchanges(Arc::clone(&ecdsa), aes256, 300, 1024, 1),
            bytes: 0,
            who: both.clone(),
        },
    ];

    // results[test][who] = per-round µs per iteration
    let mut results: Vec<Vec<Vec<f64>>> = tests
        .iter()
        .map(|t| vec![Vec::new(); t.who.len()])
        .collect();
    for r in 0..rounds {
        for (ti, t) in tests.iter().enumerate() {
            let mut order: Vec<usize> = (0..t.who.len()).collect();
            if r % 2 == 1 {
                order.reverse();
            }
            for wi in order {
                let who = t.who[wi];
                // One untimed warm-up tenth, then the measured run.
                (t.run)(who, (t.iterations / 10).max(1));
                let ns = (t.run)(who, t.iterations);
                let us = ns as f64 / 1000.0 / t.iterations as f64;
                results[ti][wi].push(us);
                eprintln!(
                    "round {}/{} {} {}: {:.2} {}",
                    r + 1,
                    rounds,
                    t.name,
                    who.label(),
                    us,
                    t.unit
                );
            }
        }
    }

    println!();
    println!(
        "| test | unit | ring | aws-lc-rs | aws-lc-rs ÷ ring (median) | per round | aws-lc-rs+pq |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (ti, t) in tests.iter().enumerate() {
        let ring_v = &results[ti][0];
        let aws_v = &results[ti][1];
        let ratios: Vec<f64> = ring_v.iter().zip(aws_v).map(|(a, b)| b / a).collect();
        let per_round = ratios
            .iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(" ");
        let mr = median(&mut ring_v.clone());
        let ma = median(&mut aws_v.clone());
        let cell = |us: f64| {
            if t.bytes > 0 {
                format!("{us:.2} ({:.0} MB/s)", t.bytes as f64 / us)
            } else if t.unit == "µs/handshake" {
                format!("{us:.1} ({:.0}/s)", 1e6 / us)
            } else {
                format!("{us:.2}")
            }
        };
        let pq = if t.who.len() > 2 {
            cell(median(&mut results[ti][2].clone()))
        } else {
            "—".into()
        };
        println!(
            "| {} | {} | {} | {} | {:.2}× | {} | {} |",
            t.name,
            t.unit,
            cell(mr),
            cell(ma),
            median(&mut ratios.clone()),
            per_round,
            pq
        );
    }
}
