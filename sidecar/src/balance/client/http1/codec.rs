//! HTTP/1.1 on the wire towards an endpoint, without I/O: the request head
//! written, the response head parsed and its body's framing decided
//! (RFC 9112 §6.3), chunked bodies decoded. `super::conn` moves the bytes.
//!
//! The contract: the rules are hyper's client's, which the sidecar used
//! before this codec (hyper 1.x `proto/h1/role.rs` and `decode.rs`), so an
//! endpoint sees the same requests and a client the same responses, but for
//! two deliberate differences: the 64 KiB head limit and the
//! `Content-Length` removed from a chunked response (both below):
//! - Request framing: a body that has ended is no body (`Transfer-Encoding`
//!   dropped); a `Content-Length` already in the headers is kept; a body of
//!   known length gets one; a body of unknown length is chunked, except for
//!   `GET`, `HEAD` and `CONNECT`, which send none. A `Transfer-Encoding` in
//!   the headers means chunked, and then no `Content-Length`.
//! - Response framing, in this order: `101` ends the message (the bytes after
//!   it are the new protocol's), other `1xx` are skipped, `204`, `304` and a
//!   `HEAD` request's response have no body; `Transfer-Encoding` whose last
//!   coding is `chunked` is chunked, any other coding is read to the close
//!   (HTTP/1.0 with `Transfer-Encoding` is an error); `Content-Length` values,
//!   comma lists included, must be digits and all equal; otherwise the body
//!   runs to the close. A chunked response's `Content-Length` is removed so
//!   the client is not told two lengths.
//! - Limits: 100 header fields (hyper's), 64 KiB of head (Envoy's 60 KiB
//!   default is the same order; hyper allowed 408 KiB, nginx and HAProxy cut
//!   at 4–16 KiB), chunk extensions 16 KiB per message, trailers 16 KiB
//!   and 100 fields (hyper's). Chunk lines end in CRLF; a bare LF inside an
//!   extension is refused (some parsers accept it and would frame the body
//!   differently).
//!
//! The differential tests (`sidecar/tests/differential.rs`) hold these rules
//! against hyper, nginx and HAProxy on request-smuggling and framing corpora.

use std::fmt;
use std::io;
use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode, Version};

use crate::retry::failure::{FailureKind, Stage};

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// Header fields a response head may carry (hyper's client default).
pub const MAX_HEADERS: usize = 100;

/// Bytes a response head may take.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Chunk-extension bytes a message may carry (hyper's limit).
const MAX_EXTENSION_BYTES: u64 = 16 * 1024;

/// Trailer bytes a message may carry (hyper's limit).
const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// What went wrong on an endpoint's HTTP/1 connection, and how the retry
/// engine sees it.
#[derive(Debug)]
pub struct WireError {
    /// The failure as the retry engine classifies it.
    pub kind: FailureKind,
    /// How far the request got.
    pub stage: Stage,
    what: &'static str,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl WireError {
    /// A response (or chunk) that breaks HTTP/1.1's grammar or framing rules.
    pub fn protocol(what: &'static str) -> Self {
        Self {
            kind: FailureKind::ProtocolError,
            stage: Stage::AfterWrite,
            what,
            source: None,
        }
    }

    /// The endpoint closed the connection before the message ended.
    pub fn closed(what: &'static str) -> Self {
        Self {
            kind: FailureKind::ConnectionClosed,
            stage: Stage::AfterWrite,
            what,
            source: None,
        }
    }

    /// A socket error, classified by its kind like the kernel's errors
    /// always were.
    pub fn io(what: &'static str, e: io::Error) -> Self {
        let kind = match e.kind() {
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted => FailureKind::ConnectionReset,
            io::ErrorKind::UnexpectedEof => FailureKind::ConnectionClosed,
            io::ErrorKind::TimedOut => FailureKind::ReadTimeout,
            _ => FailureKind::Other,
        };
        Self {
            kind,
            stage: Stage::AfterWrite,
            what,
            source: Some(Box::new(e)),
        }
    }

    /// The client's request body failed (its framing, or its connection):
    /// the client's failure, never the endpoint's.
    pub fn request_body(e: Box<dyn std::error::Error + Send + Sync>) -> Self {
        Self {
            kind: FailureKind::RequestBodyError,
            stage: Stage::AfterWrite,
            what: "request body failed",
            source: Some(e),
        }
    }

    /// The request body did not match the length its headers declared.
    pub fn request_length(what: &'static str) -> Self {
        Self {
            kind: FailureKind::RequestBodyError,
            stage: Stage::AfterWrite,
            what,
            source: None,
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what)
    }
}

impl std::error::Error for WireError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

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

/// Where each field's name and value sit in a head (offsets), kept by the
/// connection between responses so parsing allocates nothing.
pub type Spans = Vec<[u32; 4]>;

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
        let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut parsed,
            buf,
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
        if len > MAX_HEAD_BYTES {
            return Err(WireError::protocol("response head over 64 KiB"));
        }
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
        // of it (no copy, no allocation per value). Offsets fit in u32: the
        // head is at most 64 KiB.
        let base = buf.as_ptr() as usize;
        spans.clear();
        for field in parsed.headers.iter() {
            let name = (field.name.as_ptr() as usize - base) as u32;
            let value = (field.value.as_ptr() as usize - base) as u32;
            spans.push([
                name,
                name + field.name.len() as u32,
                value,
                value + field.value.len() as u32,
            ]);
        }
        let head = buf.split_to(len).freeze();
        let mut headers = HeaderMap::with_capacity(spans.len());
        let mut keep_alive = version == Version::HTTP_11;
        let mut saw_close = false;
        let mut hop_by_hop = false;
        let (mut lengths, mut length, mut transfer_encoding) = (0u32, None, false);
        for &[n0, n1, v0, v1] in spans.iter() {
            let (n0, n1, v0, v1) = (n0 as usize, n1 as usize, v0 as usize, v1 as usize);
            let name = HeaderName::from_bytes(&head[n0..n1])
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
            } else if crate::proxy::hop_by_hop::is_hop_by_hop(&name) {
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
            if is_chunked(&headers) {
                headers.remove(header::CONTENT_LENGTH);
                Framing::Chunked
            } else {
                Framing::Close
            }
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

/// The `Content-Length`: every value (comma lists included) digits only
/// and all equal, else `None`.
pub fn content_length(headers: &HeaderMap) -> Option<u64> {
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for part in value.to_str().ok()?.split(',') {
            let n = digits(part.trim().as_bytes())?;
            match length {
                None => length = Some(n),
                Some(m) if m == n => {}
                Some(_) => return None,
            }
        }
    }
    length
}

/// A decimal length: 1 to 19 digits (so no overflow), nothing else.
fn digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(value.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

/// The last coding of the last `Transfer-Encoding` line is `chunked`.
fn is_chunked(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .next_back()
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.rsplit(',').next())
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
}

fn has_token(value: &HeaderValue, token: &str) -> bool {
    value
        .to_str()
        .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
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
                    let Some(end) = find(buf, b"\r\n\r\n") else {
                        if buf.len() > MAX_TRAILER_BYTES {
                            return Err(WireError::protocol("trailers over 16 KiB"));
                        }
                        return Ok(Decoded::More);
                    };
                    if end + 4 > MAX_TRAILER_BYTES {
                        return Err(WireError::protocol("trailers over 16 KiB"));
                    }
                    let section = buf.split_to(end + 4);
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

    fn parse(bytes: &[u8], method: Method) -> Result<Option<ResponseHead>, WireError> {
        parse_response(&mut BytesMut::from(bytes), &method, &mut Spans::new())
    }

    fn framing(bytes: &str) -> Result<Framing, FailureKind> {
        parse(bytes.as_bytes(), Method::GET)
            .map(|h| h.expect("complete").framing)
            .map_err(|e| e.kind)
    }

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
        assert_eq!(
            ok("transfer-encoding: gzip, Chunked\r\n"),
            Ok(Framing::Chunked)
        );
        assert_eq!(
            ok("transfer-encoding: chunked, gzip\r\n"),
            Ok(Framing::Close)
        );
        assert_eq!(ok("transfer-encoding: gzip\r\n"), Ok(Framing::Close));
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
