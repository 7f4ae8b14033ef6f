//! A response body's framing and its decoder (a length, chunked, or to the
//! close).

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;

use super::{WireError, MAX_EXTENSION_BYTES, MAX_HEADERS, MAX_TRAILER_BYTES};
/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// This many bytes (0: none).
    Length(u64),
    /// Chunked.
    Chunked,
    /// Everything up to the endpoint's close; the connection ends with it.
    Close,
}

/// What the decoder produced from the buffered bytes.
#[derive(Debug)]
pub enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// The trailers (the body has ended).
    Trailers(HeaderMap),
    /// The body has ended.
    End,
    /// More bytes are needed.
    More,
}

/// A response body's decoder.
#[derive(Debug)]
pub struct Decoder {
    state: State,
    extension_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Bytes left of a body of known length.
    Length(u64),
    /// Reading to the close.
    Close,
    /// Chunked: the size line.
    Size,
    /// Chunked: bytes left of the current chunk's data.
    Data(u64),
    /// Chunked: the CRLF after a chunk's data.
    DataEnd,
    /// Chunked: the trailer section after the last chunk.
    Trailers,
    /// The body has ended.
    Done,
}

impl Decoder {
    /// A decoder for `framing`.
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::Size,
            Framing::Close => State::Close,
        };
        Self {
            state,
            extension_bytes: 0,
        }
    }

    /// The body has ended.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Bytes still to come, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Length(n) => Some(n),
            State::Done => Some(0),
            _ => None,
        }
    }

    /// Decodes what `buf` holds. Data comes out as slices of `buf`'s own
    /// allocation (no copy).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, WireError> {
        loop {
            match self.state {
                State::Done => return Ok(Decoded::End),
                State::Length(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::More);
                    }
                    let (data, left) = take_up_to(buf, left);
                    self.state = if left == 0 {
                        State::Done
                    } else {
                        State::Length(left)
                    };
                    return Ok(Decoded::Data(data));
                }
                State::Close => {
                    if buf.is_empty() {
                        return Ok(Decoded::More);
                    }
                    return Ok(Decoded::Data(buf.split().freeze()));
                }
                State::Size => {
                    let Some(line) = line_end(buf) else {
                        if buf.len() as u64 > MAX_EXTENSION_BYTES + 32 {
                            return Err(WireError::protocol("chunk size line too long"));
                        }
                        return Ok(Decoded::More);
                    };
                    let size = self.chunk_size(&buf[..line])?;
                    buf.advance(line + 2);
                    self.state = if size == 0 {
                        State::Trailers
                    } else {
                        State::Data(size)
                    };
                }
                State::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::More);
                    }
                    let (data, left) = take_up_to(buf, left);
                    self.state = if left == 0 {
                        State::DataEnd
                    } else {
                        State::Data(left)
                    };
                    // The chunk's end and the next size line are often in
                    // the buffer already: read past them now, so that the
                    // body's last frame says it is the last.
                    if left == 0 {
                        self.skip_ahead(buf)?;
                    }
                    return Ok(Decoded::Data(data));
                }
                State::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(Decoded::More);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(WireError::protocol("chunk data not followed by CRLF"));
                    }
                    buf.advance(2);
                    self.state = State::Size;
                }
                State::Trailers => {
                    if buf.len() >= 2 && &buf[..2] == b"\r\n" {
                        buf.advance(2);
                        self.state = State::Done;
                        return Ok(Decoded::End);
                    }
                    let Some(end) = trailers_end(buf)? else {
                        if buf.len() > MAX_TRAILER_BYTES {
                            return Err(WireError::protocol("trailers over 16 KiB"));
                        }
                        return Ok(Decoded::More);
                    };
                    if end > MAX_TRAILER_BYTES {
                        return Err(WireError::protocol("trailers over 16 KiB"));
                    }
                    let section = buf.split_to(end);
                    let trailers = parse_trailers(&section)?;
                    self.state = State::Done;
                    return Ok(Decoded::Trailers(trailers));
                }
            }
        }
    }

    /// At the endpoint's close: the end of a body read to the close, an
    /// error for any other.
    pub fn eof(&mut self) -> Result<Decoded, WireError> {
        match self.state {
            State::Close | State::Done => {
                self.state = State::Done;
                Ok(Decoded::End)
            }
            _ => Err(WireError::closed("endpoint closed before the body ended")),
        }
    }

    /// Moves past a chunk's CRLF, and past the last chunk and an empty
    /// trailer section, when the buffer already holds them.
    fn skip_ahead(&mut self, buf: &mut BytesMut) -> Result<(), WireError> {
        if buf.len() < 2 {
            return Ok(());
        }
        if &buf[..2] != b"\r\n" {
            return Err(WireError::protocol("chunk data not followed by CRLF"));
        }
        buf.advance(2);
        self.state = State::Size;
        if buf.starts_with(b"0\r\n\r\n") {
            buf.advance(5);
            self.state = State::Done;
        }
        Ok(())
    }

    /// A chunk-size line (without its CRLF): hex digits, optional
    /// whitespace, optional extensions (ignored, bounded, no bare LF).
    fn chunk_size(&mut self, line: &[u8]) -> Result<u64, WireError> {
        let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if digits == 0 {
            return Err(WireError::protocol("invalid chunk size"));
        }
        if digits > 16 {
            return Err(WireError::protocol("chunk size overflows 64 bits"));
        }
        let mut size = 0u64;
        for b in &line[..digits] {
            let d = (*b as char).to_digit(16).unwrap_or(0);
            size = size
                .checked_mul(16)
                .and_then(|s| s.checked_add(u64::from(d)))
                .ok_or(WireError::protocol("chunk size overflows 64 bits"))?;
        }
        let rest = &line[digits..];
        let ws = rest
            .iter()
            .take_while(|b| **b == b' ' || **b == b'\t')
            .count();
        let rest = &rest[ws..];
        match rest.first() {
            None => {}
            Some(b';') => {
                if rest.contains(&b'\n') {
                    return Err(WireError::protocol("chunk extension contains a newline"));
                }
                self.extension_bytes += rest.len() as u64;
                if self.extension_bytes >= MAX_EXTENSION_BYTES {
                    return Err(WireError::protocol("chunk extensions over 16 KiB"));
                }
            }
            Some(_) => return Err(WireError::protocol("invalid chunk size")),
        }
        Ok(size)
    }
}

/// Up to `left` bytes off the front of `buf` (a slice of its allocation),
/// and how many are still owed after them.
fn take_up_to(buf: &mut BytesMut, left: u64) -> (Bytes, u64) {
    let take = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
    (buf.split_to(take).freeze(), left - take as u64)
}

/// The index of the CR of the first CRLF in `buf`. A bare LF before it is
/// not a line end: it stays in the line, and the size parse refuses it.
fn line_end(buf: &[u8]) -> Option<usize> {
    find(buf, b"\r\n")
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The length of the trailer section at the start of `buf` (its blank line
/// included), once it is all in. Every line ends in CRLF: a bare LF is
/// refused as soon as it is in, since parsers differ on where it puts the
/// section's end (hyper reads on to the next CRLF CRLF, which can be the
/// next message's; nginx and HAProxy end a line there). The section is at
/// most 16 KiB, so searching it again on each read stays bounded.
fn trailers_end(buf: &[u8]) -> Result<Option<usize>, WireError> {
    let window = &buf[..buf.len().min(MAX_TRAILER_BYTES + 1)];
    let mut at = 0;
    while let Some(lf) = window[at..].iter().position(|&b| b == b'\n') {
        let lf = at + lf;
        if lf == 0 || window[lf - 1] != b'\r' {
            return Err(WireError::protocol("trailer line not ended by CRLF"));
        }
        // A line's CRLF right after the previous one's: the blank line.
        if lf >= 3 && &window[lf - 3..lf - 1] == b"\r\n" {
            return Ok(Some(lf + 1));
        }
        at = lf + 1;
    }
    Ok(None)
}

/// A trailer section ending in CRLF CRLF.
fn parse_trailers(section: &[u8]) -> Result<HeaderMap, WireError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match httparse::parse_headers(section, &mut fields) {
        Ok(httparse::Status::Complete((_, fields))) => {
            let mut trailers = HeaderMap::with_capacity(fields.len());
            for field in fields.iter() {
                let name = HeaderName::from_bytes(field.name.as_bytes())
                    .map_err(|_| WireError::protocol("invalid trailer name"))?;
                let value = HeaderValue::from_bytes(field.value)
                    .map_err(|_| WireError::protocol("invalid trailer value"))?;
                trailers.append(name, value);
            }
            Ok(trailers)
        }
        Ok(httparse::Status::Partial) => Err(WireError::protocol("malformed trailers")),
        Err(httparse::Error::TooManyHeaders) => {
            Err(WireError::protocol("trailers over 100 fields"))
        }
        Err(_) => Err(WireError::protocol("malformed trailers")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::failure::FailureKind;

    fn body(
        framing: Framing,
        wire: &[u8],
    ) -> Result<(Vec<u8>, Option<HeaderMap>, bool), WireError> {
        let mut decoder = Decoder::new(framing);
        let mut buf = BytesMut::from(wire);
        let (mut data, mut trailers) = (Vec::new(), None);
        loop {
            match decoder.decode(&mut buf)? {
                Decoded::Data(d) => data.extend_from_slice(&d),
                Decoded::Trailers(t) => {
                    trailers = Some(t);
                    break;
                }
                Decoded::End => break,
                Decoded::More => return Ok((data, trailers, false)),
            }
        }
        Ok((data, trailers, buf.is_empty()))
    }

    #[test]
    fn chunked_bodies_decode_strictly() {
        let (data, trailers, clean) = body(
            Framing::Chunked,
            b"5;a=b\r\nhello\r\nA \r\n0123456789\r\n0\r\n\r\n",
        )
        .expect("ok");
        assert_eq!(data, b"hello0123456789");
        assert!(trailers.is_none() && clean);
        let (data, trailers, _) = body(
            Framing::Chunked,
            b"000002\r\nhi\r\n0\r\ngrpc-status: 0\r\n\r\n",
        )
        .expect("ok");
        assert_eq!(data, b"hi");
        assert_eq!(trailers.expect("trailers")["grpc-status"], "0");
        for bad in [
            &b"0x5\r\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloXX0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            b"10000000000000000\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"5 x\r\nhello\r\n0\r\n\r\n",
        ] {
            assert_eq!(
                body(Framing::Chunked, bad).map_err(|e| e.kind).err(),
                Some(FailureKind::ProtocolError),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let (data, _, ended) = body(Framing::Chunked, b"5\r\nhel").expect("ok");
        assert_eq!(data, b"hel");
        assert!(!ended, "more is needed");
    }

    #[test]
    fn trailer_lines_end_in_crlf_and_a_bare_lf_is_refused_at_once() {
        let (data, trailers, clean) = body(
            Framing::Chunked,
            b"3\r\nabc\r\n0\r\nX-A: 1\r\nX-B: 2\r\n\r\n",
        )
        .expect("ok");
        assert_eq!(data, b"abc");
        let trailers = trailers.expect("trailers");
        assert_eq!(trailers["x-a"], "1");
        assert_eq!(trailers["x-b"], "2");
        assert!(clean);
        // Refused as soon as the LF is in, not once a CRLF CRLF comes (which
        // may be the next message's).
        for bad in [
            &b"3\r\nabc\r\n0\r\nX-T: y\n\r\n"[..],
            b"3\r\nabc\r\n0\r\nX-T: y\n",
            b"3\r\nabc\r\n0\r\nX-T: y\n\r\nGET /second HTTP/1.1\r\nHost: a\r\n\r\n",
            b"0\r\nX-A: 1\r\nX-T: y\n\n",
            b"0\r\n\n",
            b"0\r\nX-A: 1\r\n\n",
        ] {
            assert_eq!(
                body(Framing::Chunked, bad).map_err(|e| e.kind).err(),
                Some(FailureKind::ProtocolError),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // Cut anywhere, a good section still waits for more.
        let good = b"0\r\nX-A: 1\r\n\r\n";
        for cut in 1..good.len() {
            let (_, trailers, _) = body(Framing::Chunked, &good[..cut]).expect("ok");
            assert!(trailers.is_none(), "{cut}");
        }
    }

    #[test]
    fn the_last_data_frame_of_a_buffered_chunked_body_already_ends_it() {
        let mut decoder = Decoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&b"2\r\nhi\r\n0\r\n\r\n"[..]);
        assert!(matches!(decoder.decode(&mut buf), Ok(Decoded::Data(d)) if d == "hi"));
        assert!(decoder.is_done(), "read past the terminator with the data");
        assert!(buf.is_empty());
    }

    #[test]
    fn a_length_body_stops_at_its_length_and_leaves_what_follows() {
        let mut decoder = Decoder::new(Framing::Length(3));
        let mut buf = BytesMut::from(&b"abcHTTP/1.1 200 OK"[..]);
        assert!(matches!(decoder.decode(&mut buf), Ok(Decoded::Data(d)) if d == "abc"));
        assert!(decoder.is_done());
        assert_eq!(
            &buf[..],
            b"HTTP/1.1 200 OK",
            "left for the caller to refuse"
        );
        assert_eq!(
            Decoder::new(Framing::Length(3))
                .eof()
                .map_err(|e| e.kind)
                .err(),
            Some(FailureKind::ConnectionClosed)
        );
        assert!(matches!(
            Decoder::new(Framing::Close).eof(),
            Ok(Decoded::End)
        ));
    }
}
