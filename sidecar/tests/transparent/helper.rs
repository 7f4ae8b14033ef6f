//! Processes inside a lab namespace: this test binary run again there
//! (`ip netns exec NS <this binary> helper::in_namespace --exact --ignored`)
//! with its role in `REPRISE_NETNS_ROLE`:
//!
//! - **serve**: the servers listed, on namespace addresses, until its stdin
//!   closes (the parent's end of the pipe: a parent that dies takes its
//!   servers with it) or [`LIFETIME`] passes. It prints `REPRISE-HELPER
//!   ready` once every server listens, and one `REPRISE-HELPER hit {json}`
//!   line per request or connection served, naming the server.
//! - **exec**: becomes `argv` as `uid` (gid the same, no supplementary
//!   groups) through `CommandExt::uid`/`gid` and `exec`: same process, so
//!   its pid is the child's and stopping it stops the program.
//!
//! Without the variable (`cargo test -- --ignored` on its own), the test
//! does nothing.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use reprise_testkit::grpc::{GrpcAction, GrpcServer};
use reprise_testkit::tls::{FrontSettings, Issued, TlsFront};
use reprise_testkit::upstream::{Action, Upstream};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::lab::{wait_for, Lab};

const ROLE: &str = "REPRISE_NETNS_ROLE";
const MARK: &str = "REPRISE-HELPER ";
/// Longest a serving helper lives.
pub const LIFETIME: Duration = Duration::from_secs(600);
/// Longest a helper takes to listen.
const READY_WITHIN: Duration = Duration::from_secs(20);
/// An echo connection reads at most this much, for at most [`ECHO_READ`].
const ECHO_MAX: u64 = 1 << 20;
const ECHO_READ: Duration = Duration::from_secs(10);
/// How often a TLS server looks at its handshake count.
const HANDSHAKE_POLL: Duration = Duration::from_millis(20);

/// One server of a serving helper.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Server {
    /// HTTP/1.1 and h2c (the test kit's upstream): answers `status` with
    /// `{"endpoint": NAME, "host": the Host (or :authority) it saw, "path"}`.
    Http {
        /// Where it listens.
        bind: SocketAddr,
        /// What it calls itself.
        name: String,
        /// The status of every answer.
        status: u16,
    },
    /// HTTPS: a [`Server::Http`] named `name` answering `status` on a
    /// loopback port, behind the test kit's TLS front on `bind` presenting
    /// `cert_pem` (PEM, with its key `key_pem`). Besides the HTTP server's
    /// hits it reports `{"endpoint": NAME, "handshakes": N}` each time its
    /// count of completed handshakes changes.
    Tls {
        /// Where the front listens.
        bind: SocketAddr,
        /// What it calls itself.
        name: String,
        /// The status of every answer.
        status: u16,
        /// The certificate it presents.
        cert_pem: String,
        /// That certificate's key.
        key_pem: String,
    },
    /// Raw TCP: reads until the client's FIN, then answers `NAME got N
    /// bytes: DATA` and closes.
    Echo {
        /// Where it listens.
        bind: SocketAddr,
        /// What it calls itself.
        name: String,
    },
    /// Raw TCP: writes `NAME` at once and closes.
    Tag {
        /// Where it listens.
        bind: SocketAddr,
        /// What it calls itself.
        name: String,
    },
    /// gRPC (the test kit's tonic server): the first `fail` calls get
    /// UNAVAILABLE (Trailers-Only), the rest an answer naming the server.
    Grpc {
        /// Where it listens.
        bind: SocketAddr,
        /// What it calls itself.
        name: String,
        /// How many calls fail first.
        fail: usize,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
enum Role {
    Serve { servers: Vec<Server> },
    Exec { uid: u32, argv: Vec<String> },
}

/// A helper process and the lines it printed.
#[derive(Debug)]
pub struct Helper {
    child: Child,
    /// Held open: the helper serves until it closes.
    _stdin: Option<ChildStdin>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Helper {
    fn spawn(lab: &Lab, ns: &str, role: &Role) -> Helper {
        let exe = std::env::current_exe().expect("this test binary");
        let mut child = lab
            .command(ns, exe)
            .args([
                "helper::in_namespace",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .args(["--test-threads", "1"])
            .env(ROLE, serde_json::to_string(role).expect("a role is JSON"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a helper in the namespace");
        let stdout = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
            }
        });
        Helper {
            _stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    /// Starts `servers` in namespace `ns`; returns once they all listen.
    pub fn serve(lab: &Lab, ns: &str, servers: Vec<Server>) -> Helper {
        let mut helper = Helper::spawn(lab, ns, &Role::Serve { servers });
        let ready = wait_for(READY_WITHIN, || {
            if let Ok(Some(status)) = helper.child.try_wait() {
                panic!("the serving helper exited early ({status})");
            }
            helper.marked().iter().any(|l| l == "ready").then_some(())
        });
        assert!(
            ready.is_some(),
            "the servers listen within {READY_WITHIN:?}"
        );
        helper
    }

    /// Runs `argv` in namespace `ns` as `uid` (and gid `uid`).
    pub fn exec(lab: &Lab, ns: &str, uid: u32, argv: &[&str]) -> Helper {
        let argv = argv.iter().map(|s| (*s).to_string()).collect();
        Helper::spawn(lab, ns, &Role::Exec { uid, argv })
    }

    /// What follows the marker on each marked line (libtest may print its
    /// `test ... ` prefix on the same line first).
    fn marked(&self) -> Vec<String> {
        self.lines()
            .iter()
            .filter_map(|l| l.find(MARK).map(|i| l[i + MARK.len()..].to_string()))
            .collect()
    }

    /// Every line printed so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The hits reported so far, in order.
    pub fn hits(&self) -> Vec<Value> {
        self.marked()
            .iter()
            .filter_map(|l| l.strip_prefix("hit "))
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The handshakes TLS server `name` has reported completing so far.
    pub fn handshakes(&self, name: &str) -> u64 {
        self.hits()
            .iter()
            .filter(|h| h["endpoint"] == name)
            .filter_map(|h| h["handshakes"].as_u64())
            .max()
            .unwrap_or(0)
    }

    /// The process id (that of the program, for an exec helper).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits, bounded, for the process to end; its exit status.
    pub fn wait(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        wait_for(within, || self.child.try_wait().ok().flatten())
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hit(value: &Value) {
    println!("{MARK}hit {value}");
    let _ = std::io::stdout().flush();
}

/// Starts `server`; the test kit's upstream stops when dropped, so it is
/// returned to be kept.
async fn start(server: Server) -> Option<Upstream> {
    match server {
        Server::Http { bind, name, status } => {
            return Some(http(bind, name, status).await);
        }
        Server::Tls {
            bind,
            name,
            status,
            cert_pem,
            key_pem,
        } => {
            let backend = http(SocketAddr::from(([127, 0, 0, 1], 0)), name.clone(), status).await;
            let identity = Issued {
                cert_pem,
                key_pem,
                // Only the PEM is read.
                cert_file: PathBuf::new(),
                key_file: PathBuf::new(),
            };
            let front = TlsFront::start_on(bind, backend.addr, FrontSettings::new(identity)).await;
            // The front counts in this process; the test reads hits.
            tokio::spawn(async move {
                let _backend = backend;
                let mut seen = 0;
                loop {
                    let n = front.handshakes();
                    if n != seen {
                        seen = n;
                        hit(&json!({"endpoint": name, "handshakes": n}));
                    }
                    tokio::time::sleep(HANDSHAKE_POLL).await;
                }
            });
        }
        Server::Echo { bind, name } => {
            raw(bind, move |mut conn, peer| {
                let name = name.clone();
                async move {
                    let mut data = Vec::new();
                    let mut limited = (&mut conn).take(ECHO_MAX);
                    let read = limited.read_to_end(&mut data);
                    if tokio::time::timeout(ECHO_READ, read).await.is_err() {
                        return;
                    }
                    let text = String::from_utf8_lossy(&data);
                    hit(&json!({"endpoint": name, "peer": peer.to_string(), "got": text}));
                    let reply = format!("{name} got {} bytes: {text}", data.len());
                    let _ = conn.write_all(reply.as_bytes()).await;
                    let _ = conn.shutdown().await;
                }
            })
            .await;
        }
        Server::Tag { bind, name } => {
            raw(bind, move |mut conn, peer| {
                let name = name.clone();
                async move {
                    hit(&json!({"endpoint": name, "peer": peer.to_string()}));
                    let _ = conn.write_all(name.as_bytes()).await;
                    let _ = conn.shutdown().await;
                }
            })
            .await;
        }
        Server::Grpc { bind, name, fail } => {
            let me = name.clone();
            GrpcServer::start_on(bind, &name, move |n| {
                hit(&json!({"endpoint": me, "call": n}));
                if n < fail {
                    GrpcAction::TrailersOnly(tonic::Code::Unavailable, None)
                } else {
                    GrpcAction::Ok
                }
            })
            .await;
        }
    }
    None
}

/// The test kit's upstream on `bind`, answering `status` with a body that
/// names it and what it saw.
async fn http(bind: SocketAddr, name: String, status: u16) -> Upstream {
    Upstream::builder()
        .bind(bind)
        .start(move |r| {
            let host = r
                .header("host")
                .map(str::to_string)
                .or_else(|| r.authority.clone())
                .unwrap_or_default();
            let body = json!({"endpoint": name, "host": host, "path": r.path});
            hit(&body);
            Action::ReplyWith(
                status,
                vec![("content-type", "application/json".to_string())],
                body.to_string().into(),
            )
        })
        .await
        .unwrap_or_else(|e| panic!("listen on {bind}: {e}"))
}

/// Accepts on `bind` and runs `serve` for each connection.
async fn raw<F, Fut>(bind: SocketAddr, serve: F)
where
    F: Fn(tokio::net::TcpStream, SocketAddr) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .unwrap_or_else(|e| panic!("listen on {bind}: {e}"));
    tokio::spawn(async move {
        // Bounded: no test opens this many connections.
        for _ in 0..100_000 {
            let Ok((conn, peer)) = listener.accept().await else {
                return;
            };
            tokio::spawn(serve(conn, peer));
        }
    });
}

#[test]
#[ignore = "a helper: run by the other tests inside a network namespace"]
fn in_namespace() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match serde_json::from_str::<Role>(&role).expect("a role") {
        Role::Exec { uid, argv } => {
            // Ends libtest's `test ... ` line, so the program's first line
            // of output is a line of its own.
            println!();
            let _ = std::io::stdout().flush();
            let e = Command::new(&argv[0])
                .args(&argv[1..])
                .uid(uid)
                .gid(uid)
                .exec();
            panic!("exec {argv:?} as uid {uid}: {e}");
        }
        Role::Serve { servers } => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime");
            let _kept: Vec<Upstream> = runtime.block_on(async {
                let mut kept = Vec::new();
                for s in servers {
                    kept.extend(start(s).await);
                }
                kept
            });
            println!("{MARK}ready");
            let _ = std::io::stdout().flush();
            let (done, wait) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = std::io::stdin().read_to_end(&mut Vec::new());
                let _ = done.send(());
            });
            let _ = wait.recv_timeout(LIFETIME);
        }
    }
}
