//! Tells what a new connection carries by its first bytes, without consuming
//! them: HTTP/1.x or h2c on the proxy listener ([`detect`]); on a captured
//! connection also anything else ([`captured`]), which is relayed opaquely.

use std::time::Duration;

use tokio::net::TcpStream;

use super::HEADER_READ_TIMEOUT;

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Longest method token a request line is recognised by; registered methods
/// are at most 17 bytes (`VERSION-CONTROL`, `BASELINE-CONTROL`, ...).
const MAX_METHOD: usize = 32;

/// The protocol a client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// HTTP/1.0 or 1.1.
    Http1,
    /// HTTP/2 with prior knowledge (the connection preface).
    H2c,
}

/// What a captured connection's first bytes say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sniffed {
    /// An HTTP/1.x request line or the h2c preface.
    Http(Protocol),
    /// Anything else: a TLS handshake, a database protocol, bytes that
    /// cannot start a request line.
    Opaque,
    /// Not enough bytes yet to tell.
    NeedMore,
}

/// Waits, up to [`HEADER_READ_TIMEOUT`], until the client has sent enough to
/// tell HTTP/1.1 from h2c (the whole HTTP/2 preface, or a byte that cannot
/// start it); `None` when it sends nothing (or only a prefix of the preface)
/// in that time, or closes. hyper's header read timeout only starts once the
/// protocol is known, so without this a client that connects and stays
/// silent would hold its connection open forever.
pub(crate) async fn detect(stream: &TcpStream) -> Option<Protocol> {
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

/// Tells what a captured connection carries. A client that sends nothing
/// within `first_bytes_wait` speaks a server-first protocol (MySQL, SMTP) and
/// is [`Sniffed::Opaque`]; once bytes come, a request line is awaited up to
/// [`HEADER_READ_TIMEOUT`] and `max_line` bytes (longer is opaque: the
/// destination answers it as it would without the sidecar). `None` when the
/// client closes, or stalls inside what could still be a request line.
pub(crate) async fn captured(
    stream: &TcpStream,
    first_bytes_wait: Duration,
    max_line: usize,
) -> Option<Sniffed> {
    let mut first = [0u8; 1];
    match tokio::time::timeout(first_bytes_wait, stream.peek(&mut first)).await {
        Err(_) => return Some(Sniffed::Opaque),
        Ok(Ok(0) | Err(_)) => return None,
        Ok(Ok(_)) => {}
    }
    let wait = async {
        let mut buf = vec![0u8; max_line.max(PREFACE.len())];
        loop {
            let n = match stream.peek(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => n,
            };
            match classify(&buf[..n]) {
                Sniffed::NeedMore if n == buf.len() => return Some(Sniffed::Opaque),
                Sniffed::NeedMore => tokio::time::sleep(Duration::from_millis(20)).await,
                done => return Some(done),
            }
        }
    };
    tokio::time::timeout(HEADER_READ_TIMEOUT, wait)
        .await
        .ok()
        .flatten()
}

/// What a CONNECT tunnel that does not start with TLS carries, by its first
/// bytes: h2c after the HTTP/2 preface, HTTP/1 otherwise (bytes that are no
/// request get the HTTP/1 server's `400`); `None` while they are a strict
/// prefix of the preface.
pub(crate) fn tunnelled(first: &[u8]) -> Option<Protocol> {
    let n = first.len().min(PREFACE.len());
    if first[..n] != PREFACE[..n] {
        return Some(Protocol::Http1);
    }
    (n == PREFACE.len()).then_some(Protocol::H2c)
}

/// What the bytes received so far are: the h2c preface, an HTTP/1.x request
/// line (`METHOD SP target SP HTTP/1.x CRLF`, RFC 9112 §3), something else,
/// or the start of one of the first two.
pub(crate) fn classify(bytes: &[u8]) -> Sniffed {
    let n = bytes.len().min(PREFACE.len());
    if bytes[..n] == PREFACE[..n] {
        return if n == PREFACE.len() {
            Sniffed::Http(Protocol::H2c)
        } else {
            Sniffed::NeedMore
        };
    }
    let Some(method_end) = bytes.iter().position(|b| !is_tchar(*b)) else {
        return if bytes.len() <= MAX_METHOD {
            Sniffed::NeedMore
        } else {
            Sniffed::Opaque
        };
    };
    if method_end == 0 || method_end > MAX_METHOD || bytes[method_end] != b' ' {
        return Sniffed::Opaque;
    }
    let rest = &bytes[method_end + 1..];
    // The target: visible ASCII up to the next space.
    let Some(target_end) = rest.iter().position(|b| !(0x21..=0x7e).contains(b)) else {
        return Sniffed::NeedMore;
    };
    if target_end == 0 || rest[target_end] != b' ' {
        return Sniffed::Opaque;
    }
    let version = &rest[target_end + 1..];
    const V10: &[u8] = b"HTTP/1.0\r\n";
    const V11: &[u8] = b"HTTP/1.1\r\n";
    let m = version.len().min(V10.len());
    if version[..m] == V10[..m] || version[..m] == V11[..m] {
        if m == V10.len() {
            Sniffed::Http(Protocol::Http1)
        } else {
            Sniffed::NeedMore
        }
    } else {
        Sniffed::Opaque
    }
}

/// A token character (RFC 9110 §5.6.2), what a method is made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tunnel_is_h2c_after_the_whole_preface_and_http1_otherwise() {
        let mut preface_and_more = PREFACE.to_vec();
        preface_and_more.extend_from_slice(b"\0\0\x12\x04");
        let cases: &[(&[u8], Option<Protocol>)] = &[
            (PREFACE, Some(Protocol::H2c)),
            (&preface_and_more, Some(Protocol::H2c)),
            (b"PRI * HTTP/2", None),
            (b"P", None),
            (b"GET / HTTP/1.1\r\n", Some(Protocol::Http1)),
            (b"PRI * HTTP/1.1\r\n", Some(Protocol::Http1)),
            (b"\x00garbage", Some(Protocol::Http1)),
        ];
        for (bytes, want) in cases {
            assert_eq!(
                tunnelled(bytes),
                *want,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn request_lines_and_the_preface_are_http_everything_else_opaque() {
        use Sniffed::*;
        let cases: &[(&[u8], Sniffed)] = &[
            (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", Http(Protocol::Http1)),
            (b"POST /orders?id=1 HTTP/1.0\r\n", Http(Protocol::Http1)),
            (b"M-SEARCH * HTTP/1.1\r\n", Http(Protocol::Http1)),
            (PREFACE, Http(Protocol::H2c)),
            (b"PRI * HTTP/2.0\r\n", NeedMore),
            (b"GET", NeedMore),
            (b"GET /a", NeedMore),
            (b"GET /a HTTP/1", NeedMore),
            (b"GET /a HTTP/1.1\r", NeedMore),
            // TLS ClientHello: a handshake record.
            (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", Opaque),
            // PostgreSQL's startup message starts with its length.
            (b"\x00\x00\x00\x08\x04\xd2\x16\x2f", Opaque),
            // Redis commands: no request line.
            (b"*1\r\n$4\r\nPING\r\n", Opaque),
            (b"SET key value\r\n", Opaque),
            (b"GET /a HTTP/2.0\r\n", Opaque),
            (b"GET  / HTTP/1.1\r\n", Opaque),
            (b" GET / HTTP/1.1\r\n", Opaque),
            (b"GET / HTTP/1.1\n", Opaque),
            (&[b'A'; MAX_METHOD + 1], Opaque),
        ];
        for (bytes, want) in cases {
            assert_eq!(
                classify(bytes),
                *want,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}
