//! A DNS server on loopback (UDP) whose answers the test sets and changes
//! while it runs: a name's addresses (A and AAAA from one list) with a TTL,
//! a failure (`SERVFAIL`, `NXDOMAIN`), or silence. The machine's resolver is
//! never contacted: the sidecar is pointed here with `proxy.dns_resolvers`.
//! Messages are read and written with hickory's codec; only the serving
//! loop is ours.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

/// What the server answers for one name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// These addresses (the A query gets the IPv4 ones, AAAA the IPv6
    /// ones), valid for `ttl` seconds.
    Addresses { ips: Vec<IpAddr>, ttl: u32 },
    /// `SERVFAIL`.
    ServFail,
    /// `NXDOMAIN`.
    NxDomain,
    /// No answer at all: the client times out.
    Silent,
}

#[derive(Default)]
struct Zone {
    answers: HashMap<String, Answer>,
    queries: HashMap<String, u64>,
}

/// A running DNS server; stops when dropped.
pub struct TestDns {
    /// Where it listens (UDP, 127.0.0.1).
    pub addr: SocketAddr,
    zone: Arc<Mutex<Zone>>,
    task: JoinHandle<()>,
}

impl TestDns {
    /// Starts a server on an ephemeral UDP port of 127.0.0.1 that knows no
    /// name yet (every name is `NXDOMAIN`).
    pub async fn start() -> TestDns {
        let socket = UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind the test DNS server");
        let addr = socket.local_addr().expect("local address");
        let zone = Arc::new(Mutex::new(Zone::default()));
        let task = tokio::spawn(serve(socket, Arc::clone(&zone)));
        TestDns { addr, zone, task }
    }

    /// `name` resolves to `ips`, valid for `ttl` seconds.
    pub fn set(&self, name: &str, ips: &[IpAddr], ttl: u32) {
        self.answer(
            name,
            Answer::Addresses {
                ips: ips.to_vec(),
                ttl,
            },
        );
    }

    /// `name` gets `answer` from now on.
    pub fn answer(&self, name: &str, answer: Answer) {
        lock(&self.zone).answers.insert(fqdn(name), answer);
    }

    /// Queries received for `name` so far (A and AAAA each count).
    pub fn queries(&self, name: &str) -> u64 {
        lock(&self.zone)
            .queries
            .get(&fqdn(name))
            .copied()
            .unwrap_or(0)
    }
}

impl std::fmt::Debug for TestDns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDns").field("addr", &self.addr).finish()
    }
}

impl Drop for TestDns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers each datagram; a datagram that is not a query is ignored.
async fn serve(socket: UdpSocket, zone: Arc<Mutex<Zone>>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
            return;
        };
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        if query.metadata.message_type != MessageType::Query {
            continue;
        }
        let Some(reply) = respond(&query, &zone) else {
            continue;
        };
        if let Ok(bytes) = reply.to_vec() {
            let _ = socket.send_to(&bytes, peer).await;
        }
    }
}

/// The reply to `query`, or `None` to stay silent.
fn respond(query: &Message, zone: &Mutex<Zone>) -> Option<Message> {
    let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.metadata.authoritative = true;
    let mut zone = lock(zone);
    for q in &query.queries {
        reply.add_query(q.clone());
        let name = q.name().to_ascii().to_ascii_lowercase();
        *zone.queries.entry(name.clone()).or_default() += 1;
        match zone.answers.get(&name) {
            Some(Answer::Addresses { ips, ttl }) => {
                for ip in ips {
                    let rdata = match (ip, q.query_type()) {
                        (IpAddr::V4(v4), RecordType::A) => RData::A(A(*v4)),
                        (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(*v6)),
                        _ => continue,
                    };
                    reply.add_answer(Record::from_rdata(q.name().clone(), *ttl, rdata));
                }
            }
            Some(Answer::ServFail) => reply.metadata.response_code = ResponseCode::ServFail,
            Some(Answer::Silent) => return None,
            Some(Answer::NxDomain) | None => reply.metadata.response_code = ResponseCode::NXDomain,
        }
    }
    Some(reply)
}

/// The name as it appears in queries: lowercase, with the root's dot.
fn fqdn(name: &str) -> String {
    let name = name.to_ascii_lowercase();
    if name.ends_with('.') {
        name
    } else {
        format!("{name}.")
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
