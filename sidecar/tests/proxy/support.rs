//! Real upstream servers with fault modes, an in-process sidecar, and a client.
//!
//! The upstream is a small HTTP/1.1 server on loopback written against raw
//! sockets, so it can fail the way real servers fail: refuse, reset, close
//! before headers, stall, and abort a body mid-stream. It records every request
//! it received (attempt header and body) so tests can assert what reached it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use reprise_sidecar::Proxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// What an upstream does with one request.
#[derive(Clone, Debug)]
pub enum Action {
    /// Answer with this status and a short body naming the endpoint.
    Reply(u16),
    /// Answer with status, extra headers and body.
    ReplyWith(u16, Vec<(&'static str, String)>, &'static str),
    /// Answer 200 with the request body.
    Echo,
    /// Wait, then answer 200.
    Stall(Duration),
    /// Send headers and part of the body, then reset the connection.
    AbortMidBody,
    /// Reset the connection after reading the request (it reached the upstream).
    Reset,
    /// Close the connection after reading the request, without answering.
    Close,
    /// Half-close after reading the request: send FIN, keep reading (the
    /// socket stays open) until the peer closes or 5 s pass.
    HalfClose,
}

/// One request as the upstream received it.
#[derive(Clone, Debug)]
pub struct Received {
    /// Method.
    #[allow(dead_code)]
    pub method: String,
    /// `x-reprise-attempt`, when present.
    pub attempt: Option<u32>,
    /// The request body.
    pub body: Vec<u8>,
    /// Lower-case header names received.
    pub headers: Vec<(String, String)>,
}

/// A running upstream endpoint.
pub struct Upstream {
    /// Its address.
    pub addr: SocketAddr,
    /// Requests received.
    pub log: Arc<Mutex<Vec<Received>>>,
}

type Script = Arc<dyn Fn(usize) -> Action + Send + Sync>;

impl Upstream {
    /// Starts an upstream whose `n`th request (from 0) gets `script(n)`.
    pub async fn start(script: impl Fn(usize) -> Action + Send + Sync + 'static) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let script: Script = Arc::new(script);
        let counter = Arc::new(AtomicUsize::new(0));
        let log2 = Arc::clone(&log);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (script, counter, log) =
                    (Arc::clone(&script), Arc::clone(&counter), Arc::clone(&log2));
                tokio::spawn(serve_conn(stream, script, counter, log));
            }
        });
        Upstream { addr, log }
    }

    /// An upstream that always does `action`.
    pub async fn always(action: Action) -> Upstream {
        Upstream::start(move |_| action.clone()).await
    }

    /// A port where nothing listens: connections are refused.
    pub async fn refusing() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        Upstream {
            addr,
            log: Arc::default(),
        }
    }

    /// Requests received so far.
    pub fn count(&self) -> usize {
        self.log.lock().expect("log").len()
    }

    /// Requests received so far.
    pub fn received(&self) -> Vec<Received> {
        self.log.lock().expect("log").clone()
    }
}

async fn serve_conn(
    mut stream: TcpStream,
    script: Script,
    counter: Arc<AtomicUsize>,
    log: Arc<Mutex<Vec<Received>>>,
) {
    let mut buf = Vec::with_capacity(4096);
    loop {
        // Read a request head.
        let (head_len, method, content_length, chunked, attempt, headers) = loop {
            let mut hs = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut hs);
            if let Ok(httparse::Status::Complete(n)) = req.parse(&buf) {
                let get = |name: &str| {
                    req.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .map(|h| String::from_utf8_lossy(h.value).to_string())
                };
                let cl = get("content-length").and_then(|v| v.parse::<usize>().ok());
                let chunked = get("transfer-encoding").is_some_and(|v| v.contains("chunked"));
                let attempt = get("x-reprise-attempt").and_then(|v| v.parse().ok());
                let headers = req
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).to_string(),
                        )
                    })
                    .collect();
                break (
                    n,
                    req.method.unwrap_or("").to_string(),
                    cl,
                    chunked,
                    attempt,
                    headers,
                );
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        buf.drain(..head_len);
        let body = if chunked {
            match read_chunked(&mut stream, &mut buf).await {
                Some(b) => b,
                None => return,
            }
        } else {
            let len = content_length.unwrap_or(0);
            while buf.len() < len {
                let mut chunk = vec![0u8; 65536];
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            buf.drain(..len).collect()
        };
        let n = counter.fetch_add(1, Ordering::SeqCst);
        log.lock().expect("log").push(Received {
            method,
            attempt,
            body: body.clone(),
            headers,
        });
        let port = stream.local_addr().map(|a| a.port()).unwrap_or(0);
        match script(n) {
            Action::Reply(status) => {
                if reply(
                    &mut stream,
                    status,
                    &[],
                    format!("from {port}\n").as_bytes(),
                )
                .await
                .is_err()
                {
                    return;
                }
            }
            Action::ReplyWith(status, headers, text) => {
                if reply(&mut stream, status, &headers, text.as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Action::Echo => {
                if reply(&mut stream, 200, &[], &body).await.is_err() {
                    return;
                }
            }
            Action::Stall(d) => {
                tokio::time::sleep(d).await;
                if reply(&mut stream, 200, &[], format!("from {port}\n").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Action::AbortMidBody => {
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\npartial body")
                    .await;
                let _ = stream.flush().await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                reset(stream);
                return;
            }
            Action::Reset => {
                reset(stream);
                return;
            }
            Action::Close => {
                let _ = stream.shutdown().await;
                return;
            }
            Action::HalfClose => {
                let _ = stream.shutdown().await;
                let mut sink = [0u8; 1024];
                let _ = tokio::time::timeout(Duration::from_secs(5), async {
                    while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                })
                .await;
                return;
            }
        }
    }
}

async fn read_chunked(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                break i;
            }
            let mut chunk = [0u8; 65536];
            let n = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
            buf.extend_from_slice(&chunk[..n]);
        };
        let size_text = String::from_utf8_lossy(&buf[..line_end]).to_string();
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        buf.drain(..line_end + 2);
        if size == 0 {
            // Trailers (if any) end with an empty line.
            loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    let empty = i == 0;
                    buf.drain(..i + 2);
                    if empty {
                        return Some(body);
                    }
                    continue;
                }
                let mut chunk = [0u8; 4096];
                let n = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
                buf.extend_from_slice(&chunk[..n]);
            }
        }
        while buf.len() < size + 2 {
            let mut chunk = vec![0u8; 65536];
            let n = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
            buf.extend_from_slice(&chunk[..n]);
        }
        body.extend_from_slice(&buf[..size]);
        buf.drain(..size + 2);
    }
}

async fn reply(
    stream: &mut TcpStream,
    status: u16,
    headers: &[(&'static str, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.flush().await
}

/// Closes with RST instead of FIN (SO_LINGER with a zero timeout).
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// A sidecar running in this process.
pub struct Sidecar {
    /// Its proxy listener.
    pub addr: SocketAddr,
    /// Its state.
    pub proxy: Arc<Proxy>,
    stop: Option<oneshot::Sender<()>>,
}

impl Sidecar {
    /// Starts a sidecar on an ephemeral loopback port with `yaml`.
    pub async fn start(yaml: &str) -> Sidecar {
        let config = reprise_crds::file::parse(yaml, "test.yaml")
            .unwrap_or_else(|e| panic!("config: {e}\n{yaml}"));
        let proxy = Proxy::new(config);
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind sidecar");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(reprise_sidecar::serve_proxy(
            listener,
            Arc::clone(&proxy),
            async {
                let _ = stopped.await;
            },
        ));
        Sidecar {
            addr,
            proxy,
            stop: Some(stop),
        }
    }

    /// Sends a request to upstream `host` and reads the whole response.
    pub async fn send(&self, method: &str, host: &str, path: &str, body: &[u8]) -> Reply {
        self.send_with(method, host, path, body, &[]).await
    }

    /// Like `send`, with extra request headers.
    pub async fn send_with(
        &self,
        method: &str,
        host: &str,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> Reply {
        let stream = TcpStream::connect(self.addr)
            .await
            .expect("connect sidecar");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", host);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(Bytes::copy_from_slice(body)))
            .expect("request");
        let started = std::time::Instant::now();
        let resp = sender.send_request(req).await.expect("response head");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.map(|b| b.to_bytes());
        Reply {
            status,
            headers,
            body,
            elapsed: started.elapsed(),
        }
    }

    /// Counter value of `outcome` for upstream `name`.
    pub fn outcomes(&self, upstream: &str, outcome: &str) -> u64 {
        self.stats(upstream).outcome(outcome)
    }

    /// What upstream `name` has done so far.
    pub fn stats(&self, name: &str) -> reprise_sidecar::UpstreamStats {
        self.proxy.stats(name).expect("a configured upstream")
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A response as the client saw it.
#[derive(Debug)]
pub struct Reply {
    /// Status.
    pub status: u16,
    /// Headers.
    pub headers: HeaderMap,
    /// Body, or the error that cut it.
    pub body: Result<Bytes, hyper::Error>,
    /// Time to the end of the body.
    pub elapsed: Duration,
}

impl Reply {
    /// The body as text; panics if the body failed.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(self.body.as_ref().expect("complete body")).to_string()
    }
}

/// YAML for one upstream named `name` over `endpoints`, with `extra` lines
/// (already indented by four spaces) such as a retries block.
pub fn upstream_yaml(name: &str, endpoints: &[&Upstream], extra: &str) -> String {
    let eps: Vec<String> = endpoints
        .iter()
        .map(|u| format!("{{ address: {}, port: {} }}", u.addr.ip(), u.addr.port()))
        .collect();
    format!(
        "  - name: {name}\n    endpoints: [{}]\n{extra}",
        eps.join(", ")
    )
}

/// A whole config with one upstream `api`. Unless the test sets a budget, the
/// budget gets a generous floor: the default 10% would (correctly) refuse
/// every retry until ten requests are in the window, and most tests here send
/// a handful of requests to observe something else.
pub fn config(endpoints: &[&Upstream], extra: &str) -> String {
    let extra = if extra.contains("budget") {
        extra.to_string()
    } else if extra.contains("retries: { ") {
        extra.replace(
            "retries: { ",
            "retries: { budget_min_retries_per_second: 1000, ",
        )
    } else {
        format!("{extra}    retries: {{ budget_min_retries_per_second: 1000 }}\n")
    };
    format!("upstreams:\n{}", upstream_yaml("api", endpoints, &extra))
}
