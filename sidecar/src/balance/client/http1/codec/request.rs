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
}

/// Decides the request's framing from its headers and its body (`None` when
/// the body has already ended, else its exact length if known), adjusting
/// the headers as hyper's client does.
pub fn request_encoding(
    method: &Method,
    headers: &mut HeaderMap,
    body: Option<Option<u64>>,
) -> Encoding {
    let Some(length) = body else {
        headers.remove(header::TRANSFER_ENCODING);
        return Encoding::Length(0);
    };
    if headers.contains_key(header::TRANSFER_ENCODING) {
        // The sidecar strips the client's `Transfer-Encoding` (hop-by-hop);
        // one set here is chunked, and chunked leaves no room for a length.
        headers.remove(header::CONTENT_LENGTH);
        if !is_chunked(headers) {
            headers.append(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
        }
        return Encoding::Chunked;
    }
    if let Some(declared) = content_length(headers) {
        return Encoding::Length(declared);
    }
    match length {
        Some(n) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            Encoding::Length(n)
        }
        // GET, HEAD and CONNECT almost never have bodies (hyper's rule).
        None if matches!(*method, Method::GET | Method::HEAD | Method::CONNECT) => {
            Encoding::Length(0)
        }
        None => {
            headers.remove(header::CONTENT_LENGTH);
            headers.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
            Encoding::Chunked
        }
    }
}

/// Appends the request head (`HTTP/1.1`, lowercase names as the map keeps
/// them) to `dst`. Method, target and values are already validated by
/// `http`'s types, none of which can hold a CR or LF.
pub fn encode_head(dst: &mut Vec<u8>, method: &Method, target: &str, headers: &HeaderMap) {
    dst.reserve(32 + target.len() + headers.len() * 32);
    dst.extend_from_slice(method.as_str().as_bytes());
    dst.push(b' ');
    dst.extend_from_slice(target.as_bytes());
    dst.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        dst.extend_from_slice(name.as_str().as_bytes());
        dst.extend_from_slice(b": ");
        dst.extend_from_slice(value.as_bytes());
        dst.extend_from_slice(b"\r\n");
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
                dst.extend_from_slice(name.as_str().as_bytes());
                dst.extend_from_slice(b": ");
                dst.extend_from_slice(value.as_bytes());
                dst.extend_from_slice(b"\r\n");
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
        let enc = |method: Method, headers: &[(&str, &str)], body: Option<Option<u64>>| {
            let mut map = HeaderMap::new();
            for (k, v) in headers {
                map.append(
                    HeaderName::from_bytes(k.as_bytes()).expect("name"),
                    HeaderValue::from_str(v).expect("value"),
                );
            }
            let e = request_encoding(&method, &mut map, body);
            let mut names: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{k}={}", v.to_str().expect("ascii")))
                .collect();
            names.sort();
            (e, names)
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
        assert_eq!(
            enc(Method::GET, &[], Some(None)),
            (Encoding::Length(0), vec![])
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
        let mut head = Vec::new();
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("api"));
        encode_head(&mut head, &Method::GET, "/a?b", &headers);
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
