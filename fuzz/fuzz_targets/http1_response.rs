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
#![no_main]

use bytes::BytesMut;
use http::Method;
use libfuzzer_sys::fuzz_target;
use reprise_sidecar::http1::{parse_response, Decoded, Decoder, Framing, Spans};

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

#[derive(Debug, PartialEq)]
enum Body {
    Failed,
    /// The endpoint closed first (the bytes ran out): data so far.
    Cut(Vec<u8>),
    Ended {
        data: Vec<u8>,
        trailers: Option<Vec<(String, Vec<u8>)>>,
        leftover: Vec<u8>,
    },
}

/// Piece lengths from `seed` (1 to 64 bytes each); seed 0 feeds everything at once.
fn pieces(bytes: &[u8], seed: u8) -> Vec<&[u8]> {
    if seed == 0 {
        return vec![bytes];
    }
    let (mut out, mut rest, mut s) = (Vec::new(), bytes, u32::from(seed));
    while !rest.is_empty() {
        s = s.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let n = ((s >> 16) as usize % 64 + 1).min(rest.len());
        out.push(&rest[..n]);
        rest = &rest[n..];
    }
    out
}

fn fields(map: &http::HeaderMap) -> Vec<(String, Vec<u8>)> {
    map.iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect()
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
    let mut decoder = Decoder::new(head.framing);
    let expected = decoder.remaining();
    let mut data = Vec::new();
    let body = loop {
        match decoder.decode(&mut buf) {
            Err(_) => break Body::Failed,
            Ok(Decoded::Data(d)) => {
                assert!(!d.is_empty(), "an empty data frame");
                data.extend_from_slice(&d);
            }
            Ok(Decoded::Trailers(t)) => {
                break Body::Ended {
                    data,
                    trailers: Some(fields(&t)),
                    leftover: leftover(buf, feed),
                }
            }
            Ok(Decoded::End) => {
                break Body::Ended {
                    data,
                    trailers: None,
                    leftover: leftover(buf, feed),
                }
            }
            Ok(Decoded::More) => match feed.next() {
                Some(piece) => buf.extend_from_slice(piece),
                None => match decoder.eof() {
                    Ok(_) => {
                        break Body::Ended {
                            data,
                            trailers: None,
                            leftover: Vec::new(),
                        }
                    }
                    Err(_) => break Body::Cut(data),
                },
            },
        }
    };
    if let (Some(n), Body::Ended { data, .. }) = (expected, &body) {
        assert_eq!(data.len() as u64, n, "a body of known length");
    }
    Outcome::Response {
        status: head.status.as_u16(),
        fields: fields(&head.headers),
        framing: head.framing,
        keep_alive: head.keep_alive,
        body,
    }
}

fn leftover<'a>(buf: BytesMut, rest: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut all = buf.to_vec();
    for piece in rest {
        all.extend_from_slice(piece);
    }
    all
}

fuzz_target!(|data: &[u8]| {
    let [flags, seed, bytes @ ..] = data else {
        return;
    };
    let method = if flags & 1 == 1 { Method::HEAD } else { Method::GET };
    let whole = run(bytes, 0, &method);
    let cut = run(bytes, *seed, &method);
    match (&whole, &cut) {
        (
            Outcome::Response { body: Body::Failed, .. },
            Outcome::Response { body: Body::Failed, .. },
        ) => {}
        _ => assert_eq!(whole, cut, "{:?}", String::from_utf8_lossy(bytes)),
    }
});
