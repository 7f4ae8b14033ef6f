//! An endpoint's HTTP/1.1 response through the sidecar's own codec
//! (`sidecar/src/http1.rs`): the head parse and the
//! body decoder, over any bytes.
//!
//! Input: a flags byte (bit 0: the request was `HEAD`), a seed for where the
//! bytes are cut, then the bytes as the endpoint sent them.
//!
//! Invariants: never panics; a body of known length yields exactly that
//! many bytes; and the outcome does not depend on how the bytes arrive: fed
//! in pieces cut where the seed says, the head and body give the same
//! status, fields, framing, data, trailers and leftover bytes as fed at
//! once, or both fail (the bytes delivered before a failure may differ: a
//! broken chunk terminator that arrived with its data fails at once).

use crate::wire::{fields, pieces, read_body, Body};
use bytes::BytesMut;
use http::Method;
use reprise_sidecar::http1::{parse_response, Framing, Spans};

#[derive(Debug, PartialEq)]
enum Outcome {
    HeadFailed,
    HeadIncomplete,
    Response {
        status: u16,
        fields: Vec<(String, Vec<u8>)>,
        framing: Framing,
        keep_alive: bool,
        body: Body,
    },
}

fn run(bytes: &[u8], seed: u8, method: &Method) -> Outcome {
    let mut feed = pieces(bytes, seed).into_iter();
    let mut buf = BytesMut::new();
    let mut spans = Spans::new();
    let head = loop {
        if !buf.is_empty() {
            match parse_response(&mut buf, method, &mut spans) {
                Err(_) => return Outcome::HeadFailed,
                Ok(Some(head)) => break head,
                Ok(None) => {}
            }
        }
        match feed.next() {
            Some(piece) => buf.extend_from_slice(piece),
            None => return Outcome::HeadIncomplete,
        }
    };
    let body = read_body(head.framing, buf, feed);
    Outcome::Response {
        status: head.status.as_u16(),
        fields: fields(&head.headers),
        framing: head.framing,
        keep_alive: head.keep_alive,
        body,
    }
}

/// Replays one input; panics when an invariant above breaks.
pub fn check(data: &[u8]) {
    let [flags, seed, bytes @ ..] = data else {
        return;
    };
    let method = if flags & 1 == 1 {
        Method::HEAD
    } else {
        Method::GET
    };
    let whole = run(bytes, 0, &method);
    let cut = run(bytes, *seed, &method);
    match (&whole, &cut) {
        (
            Outcome::Response {
                body: Body::Failed, ..
            },
            Outcome::Response {
                body: Body::Failed, ..
            },
        ) => {}
        _ => assert_eq!(whole, cut, "{:?}", String::from_utf8_lossy(bytes)),
    }
}
