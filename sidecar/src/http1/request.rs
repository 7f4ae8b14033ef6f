//! The request side: its framing decided, its head and chunks encoded.

use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method};

use super::{content_length, is_chunked};
/// How a request body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Exactly this many bytes (0: no body).
    Length(u64),
    /// Chunked, ended by a zero-size chunk and the trailers.
    Chunked,
    /// Everything up to the close (a response of unknown length to an
    /// HTTP/1.0 client).
    Close,
}

/// A request's framing: how its body goes, and the one field the head drops
/// and the one it adds for that.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFraming {
    /// How the body goes on the wire.
    pub encoding: Encoding,
    /// Every field of this name in the headers is left out.
    pub drop: Option<HeaderName>,
    /// Sent after the headers.
    pub add: Option<(HeaderName, HeaderValue)>,
}

impl RequestFraming {
    fn new(encoding: Encoding) -> Self {
        Self {
            encoding,
            drop: None,
            add: None,
        }
    }
}

/// Decides the request's framing from its headers and its body (`None` when
/// the body has already ended, else its exact length if known), as hyper's
/// client does, without touching the headers: the change to them is
/// returned, for the encoder to apply.
pub fn request_framing(
    method: &Method,
    headers: &HeaderMap,
    body: Option<Option<u64>>,
) -> RequestFraming {
    let Some(length) = body else {
        let mut f = RequestFraming::new(Encoding::Length(0));
        if headers.contains_key(header::TRANSFER_ENCODING) {
            f.drop = Some(header::TRANSFER_ENCODING);
        }
        return f;
    };
    if headers.contains_key(header::TRANSFER_ENCODING) {
        // The sidecar strips the client's `Transfer-Encoding` (hop-by-hop);
        // one set here is chunked, and chunked leaves no room for a length.
        let mut f = RequestFraming::new(Encoding::Chunked);
        if headers.contains_key(header::CONTENT_LENGTH) {
            f.drop = Some(header::CONTENT_LENGTH);
        }
        if !is_chunked(headers) {
            f.add = Some((
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            ));
        }
        return f;
    }
    if let Some(declared) = content_length(headers) {
        return RequestFraming::new(Encoding::Length(declared));
    }
    match length {
        Some(n) => {
            // A `Content-Length` that did not parse is replaced.
            let mut f = RequestFraming::new(Encoding::Length(n));
            if headers.contains_key(header::CONTENT_LENGTH) {
                f.drop = Some(header::CONTENT_LENGTH);
            }
            f.add = Some((header::CONTENT_LENGTH, HeaderValue::from(n)));
            f
        }
        // A CONNECT's bytes after its head are the tunnel's. Any other
        // method's body goes, as a length's would: hyper sends none for GET
        // and HEAD, which dropped a chunked GET body the client had sent.
        None if *method == Method::CONNECT => RequestFraming::new(Encoding::Length(0)),
        None => {
            let mut f = RequestFraming::new(Encoding::Chunked);
            if headers.contains_key(header::CONTENT_LENGTH) {
                f.drop = Some(header::CONTENT_LENGTH);
            }
            f.add = Some((
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            ));
            f
        }
    }
}

/// Appends the request line (`HTTP/1.1`). Method and target are already
/// validated by `http`'s types, neither of which can hold a CR or LF.
pub fn encode_request_line(dst: &mut Vec<u8>, method: &Method, target: &str) {
    dst.extend_from_slice(method.as_str().as_bytes());
    dst.push(b' ');
    dst.extend_from_slice(target.as_bytes());
    dst.extend_from_slice(b" HTTP/1.1\r\n");
}

/// Appends one field (lowercase, as `http` keeps names; values validated
/// by `HeaderValue`, which holds no CR or LF).
pub fn encode_field(dst: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    dst.extend_from_slice(name.as_str().as_bytes());
    dst.extend_from_slice(b": ");
    dst.extend_from_slice(value.as_bytes());
    dst.extend_from_slice(b"\r\n");
}

/// Appends every field of `headers` but those `skip` names.
pub fn encode_fields(dst: &mut Vec<u8>, headers: &HeaderMap, skip: impl Fn(&HeaderName) -> bool) {
    for (name, value) in headers {
        if !skip(name) {
            encode_field(dst, name, value);
        }
    }
}

/// Appends a whole request head: line, `headers` less the field `framing`
/// drops, the one it adds, the blank line.
pub fn encode_head(
    dst: &mut Vec<u8>,
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    framing: &RequestFraming,
) {
    dst.reserve(32 + target.len() + headers.len() * 32);
    encode_request_line(dst, method, target);
    encode_fields(dst, headers, |name| framing.drop.as_ref() == Some(name));
    if let Some((name, value)) = &framing.add {
        encode_field(dst, name, value);
    }
    dst.extend_from_slice(b"\r\n");
}

/// Appends a chunk-size line for `len` bytes of data.
pub fn encode_chunk_size(dst: &mut Vec<u8>, len: usize) {
    use std::io::Write;
    let _ = write!(dst, "{len:X}\r\n");
}

/// Appends the last chunk and `trailers` (hyper's client sends only fields
/// the request's `Trailer` header declared; so does this).
pub fn encode_last_chunk(dst: &mut Vec<u8>, trailers: Option<&HeaderMap>, declared: &[HeaderName]) {
    dst.extend_from_slice(b"0\r\n");
    if let Some(trailers) = trailers {
        for (name, value) in trailers {
            if declared.contains(name) {
                encode_field(dst, name, value);
            }
        }
    }
    dst.extend_from_slice(b"\r\n");
}

/// The trailer fields a request's `Trailer` header declares.
pub fn declared_trailers(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::TRAILER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter_map(|s| HeaderName::from_bytes(s.trim().as_bytes()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_framing_is_hyper_clients() {
        // The head as it goes out, its fields sorted.
        let enc = |method: Method, headers: &[(&str, &str)], body: Option<Option<u64>>| {
            let mut map = HeaderMap::new();
            for (k, v) in headers {
                map.append(
                    HeaderName::from_bytes(k.as_bytes()).expect("name"),
                    HeaderValue::from_str(v).expect("value"),
                );
            }
            let framing = request_framing(&method, &map, body);
            let mut head = Vec::new();
            encode_head(&mut head, &method, "/", &map, &framing);
            let head = String::from_utf8(head).expect("ascii");
            let mut names: Vec<String> = head
                .split("\r\n")
                .skip(1)
                .filter(|l| !l.is_empty())
                .map(|l| l.replacen(": ", "=", 1))
                .collect();
            names.sort();
            (framing.encoding, names)
        };
        assert_eq!(enc(Method::GET, &[], None), (Encoding::Length(0), vec![]));
        assert_eq!(
            enc(Method::POST, &[("transfer-encoding", "chunked")], None),
            (Encoding::Length(0), vec![])
        );
        assert_eq!(
            enc(Method::POST, &[("content-length", "5")], Some(Some(5))),
            (Encoding::Length(5), vec!["content-length=5".to_owned()])
        );
        assert_eq!(
            enc(Method::POST, &[], Some(Some(7))),
            (Encoding::Length(7), vec!["content-length=7".to_owned()])
        );
        assert_eq!(
            enc(Method::POST, &[], Some(None)),
            (
                Encoding::Chunked,
                vec!["transfer-encoding=chunked".to_owned()]
            )
        );
        // A body of unknown length goes chunked whatever the method (hyper
        // sends none for GET and HEAD: a client's chunked GET body was lost).
        for method in [Method::GET, Method::HEAD, Method::DELETE] {
            assert_eq!(
                enc(method, &[], Some(None)),
                (
                    Encoding::Chunked,
                    vec!["transfer-encoding=chunked".to_owned()]
                )
            );
        }
        assert_eq!(
            enc(Method::CONNECT, &[], Some(None)),
            (Encoding::Length(0), vec![]),
            "a CONNECT's bytes are the tunnel's"
        );
        assert_eq!(
            enc(
                Method::PUT,
                &[("transfer-encoding", "gzip"), ("content-length", "3")],
                Some(Some(3))
            ),
            (
                Encoding::Chunked,
                vec![
                    "transfer-encoding=chunked".to_owned(),
                    "transfer-encoding=gzip".to_owned()
                ]
            )
        );
        // A length that does not parse gives way to the body's, or to chunked.
        assert_eq!(
            enc(Method::POST, &[("content-length", "x")], Some(Some(3))),
            (Encoding::Length(3), vec!["content-length=3".to_owned()])
        );
        assert_eq!(
            enc(Method::POST, &[("content-length", "x")], Some(None)),
            (
                Encoding::Chunked,
                vec!["transfer-encoding=chunked".to_owned()]
            )
        );
        let mut head = Vec::new();
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("api"));
        let framing = request_framing(&Method::GET, &headers, None);
        encode_head(&mut head, &Method::GET, "/a?b", &headers, &framing);
        assert_eq!(head, b"GET /a?b HTTP/1.1\r\nhost: api\r\n\r\n");
        let mut last = Vec::new();
        let mut trailers = HeaderMap::new();
        trailers.insert("x-sum", HeaderValue::from_static("1"));
        trailers.insert("x-secret", HeaderValue::from_static("2"));
        encode_last_chunk(
            &mut last,
            Some(&trailers),
            &[HeaderName::from_static("x-sum")],
        );
        assert_eq!(last, b"0\r\nx-sum: 1\r\n\r\n", "only declared trailers");
    }
}
