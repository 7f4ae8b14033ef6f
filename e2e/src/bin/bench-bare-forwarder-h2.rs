//! `bench-bare-forwarder-h2`: the benchmark's reference ceiling for scenario 7
//! (e2e/bench), h2c in and h2c out, built on the same h2 crate as the
//! sidecar. Not a proxy: each stream's head is copied (method, URI and
//! fields as they came) onto one upstream HTTP/2 connection, and the answer's
//! head and body are copied back. No routing, no header handling, no retries,
//! no timeouts, no logs, no metrics, no flow-control subtleties beyond
//! releasing what was read. What it reaches on the benchmark's CPU split is
//! what the h2 crate allows any proxy built on it, so the report can say how
//! much of a gap to HAProxy is the crate's and how much the sidecar's.
//!
//! Usage: `bench-bare-forwarder-h2 LISTEN_ADDR UPSTREAM_ADDR` (one-thread runtime).

use std::net::SocketAddr;

use anyhow::bail;
use bytes::Bytes;
use h2::client::SendRequest;
use h2::{RecvStream, SendStream};
use tokio::net::{TcpListener, TcpStream};

fn main() -> anyhow::Result<()> {
    reprise_e2e::bench::forwarder_main("bench-bare-forwarder-h2", |listen, upstream| async move {
        // One upstream connection for all clients, as the sidecar keeps one
        // per endpoint.
        let io = connect(upstream).await?;
        let (send, conn) = h2::client::handshake(io).await?;
        tokio::spawn(async move {
            // Without its one upstream connection the ceiling means
            // nothing: stop, so the benchmark reports it as failed.
            match conn.await {
                Ok(()) => eprintln!("bench-bare-forwarder-h2: upstream closed"),
                Err(e) => eprintln!("bench-bare-forwarder-h2: upstream: {e}"),
            }
            std::process::exit(1);
        });
        let listener = TcpListener::bind(listen).await?;
        loop {
            let (client, _) = listener.accept().await?;
            client.set_nodelay(true)?;
            let send = send.clone();
            tokio::spawn(async move {
                if let Err(e) = serve(client, send).await {
                    eprintln!("bench-bare-forwarder-h2: {e:#}");
                }
            });
        }
    })
}

/// Connects to the upstream, which the benchmark may start at the same time
/// (tries for 5 s).
async fn connect(upstream: SocketAddr) -> anyhow::Result<TcpStream> {
    for _ in 0..100 {
        if let Ok(io) = TcpStream::connect(upstream).await {
            io.set_nodelay(true)?;
            return Ok(io);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    bail!("upstream {upstream}: no connection in 5 s")
}

/// Accepts a client's streams until it closes; each runs in a task of its own.
async fn serve(client: TcpStream, send: SendRequest<Bytes>) -> anyhow::Result<()> {
    let mut conn = h2::server::handshake(client).await?;
    while let Some(stream) = conn.accept().await {
        let (request, respond) = stream?;
        let send = send.clone();
        tokio::spawn(async move {
            if let Err(e) = forward(request, respond, send).await {
                eprintln!("bench-bare-forwarder-h2: stream: {e:#}");
            }
        });
    }
    Ok(())
}

async fn forward(
    request: http::Request<RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    send: SendRequest<Bytes>,
) -> anyhow::Result<()> {
    let (head, body) = request.into_parts();
    let end = body.is_end_stream();
    let mut send = send.ready().await?;
    let (response, upload) = send.send_request(http::Request::from_parts(head, ()), end)?;
    if !end {
        copy(body, upload).await?;
    }
    let (head, body) = response.await?.into_parts();
    let end = body.is_end_stream();
    let download = respond.send_response(http::Response::from_parts(head, ()), end)?;
    if !end {
        copy(body, download).await?;
    }
    Ok(())
}

/// Copies a body's data frames, releasing flow control as they are read.
async fn copy(mut from: RecvStream, mut to: SendStream<Bytes>) -> anyhow::Result<()> {
    let mut ended = false;
    while let Some(data) = from.data().await {
        let data = data?;
        from.flow_control().release_capacity(data.len())?;
        ended = from.is_end_stream();
        to.send_data(data, ended)?;
    }
    if !ended {
        to.send_data(Bytes::new(), true)?;
    }
    Ok(())
}
