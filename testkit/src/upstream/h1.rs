//! HTTP/1.1 on the raw socket: read each request with [`Wire`], do what the
//! script chose as real TCP events (FIN, RST, a head without its body), keep
//! the connection alive between requests unless the client or the action
//! ends it.

use std::io;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{
    received, Action, Inner, ABORT_LENGTH, ABORT_PARTIAL, ABORT_PAUSE, HALF_CLOSE_WAIT, IDLE,
    MAX_REQUESTS_PER_CONN,
};
use crate::http1::{Request, Wire};

/// How an HTTP/1.1 exchange leaves the connection.
enum Next {
    KeepAlive,
    /// Close with FIN.
    Close,
    /// Close with RST.
    Reset,
}

pub(super) async fn serve_h1(inner: Arc<Inner>, stream: TcpStream) {
    let mut wire = Wire::new(stream);
    for _ in 0..MAX_REQUESTS_PER_CONN {
        let request = match tokio::time::timeout(IDLE, wire.read_request()).await {
            Ok(Ok(Some(r))) => r,
            _ => return,
        };
        let version = if request.head.minor_version == 0 {
            http::Version::HTTP_10
        } else {
            http::Version::HTTP_11
        };
        let r = received(
            version,
            request.head.method.clone(),
            request.head.target.clone(),
            request.head.headers.clone(),
        );
        let (idx, action) = inner.take(r, &request.body);
        match act_h1(&inner, wire.get_mut(), idx, action, &request).await {
            Next::KeepAlive if !request.head.wants_close() => continue,
            Next::KeepAlive | Next::Close => {
                let _ = wire.get_mut().shutdown().await;
                return;
            }
            Next::Reset => {
                // SO_LINGER with a zero timeout: the close sends RST, not FIN.
                let _ = wire.get_mut().set_zero_linger();
                return;
            }
        }
    }
}

async fn act_h1(
    inner: &Inner,
    stream: &mut TcpStream,
    idx: usize,
    action: Action,
    request: &Request,
) -> Next {
    let (wait, action) = action.unwrap_delays();
    tokio::time::sleep(wait).await;
    let head_only = request.head.method.eq_ignore_ascii_case("HEAD");
    let written = match action {
        Action::Reply(status) => {
            write_reply(stream, status, &[], &inner.default_body(), head_only).await
        }
        Action::ReplyWith(status, headers, body) => {
            write_reply(stream, status, &headers, &body, head_only).await
        }
        Action::Echo => write_reply(stream, 200, &[], &request.body, head_only).await,
        Action::SlowBody(delay, body) => {
            let head = reply_head(200, &[], body.len());
            async {
                stream.write_all(head.as_bytes()).await?;
                stream.flush().await?;
                tokio::time::sleep(delay).await;
                stream.write_all(&body).await?;
                stream.flush().await
            }
            .await
        }
        Action::Hold(d) => {
            tokio::time::sleep(d).await;
            return Next::Close;
        }
        Action::AbortMidBody => {
            let mut out = reply_head(200, &[], ABORT_LENGTH).into_bytes();
            out.extend_from_slice(ABORT_PARTIAL);
            let _ = stream.write_all(&out).await;
            let _ = stream.flush().await;
            tokio::time::sleep(ABORT_PAUSE).await;
            return Next::Reset;
        }
        Action::Reset => return Next::Reset,
        Action::Close => return Next::Close,
        Action::HalfClose => {
            let _ = stream.shutdown().await;
            let mut sink = [0u8; 1024];
            let _ = tokio::time::timeout(HALF_CLOSE_WAIT, async {
                // Bounded by the timeout; each read either gets bytes or ends.
                while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
            })
            .await;
            return Next::Close;
        }
        Action::Stall(_) | Action::Delay(_, _) => return Next::Close,
    };
    if written.is_err() {
        return Next::Close;
    }
    inner.answered(idx);
    Next::KeepAlive
}

fn reply_head(status: u16, headers: &[(&'static str, String)], len: usize) -> String {
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Status");
    let mut head = format!("HTTP/1.1 {status} {reason}\r\n");
    if status >= 200 && status != 204 && status != 304 {
        head.push_str(&format!("content-length: {len}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head
}

async fn write_reply(
    stream: &mut TcpStream,
    status: u16,
    headers: &[(&'static str, String)],
    body: &[u8],
    head_only: bool,
) -> io::Result<()> {
    let mut out = reply_head(status, headers, body.len()).into_bytes();
    if !head_only && status >= 200 && status != 204 && status != 304 {
        out.extend_from_slice(body);
    }
    stream.write_all(&out).await?;
    stream.flush().await
}
