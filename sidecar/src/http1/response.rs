//! The response head: parsed, and its body's framing decided.

use std::mem::MaybeUninit;

use bytes::BytesMut;
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode, Version};

use super::{
    content_length, digits, has_token, only_chunked, Framing, Spans, WireError, MAX_HEADERS,
    MAX_HEAD_BYTES,
};

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
/// A parsed response head.
#[derive(Debug)]
pub struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// The endpoint lets the connection carry another request.
    pub keep_alive: bool,
    /// A `101`: the bytes after the head belong to the new protocol.
    pub upgrade: bool,
    /// `headers` still hold hop-by-hop fields for the proxy to strip. A
    /// `Connection` of just `keep-alive` or `close` (what nginx and most
    /// servers send) and `Keep-Alive` are left out here, where their names
    /// are at hand anyway, so the usual head needs no strip pass at all.
    pub hop_by_hop: bool,
}

/// Parses a response head off the front of `buf` (1xx other than `101`
/// skipped), or `None` if more bytes are needed.
pub fn parse_response(
    buf: &mut BytesMut,
    method: &Method,
    spans: &mut Spans,
) -> Result<Option<ResponseHead>, WireError> {
    loop {
        // Uninitialised: zeroing 100 fields (3.2 KB) cost about as much as
        // parsing a typical head.
        let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        // Only the first 64 KiB are parsed: a longer head is refused however
        // its bytes arrived (as on the server side, `super::server`).
        let window = &buf[..buf.len().min(MAX_HEAD_BYTES)];
        let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut parsed,
            window,
            &mut fields,
        ) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => {
                if buf.len() >= MAX_HEAD_BYTES {
                    return Err(WireError::protocol("response head over 64 KiB"));
                }
                return Ok(None);
            }
            Err(httparse::Error::TooManyHeaders) => {
                return Err(WireError::protocol("response head over 100 fields"))
            }
            Err(_) => return Err(WireError::protocol("malformed response head")),
        };
        let status = parsed
            .code
            .and_then(|c| StatusCode::from_u16(c).ok())
            .ok_or(WireError::protocol("malformed response status"))?;
        let version = if parsed.version == Some(1) {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        };
        // Field offsets, then the head frozen once: every value is a slice
        // of it (no copy, no allocation per value).
        spans.record(buf, parsed.headers);
        let head = buf.split_to(len).freeze();
        let mut headers = HeaderMap::with_capacity(spans.len());
        let mut keep_alive = version == Version::HTTP_11;
        let mut saw_close = false;
        let mut hop_by_hop = false;
        let (mut lengths, mut length, mut transfer_encoding) = (0u32, None, false);
        for i in 0..spans.len() {
            let [n0, n1, v0, v1] = spans.field(i);
            let name = spans
                .name(i, &head[n0..n1])
                .map_err(|_| WireError::protocol("invalid response header name"))?;
            let value = HeaderValue::from_maybe_shared(head.slice(v0..v1))
                .map_err(|_| WireError::protocol("invalid response header value"))?;
            // Framing fields noted on the way: the usual head (one
            // `Content-Length`, no `Transfer-Encoding`) needs no lookups after.
            if name == header::CONTENT_LENGTH {
                lengths += 1;
                length = digits(value.as_bytes());
            } else if name == header::TRANSFER_ENCODING {
                transfer_encoding = true;
                hop_by_hop = true;
            } else if name == header::CONNECTION {
                let v = value.as_bytes();
                let close = v.eq_ignore_ascii_case(b"close");
                let plain = close || v.eq_ignore_ascii_case(b"keep-alive");
                // Once any `Connection` line asks to close, a later
                // `keep-alive` does not undo it.
                if saw_close || close || (!plain && has_token(&value, "close")) {
                    saw_close = true;
                    keep_alive = false;
                } else if !keep_alive {
                    keep_alive = plain || has_token(&value, "keep-alive");
                }
                if plain {
                    // Names no other field: nothing for the proxy to do.
                    continue;
                }
                hop_by_hop = true;
            } else if name == KEEP_ALIVE {
                continue;
            } else if crate::exchange::hop_by_hop::is_hop_by_hop(&name) {
                hop_by_hop = true;
            }
            headers.append(name, value);
        }
        let code = status.as_u16();
        if code == 101 {
            return Ok(Some(ResponseHead {
                status,
                version,
                headers,
                framing: Framing::Length(0),
                keep_alive: false,
                upgrade: true,
                hop_by_hop,
            }));
        }
        if (100..200).contains(&code) {
            continue;
        }
        let framing = if code == 204 || code == 304 || *method == Method::HEAD {
            Framing::Length(0)
        } else if transfer_encoding {
            if version == Version::HTTP_10 {
                return Err(WireError::protocol(
                    "HTTP/1.0 response with Transfer-Encoding",
                ));
            }
            // The client would get the body with its codings dropped (the
            // field is hop-by-hop): refused as the request's are (HAProxy
            // answers such a response 502 too).
            if !only_chunked(&headers) {
                return Err(WireError::protocol(
                    "response with a transfer coding other than chunked",
                ));
            }
            headers.remove(header::CONTENT_LENGTH);
            Framing::Chunked
        } else if lengths == 0 {
            Framing::Close
        } else if let Some(n) = length.filter(|_| lengths == 1) {
            Framing::Length(n)
        } else if let Some(n) = content_length(&headers) {
            Framing::Length(n)
        } else {
            return Err(WireError::protocol("invalid Content-Length"));
        };
        let keep_alive = keep_alive && framing != Framing::Close;
        return Ok(Some(ResponseHead {
            status,
            version,
            headers,
            framing,
            keep_alive,
            upgrade: false,
            hop_by_hop,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::failure::FailureKind;

    fn parse(bytes: &[u8], method: Method) -> Result<Option<ResponseHead>, WireError> {
        parse_response(&mut BytesMut::from(bytes), &method, &mut Spans::new())
    }

    fn framing(bytes: &str) -> Result<Framing, FailureKind> {
        parse(bytes.as_bytes(), Method::GET)
            .map(|h| h.expect("complete").framing)
            .map_err(|e| e.kind)
    }

    #[test]
    fn response_framing_follows_rfc_9112_in_hyper_order() {
        let ok = |h: &str| framing(&format!("HTTP/1.1 200 OK\r\n{h}\r\n"));
        assert_eq!(ok("content-length: 5\r\n"), Ok(Framing::Length(5)));
        assert_eq!(
            ok("content-length: 5\r\ncontent-length: 5\r\n"),
            Ok(Framing::Length(5))
        );
        assert_eq!(ok("content-length: 5, 5\r\n"), Ok(Framing::Length(5)));
        for bad in ["5, 6", "+5", "-1", "0x5", "99999999999999999999", "", "5 5"] {
            assert_eq!(
                ok(&format!("content-length: {bad}\r\n")),
                Err(FailureKind::ProtocolError),
                "{bad:?}"
            );
        }
        assert_eq!(
            ok("content-length: 5\r\ncontent-length: 6\r\n"),
            Err(FailureKind::ProtocolError)
        );
        assert_eq!(ok("transfer-encoding: chunked\r\n"), Ok(Framing::Chunked));
        assert_eq!(ok("transfer-encoding: Chunked\r\n"), Ok(Framing::Chunked));
        // Any other coding is one the client would get unlabelled (the
        // field is hop-by-hop): refused, as nginx refuses it.
        for coding in [
            "gzip, Chunked",
            "chunked, gzip",
            "gzip",
            "identity",
            "chunked, chunked",
            "chunked\r\ntransfer-encoding: chunked",
        ] {
            assert_eq!(
                ok(&format!("transfer-encoding: {coding}\r\n")),
                Err(FailureKind::ProtocolError),
                "{coding:?}"
            );
        }
        assert_eq!(ok(""), Ok(Framing::Close));
        let both = parse(
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
            Method::GET,
        )
        .expect("parsed")
        .expect("complete");
        assert_eq!(both.framing, Framing::Chunked);
        assert!(
            !both.headers.contains_key(header::CONTENT_LENGTH),
            "one length only"
        );
        assert_eq!(
            framing("HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"),
            Err(FailureKind::ProtocolError)
        );
        for no_body in ["204 No Content", "304 Not Modified"] {
            assert_eq!(
                framing(&format!("HTTP/1.1 {no_body}\r\ncontent-length: 9\r\n\r\n")),
                Ok(Framing::Length(0))
            );
        }
        let head = parse(
            b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n",
            Method::HEAD,
        )
        .expect("parsed")
        .expect("complete");
        assert_eq!(head.framing, Framing::Length(0));
    }

    #[test]
    fn keep_alive_needs_http_1_1_or_an_explicit_keep_alive_and_a_delimited_body() {
        let keep = |s: &str| {
            parse(s.as_bytes(), Method::GET)
                .expect("parsed")
                .expect("complete")
                .keep_alive
        };
        assert!(keep("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"));
        assert!(!keep(
            "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
        ));
        assert!(!keep(
            "HTTP/1.1 200 OK\r\nconnection: close\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n"
        ));
        assert!(!keep("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"));
        assert!(keep(
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n"
        ));
        assert!(!keep("HTTP/1.1 200 OK\r\n\r\n"), "read to the close");
    }

    #[test]
    fn plain_connection_and_keep_alive_fields_are_left_out_and_the_rest_flagged() {
        let head = |s: &str| {
            parse(s.as_bytes(), Method::GET)
                .expect("parsed")
                .expect("complete")
        };
        // nginx's usual head: nothing hop-by-hop is kept, no strip needed.
        let h = head("HTTP/1.1 200 OK\r\nserver: nginx\r\nconnection: keep-alive\r\nkeep-alive: timeout=5\r\ncontent-length: 0\r\n\r\n");
        assert!(!h.hop_by_hop && h.keep_alive);
        let names: Vec<&str> = h.headers.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["server", "content-length"]);
        let h = head("HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 0\r\n\r\n");
        assert!(!h.hop_by_hop && !h.keep_alive && !h.headers.contains_key("connection"));
        // A Connection naming another field stays for the strip, flagged.
        let h = head("HTTP/1.1 200 OK\r\nconnection: close, x-secret\r\nx-secret: 1\r\ncontent-length: 0\r\n\r\n");
        assert!(h.hop_by_hop && !h.keep_alive);
        assert!(h.headers.contains_key("connection") && h.headers.contains_key("x-secret"));
        for kept in [
            "transfer-encoding: chunked",
            "te: trailers",
            "upgrade: h2c",
            "proxy-connection: keep-alive",
            "proxy-authorization: Basic eA==",
        ] {
            let h = head(&format!(
                "HTTP/1.1 200 OK\r\n{kept}\r\ncontent-length: 0\r\n\r\n"
            ));
            assert!(h.hop_by_hop, "{kept} is flagged for the strip");
        }
    }

    #[test]
    fn informational_responses_are_skipped_and_101_ends_the_head() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi"[..],
        );
        let head = parse_response(&mut buf, &Method::POST, &mut Spans::new())
            .expect("parsed")
            .expect("complete");
        assert_eq!(head.status, 200);
        assert_eq!(&buf[..], b"hi");
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n\x81\x00"[..],
        );
        let head = parse_response(&mut buf, &Method::GET, &mut Spans::new())
            .expect("parsed")
            .expect("complete");
        assert!(head.upgrade && !head.keep_alive);
        assert_eq!(&buf[..], b"\x81\x00", "the new protocol's bytes stay");
        let mut partial = BytesMut::from(&b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 2"[..]);
        assert!(
            parse_response(&mut partial, &Method::GET, &mut Spans::new())
                .expect("ok")
                .is_none()
        );
        assert_eq!(&partial[..], b"HTTP/1.1 2", "the skipped 100 is consumed");
    }

    #[test]
    fn heads_over_the_limits_and_malformed_heads_are_protocol_errors() {
        let big = format!(
            "HTTP/1.1 200 OK\r\nx: {}\r\n\r\n",
            "a".repeat(MAX_HEAD_BYTES)
        );
        assert_eq!(framing(&big), Err(FailureKind::ProtocolError));
        let mut partial = BytesMut::from(
            format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD_BYTES)).as_bytes(),
        );
        assert_eq!(
            parse_response(&mut partial, &Method::GET, &mut Spans::new())
                .map_err(|e| e.kind)
                .err(),
            Some(FailureKind::ProtocolError),
            "an endless head is cut off, not buffered"
        );
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x{i}: y\r\n")).collect();
        assert_eq!(
            framing(&format!("HTTP/1.1 200 OK\r\n{many}\r\n")),
            Err(FailureKind::ProtocolError)
        );
        for bad in [
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/2.0 200 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nbad name: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length : 5\r\n\r\n",
            "HTTP/1.1 200 OK\r\nx: a\0b\r\n\r\n",
            "HTTP/1.1 200 OK\r\nx: a\r\n folded\r\n\r\n",
        ] {
            assert_eq!(framing(bad), Err(FailureKind::ProtocolError), "{bad:?}");
        }
        assert_eq!(
            framing("HTTP/1.1 200\r\ncontent-length: 0\r\n\r\n"),
            Ok(Framing::Length(0))
        );
    }

    /// Each field as `name: value`, in order.
    fn fields(headers: &HeaderMap) -> Vec<String> {
        headers
            .iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().expect("ascii")))
            .collect()
    }

    #[test]
    fn names_kept_from_earlier_heads_parse_as_a_fresh_parser_would() {
        // Heads one connection might see in turn: the same names in other
        // cases and orders, more and fewer fields, names that differ only
        // in punctuation, a custom name, one too long to keep.
        let heads = [
            "Server: nginx\r\nDate: d\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n",
            "server: nginx\r\nDATE: d\r\ncontent-type: a\r\ncontent-length: 0\r\n",
            "Date: d\r\nServer: s\r\nX-A^B: 1\r\nContent-Length: 0\r\n",
            "Date: d\r\nServer: s\r\nX-A~B: 2\r\nContent-Length: 0\r\n",
            "X-A-Name-Longer-Than-24-Bytes: 1\r\nX-Custom: 2\r\nX-Custom: 3\r\nContent-Length: 0\r\n",
            "Content-Length: 0\r\n",
            "X-A-Name-Longer-Than-24-Bytes: 4\r\nx-custom: 5\r\nX-CUSTOM: 6\r\nContent-Length: 0\r\n",
        ];
        let mut kept = Spans::new();
        for head in heads {
            let bytes = format!("HTTP/1.1 200 OK\r\n{head}\r\n");
            let again = parse_response(
                &mut BytesMut::from(bytes.as_bytes()),
                &Method::GET,
                &mut kept,
            )
            .expect("valid")
            .expect("complete");
            let fresh = parse(bytes.as_bytes(), Method::GET)
                .expect("valid")
                .expect("complete");
            assert_eq!(fields(&again.headers), fields(&fresh.headers), "{head}");
        }
        assert_eq!(
            kept.names
                .iter()
                .map(|k| k.name.as_str())
                .collect::<Vec<_>>(),
            // Position 0 from the one-field head: the long name after it
            // is parsed each time, never kept.
            ["content-length", "x-custom", "x-custom", "content-length"],
            "what is kept"
        );
    }
}
