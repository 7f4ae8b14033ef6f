//! The chunked transfer coding, decoded incrementally: bytes are fed as they
//! arrive, whole size lines, data and trailers are consumed, and what follows
//! the body (the next message) is left alone.

use std::io;

use super::{invalid, MAX_BODY};

/// Longest chunk-size or trailer line.
const MAX_LINE: usize = 4096;
/// Most trailer fields after a chunked body.
const MAX_TRAILERS: usize = 64;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    Data(usize),
    DataEnd,
    Trailers(usize),
    Done,
}

/// An incremental decoder of the chunked transfer coding: feed it the bytes
/// as they arrive; it consumes whole chunk-size lines, data and trailers.
#[derive(Clone, Debug, Default)]
pub struct Chunked {
    state: ChunkState,
    body: Vec<u8>,
}

/// The line at the start of `input` without its CRLF, and its length with it.
fn line(input: &[u8]) -> io::Result<Option<(&[u8], usize)>> {
    match input.windows(2).position(|w| w == b"\r\n") {
        Some(i) if i <= MAX_LINE => Ok(Some((&input[..i], i + 2))),
        None if input.len() <= MAX_LINE => Ok(None),
        _ => Err(invalid("chunked framing line too long")),
    }
}

fn chunk_size(line: &[u8]) -> io::Result<usize> {
    let text = String::from_utf8_lossy(line);
    // Chunk extensions (`;name=value`) are allowed and ignored.
    let digits = text.split(';').next().unwrap_or_default().trim();
    if digits.is_empty() || digits.len() > 15 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(invalid(format!("chunk size {text:?}")));
    }
    usize::from_str_radix(digits, 16).map_err(|_| invalid(format!("chunk size {text:?}")))
}

impl Chunked {
    /// Decodes from the start of `input`; returns how many bytes it consumed.
    /// Call again with the unconsumed rest plus more bytes until
    /// [`Chunked::is_done`].
    pub fn decode(&mut self, input: &[u8]) -> io::Result<usize> {
        let mut at = 0;
        // Every round but the last consumes at least one byte.
        for _ in 0..=input.len() + 1 {
            let rest = &input[at..];
            match self.state {
                ChunkState::Done => return Ok(at),
                ChunkState::Size => {
                    let Some((text, used)) = line(rest)? else {
                        return Ok(at);
                    };
                    let size = chunk_size(text)?;
                    if self.body.len().saturating_add(size) > MAX_BODY {
                        return Err(invalid(format!("chunked body over {MAX_BODY} bytes")));
                    }
                    at += used;
                    self.state = if size == 0 {
                        ChunkState::Trailers(0)
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    let take = left.min(rest.len());
                    self.body.extend_from_slice(&rest[..take]);
                    at += take;
                    if take < left {
                        self.state = ChunkState::Data(left - take);
                        return Ok(at);
                    }
                    self.state = ChunkState::DataEnd;
                }
                ChunkState::DataEnd => {
                    if rest.len() < 2 {
                        return Ok(at);
                    }
                    if &rest[..2] != b"\r\n" {
                        return Err(invalid("chunk data not followed by CRLF"));
                    }
                    at += 2;
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailers(seen) => {
                    let Some((text, used)) = line(rest)? else {
                        return Ok(at);
                    };
                    at += used;
                    if text.is_empty() {
                        self.state = ChunkState::Done;
                    } else if seen >= MAX_TRAILERS {
                        return Err(invalid("too many trailer fields"));
                    } else {
                        self.state = ChunkState::Trailers(seen + 1);
                    }
                }
            }
        }
        Ok(at)
    }

    /// True once the last chunk and the trailers have been read.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// The body decoded so far.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `pieces` fed one after another, as reads would deliver them.
    fn decode_in_pieces(pieces: &[&[u8]]) -> io::Result<(Vec<u8>, Vec<u8>)> {
        let mut chunked = Chunked::default();
        let mut pending = Vec::new();
        for p in pieces {
            pending.extend_from_slice(p);
            let used = chunked.decode(&pending)?;
            pending.drain(..used);
        }
        assert!(chunked.is_done(), "not done; left {pending:?}");
        Ok((chunked.into_body(), pending))
    }

    #[test]
    fn chunked_bodies_decode_whole_or_split_anywhere() {
        let wire = b"5\r\nhello\r\n8;ext=1\r\n chunked\r\n0\r\nx-trailer: yes\r\n\r\nNEXT";
        let (body, rest) = decode_in_pieces(&[wire]).expect("decodes");
        assert_eq!(body, b"hello chunked");
        assert_eq!(rest, b"NEXT", "the next message is left alone");
        // Every split point, including inside the size line and the CRLFs.
        for cut in 1..wire.len() {
            let (body, rest) = decode_in_pieces(&[&wire[..cut], &wire[cut..]]).expect("decodes");
            assert_eq!(body, b"hello chunked", "cut at {cut}");
            assert_eq!(rest, b"NEXT", "cut at {cut}");
        }
        // Byte by byte.
        let bytes: Vec<&[u8]> = wire.chunks(1).collect();
        assert_eq!(
            decode_in_pieces(&bytes).expect("decodes").0,
            b"hello chunked"
        );
        // Upper-case hex and an empty body.
        assert_eq!(
            decode_in_pieces(&[b"A\r\n0123456789\r\n0\r\n\r\n"])
                .expect("decodes")
                .0,
            b"0123456789"
        );
        assert_eq!(decode_in_pieces(&[b"0\r\n\r\n"]).expect("decodes").0, b"");
    }

    #[test]
    fn bad_chunked_framing_is_refused() {
        for bad in [
            &b"zz\r\nhello\r\n0\r\n\r\n"[..],
            b"\r\n",
            b"+5\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"ffffffffffffffff\r\n",
        ] {
            let mut chunked = Chunked::default();
            assert!(
                chunked.decode(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut long = Chunked::default();
        assert!(
            long.decode(&vec![b'1'; MAX_LINE + 10]).is_err(),
            "a size line without end"
        );
        let mut many = b"0\r\n".to_vec();
        many.extend(b"t: v\r\n".repeat(MAX_TRAILERS + 1));
        assert!(
            Chunked::default().decode(&many).is_err(),
            "endless trailers"
        );
    }
}
