//! Tells HTTP/1.x from h2c on a new connection by its first bytes, without
//! consuming them.

use std::time::Duration;

use tokio::net::TcpStream;

use super::HEADER_READ_TIMEOUT;

/// The protocol a client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// HTTP/1.0 or 1.1.
    Http1,
    /// HTTP/2 with prior knowledge (the connection preface).
    H2c,
}

/// Waits, up to [`HEADER_READ_TIMEOUT`], until the client has sent enough to
/// tell HTTP/1.1 from h2c (the whole HTTP/2 preface, or a byte that cannot
/// start it); `None` when it sends nothing (or only a prefix of the preface)
/// in that time, or closes. hyper's header read timeout only starts once the
/// protocol is known, so without this a client that connects and stays
/// silent would hold its connection open forever.
pub(crate) async fn detect(stream: &TcpStream) -> Option<Protocol> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let wait = async {
        let mut buf = [0u8; PREFACE.len()];
        loop {
            match stream.peek(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) if n == PREFACE.len() => {
                    return Some(if buf == PREFACE {
                        Protocol::H2c
                    } else {
                        Protocol::Http1
                    })
                }
                Ok(n) if buf[..n] != PREFACE[..n] => return Some(Protocol::Http1),
                // A partial preface: peek returns at once while bytes wait, so pause.
                Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    };
    tokio::time::timeout(HEADER_READ_TIMEOUT, wait)
        .await
        .ok()
        .flatten()
}
