//! `bench-bare-forwarder`: the benchmark's reference ceiling for scenario 1
//! (e2e/bench). Not a proxy: it forwards each bodiless HTTP/1.1 request from a
//! client connection, byte for byte, over one upstream connection of its own,
//! and copies back one Content-Length response. No routing, no header
//! handling, no retries, no pool, no logs, no metrics: the same socket calls
//! per request as any keep-alive proxy and almost nothing else. Its req/s on
//! the benchmark's CPU split is what no proxy can beat there, so the report
//! can say how much of a gap to the best peer is reachable at all.
//!
//! Usage: `bench-bare-forwarder LISTEN_ADDR UPSTREAM_ADDR` (one-thread runtime).

use std::net::SocketAddr;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A message head larger than this is refused (the connection is closed).
const MAX_MESSAGE: usize = 16 * 1024;

fn main() -> anyhow::Result<()> {
    reprise_e2e::bench::forwarder_main("bench-bare-forwarder", |listen, upstream| async move {
        let listener = TcpListener::bind(listen).await?;
        loop {
            let (client, _) = listener.accept().await?;
            tokio::spawn(async move {
                if let Err(e) = forward(client, upstream).await {
                    eprintln!("bench-bare-forwarder: {e:#}");
                }
            });
        }
    })
}

/// Forwards request/response pairs until either side closes.
async fn forward(mut client: TcpStream, upstream: SocketAddr) -> anyhow::Result<()> {
    client.set_nodelay(true)?;
    let mut server = TcpStream::connect(upstream).await?;
    server.set_nodelay(true)?;
    let mut request = vec![0u8; MAX_MESSAGE];
    let mut response = vec![0u8; MAX_MESSAGE];
    loop {
        let Some(n) = read_request(&mut client, &mut request).await? else {
            return Ok(());
        };
        server.write_all(&request[..n]).await?;
        let m = read_response(&mut server, &mut response).await?;
        client.write_all(&response[..m]).await?;
    }
}

/// Reads one bodiless request head; None when the client closed between requests.
async fn read_request(from: &mut TcpStream, buf: &mut [u8]) -> anyhow::Result<Option<usize>> {
    let mut n = 0;
    loop {
        if n == buf.len() {
            bail!("request head over {MAX_MESSAGE} bytes");
        }
        let k = from.read(&mut buf[n..]).await?;
        if k == 0 {
            return if n == 0 {
                Ok(None)
            } else {
                bail!("client closed mid-request")
            };
        }
        n += k;
        if let Some(head) = head_len(&buf[..n]) {
            if head != n {
                bail!("pipelined requests or a request body: not supported");
            }
            return Ok(Some(n));
        }
    }
}

/// Reads one response with a Content-Length body; returns its total length.
async fn read_response(from: &mut TcpStream, buf: &mut [u8]) -> anyhow::Result<usize> {
    let mut n = 0;
    let mut total = None;
    loop {
        if total.is_none() {
            if let Some(head) = head_len(&buf[..n]) {
                total = Some(head + content_length(&buf[..head])?);
            }
        }
        match total {
            Some(t) if n >= t => return Ok(t),
            Some(t) if t > buf.len() => bail!("response over {MAX_MESSAGE} bytes"),
            _ => {}
        }
        if n == buf.len() {
            bail!("response head over {MAX_MESSAGE} bytes");
        }
        let k = from.read(&mut buf[n..]).await?;
        if k == 0 {
            bail!("upstream closed mid-response");
        }
        n += k;
    }
}

/// The length of the head (through the blank line), once it is complete.
fn head_len(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

fn content_length(head: &[u8]) -> anyhow::Result<usize> {
    for line in head.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(colon) = line.iter().position(|&b| b == b':') {
            if line[..colon].eq_ignore_ascii_case(b"content-length") {
                let value = std::str::from_utf8(&line[colon + 1..])?.trim();
                return value.parse().context("content-length");
            }
        }
    }
    bail!("response without Content-Length: not supported")
}
