//! A client's HTTP/1.1 request through the sidecar's own server codec
//! (`sidecar/src/http1/server.rs`): the head parse and the body decoder,
//! over any bytes.
//!
//! Input: a seed for where the bytes are cut, then the bytes as the client
//! sent them.
//!
//! Invariants: never panics; the framing agrees with the fields forwarded
//! (chunked: no `Content-Length` is kept; a length: at most one
//! `Content-Length`, whose digits are it; `Transfer-Encoding` kept only when
//! chunked, never on HTTP/1.0; `100-continue` only with a body to come); a
//! body of known length yields exactly that many bytes; and the outcome
//! does not depend on how the bytes arrive: fed in pieces cut where the seed
//! says, the head and body give the same request, data, trailers and
//! leftover bytes as fed at once, or both fail.

use crate::wire::{fields, pieces, read_body, Body};
use bytes::BytesMut;
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::Version;
use reprise_sidecar::http1::server::parse_request;
use reprise_sidecar::http1::{Framing, Spans};

/// A small head limit, so that the fuzzer reaches it.
const MAX_HEAD: usize = 1024;

#[derive(Debug, PartialEq)]
enum Outcome {
    HeadFailed(u16),
    HeadIncomplete,
    Request {
        line: String,
        fields: Vec<(String, Vec<u8>)>,
        framing: Framing,
        keep_alive: bool,
        body: Body,
    },
}

fn run(bytes: &[u8], seed: u8) -> Outcome {
    let mut feed = pieces(bytes, seed).into_iter();
    let mut buf = BytesMut::new();
    let mut spans = Spans::new();
    let head = loop {
        if !buf.is_empty() {
            match parse_request(&mut buf, MAX_HEAD, &mut spans) {
                Err(e) => return Outcome::HeadFailed(e.status.as_u16()),
                Ok(Some(head)) => break head,
                Ok(None) => {}
            }
        }
        match feed.next() {
            Some(piece) => buf.extend_from_slice(piece),
            None => return Outcome::HeadIncomplete,
        }
    };
    let lengths = head.headers.get_all(CONTENT_LENGTH).iter().count();
    match head.framing {
        Framing::Chunked => {
            assert_eq!(lengths, 0, "a length beside chunked framing");
            assert!(head.headers.contains_key(TRANSFER_ENCODING));
        }
        Framing::Length(n) => {
            assert!(!head.headers.contains_key(TRANSFER_ENCODING));
            assert!(lengths <= 1, "two lengths kept");
            if let Some(v) = head.headers.get(CONTENT_LENGTH) {
                // Digits only (leading zeros allowed), and the length read.
                let value = std::str::from_utf8(v.as_bytes()).expect("digits");
                assert_eq!(value.parse::<u64>().ok(), Some(n), "{value:?}");
            } else {
                assert_eq!(n, 0);
            }
        }
        Framing::Close => panic!("a request read to the close"),
    }
    if head.version == Version::HTTP_10 {
        assert!(!head.headers.contains_key(TRANSFER_ENCODING));
        assert!(!head.expect_continue);
    }
    if head.expect_continue {
        assert_ne!(head.framing, Framing::Length(0));
    }
    let body = read_body(head.framing, buf, feed);
    Outcome::Request {
        line: format!("{} {} {:?}", head.method, head.uri, head.version),
        fields: fields(&head.headers),
        framing: head.framing,
        keep_alive: head.keep_alive,
        body,
    }
}

/// Replays one input; panics when an invariant above breaks.
pub fn check(data: &[u8]) {
    let [seed, bytes @ ..] = data else {
        return;
    };
    let whole = run(bytes, 0);
    let cut = run(bytes, *seed);
    match (&whole, &cut) {
        (
            Outcome::Request {
                body: Body::Failed, ..
            },
            Outcome::Request {
                body: Body::Failed, ..
            },
        ) => {}
        _ => assert_eq!(whole, cut, "{:?}", String::from_utf8_lossy(bytes)),
    }
}
