//! What the HTTP/1 targets share: bytes cut into the pieces a connection
//! might read them in, a body read off them with the sidecar's decoder, and
//! fields and leftovers compared as plain values.

use bytes::BytesMut;
use reprise_sidecar::http1::{Decoded, Decoder, Framing};

/// How a body read off the pieces ended.
#[derive(Debug, PartialEq)]
pub enum Body {
    Failed,
    /// The peer closed first (the pieces ran out): data so far.
    Cut(Vec<u8>),
    Ended {
        data: Vec<u8>,
        trailers: Option<Vec<(String, Vec<u8>)>>,
        leftover: Vec<u8>,
    },
}

/// Reads a body framed as `framing` from `buf` and then the pieces of
/// `feed`, as a connection would. Checks that no data frame is empty and
/// that a body of known length yields exactly that many bytes.
pub fn read_body<'a>(
    framing: Framing,
    mut buf: BytesMut,
    mut feed: impl Iterator<Item = &'a [u8]>,
) -> Body {
    let mut decoder = Decoder::new(framing);
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
                // The close ends a body read to the close, and cuts any other.
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
    body
}

/// `bytes` cut into pieces of 1 to 64 bytes as `seed` says; seed 0 feeds
/// everything at once.
pub fn pieces(bytes: &[u8], seed: u8) -> Vec<&[u8]> {
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

/// A header map as (name, value) pairs, in order.
pub fn fields(map: &http::HeaderMap) -> Vec<(String, Vec<u8>)> {
    map.iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect()
}

/// What is left once a message has ended: the buffer and the pieces not fed.
pub fn leftover<'a>(buf: BytesMut, rest: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut all = buf.to_vec();
    for piece in rest {
        all.extend_from_slice(piece);
    }
    all
}
