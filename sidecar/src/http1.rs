//! HTTP/1.1 on the wire, both directions, without I/O. Towards endpoints:
//! the request head written, the response head parsed and its body's
//! framing decided (RFC 9112 §6.3), chunked bodies decoded
//! (`balance::client::http1` moves the bytes). From clients: the request
//! head parsed and its framing decided, the response head encoded
//! ([`server`]; `server::http1` moves the bytes). [`outgoing`] writes a
//! message's head and body for either side.
//!
//! The contract: the rules are hyper's client's and server's, which the
//! sidecar used before this codec (hyper 1.x `proto/h1/role.rs` and
//! `decode.rs`), so an endpoint sees the same requests and a client the same
//! responses, but for deliberate differences: towards endpoints the 64 KiB
//! head limit, the `Content-Length` removed from a chunked response, a
//! transfer coding other than `chunked` refused and a body of unknown
//! length sent whatever the method; both ways a bare LF in trailers refused
//! (all below; [`server`] has the client side's). Towards endpoints:
//! - Request framing: a body that has ended is no body (`Transfer-Encoding`
//!   dropped); a `Content-Length` already in the headers is kept; a body of
//!   known length gets one; a body of unknown length is chunked, except for
//!   `CONNECT`, whose bytes are the tunnel's (hyper sends none for `GET` and
//!   `HEAD` either, which lost a client's chunked `GET` body while one with
//!   a length went). A `Transfer-Encoding` in the headers means chunked, and
//!   then no `Content-Length`.
//! - Response framing, in this order: `101` ends the message (the bytes after
//!   it are the new protocol's), other `1xx` are skipped, `204`, `304` and a
//!   `HEAD` request's response have no body; `Transfer-Encoding: chunked` is
//!   chunked, and any other coding (`gzip, chunked`, `chunked, chunked`,
//!   `identity`) is a protocol error, as on the request side: the field is
//!   hop-by-hop, so the client would get the body with its coding unlabelled
//!   (hyper read such a body to the close, or as chunked without the gzip;
//!   HAProxy answers 502); HTTP/1.0 with `Transfer-Encoding` is an error;
//!   `Content-Length` values, comma lists included, must be digits and all
//!   equal; otherwise the body runs to the close. A chunked response's
//!   `Content-Length` is removed so the client is not told two lengths.
//! - Limits: 100 header fields (hyper's), 64 KiB of head (Envoy's 60 KiB
//!   default is the same order; hyper allowed 408 KiB, nginx and HAProxy cut
//!   at 4–16 KiB), chunk extensions 16 KiB per message, trailers 16 KiB
//!   and 100 fields (hyper's). Chunk and trailer lines end in CRLF; a bare
//!   LF inside an extension or a trailer line is refused (parsers disagree
//!   on what it ends: hyper reads trailers on to the next CRLF CRLF, taking
//!   the next message with them, nginx and HAProxy end the line there).
//!   Request bodies from clients are decoded by the same rules.
//!
//! The differential tests (`sidecar/tests/differential.rs`) hold these rules
//! against hyper, nginx and HAProxy on request-smuggling and framing corpora.
//!
//! The parts: [`request`] (framing decided, head and chunks encoded),
//! [`response`] (the head parsed, the body's framing decided), [`body`]
//! (the body decoded), [`server`] (the client side) and [`outgoing`]; this
//! file holds the limits, the error and the field rules all share.

mod body;
pub(crate) mod outgoing;
pub(crate) mod reads;
mod request;
mod response;
pub mod server;

use std::fmt;
use std::io;

use http::header::{self, HeaderName, HeaderValue, InvalidHeaderName};
use http::HeaderMap;

pub use self::body::{Decoded, Decoder, Framing};
pub use self::request::{
    declared_trailers, encode_chunk_size, encode_field, encode_fields, encode_head,
    encode_last_chunk, encode_request_line, request_framing, Encoding, RequestFraming,
};
pub use self::response::{parse_response, ResponseHead};
use crate::exchange::failure::{FailureKind, Stage};

/// What a connection keeps between the heads it parses, so parsing
/// allocates nothing and names are rarely parsed: where each field's name
/// and value sit in the head being parsed (offsets), and the names of the
/// fields of the heads before it, by position; and how far a request head
/// still coming in has been searched for its end.
///
/// Why the names: an endpoint or a client sends the same fields head after
/// head (nginx's five, a load generator's two). Parsing a name
/// (`HeaderName::from_bytes`: validation, lowercasing, the standard-name
/// lookup, an allocation for a custom name) costs more than comparing its
/// bytes with those of the name at the same position last time and cloning
/// that. A proxied request's instructions went down; its CPU time did not
/// move measurably (`e2e/bench/results/2026-12-05-issue18-fields.md`).
#[derive(Debug, Default)]
pub struct Spans {
    offsets: Vec<[u32; 4]>,
    /// At most [`MAX_HEADERS`]: a head has no more fields.
    names: Vec<KnownName>,
    /// How far the request head being read has come (`server` only).
    head: HeadScan,
}

/// A request head read over several reads: parsed when its first bytes come
/// (usually all of it), then only once its blank line is in, or the head
/// limit is reached. In between, only the new bytes are searched for the
/// blank line, and the request line is checked while it is short, so a
/// head's cost grows with its length, not with its length times the reads
/// it took (a 62 KB head in 64-byte reads was parsed whole a thousand
/// times).
#[derive(Debug, Default)]
struct HeadScan {
    /// Where the search for the blank line resumes; `None`: the head's
    /// bytes have not been looked at yet.
    from: Option<usize>,
    /// Bytes of empty lines skipped before the request line: they count
    /// against the head limit, as when httparse skipped them.
    skipped: usize,
    /// Bytes of the request line checked so far (`server::check_line`).
    line_checked: usize,
    /// Times httparse ran on this connection (tests count them).
    #[cfg(test)]
    parses: u32,
}

impl HeadScan {
    /// Ready for the next head.
    fn reset(&mut self) {
        self.from = None;
        self.skipped = 0;
        self.line_checked = 0;
    }
}

/// A name as it came on the wire (up to [`KnownName::RAW`] bytes), and
/// what it parsed to.
#[derive(Debug)]
struct KnownName {
    raw: [u8; KnownName::RAW],
    len: u8,
    name: HeaderName,
}

impl KnownName {
    /// Longer names are parsed every time: the common ones are shorter
    /// (`content-type` 12, `user-agent` 10, `x-forwarded-for` 15), and a
    /// slot stays 64 bytes.
    const RAW: usize = 24;

    fn new(raw: &[u8], name: &HeaderName) -> Option<Self> {
        let mut kept = [0; Self::RAW];
        kept.get_mut(..raw.len())?.copy_from_slice(raw);
        Some(Self {
            raw: kept,
            len: raw.len() as u8,
            name: name.clone(),
        })
    }
}

impl Spans {
    /// Nothing kept yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records where each of `fields` (parsed from `head`) sits in it, so
    /// that the head can be frozen once and every value be a slice of it (no
    /// copy, no allocation per value). Offsets fit in u32: a head is at most
    /// the head limit (1 MiB at most).
    fn record(&mut self, head: &[u8], fields: &[httparse::Header<'_>]) {
        let base = head.as_ptr() as usize;
        self.offsets.clear();
        for field in fields {
            let name = (field.name.as_ptr() as usize - base) as u32;
            let value = (field.value.as_ptr() as usize - base) as u32;
            self.offsets.push([
                name,
                name + field.name.len() as u32,
                value,
                value + field.value.len() as u32,
            ]);
        }
    }

    /// Times httparse ran on request heads.
    #[cfg(test)]
    pub(crate) fn head_parses(&self) -> u32 {
        self.head.parses
    }

    /// Fields recorded.
    fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Field `i`'s offsets: name start and end, value start and end.
    fn field(&self, i: usize) -> [usize; 4] {
        self.offsets[i].map(|o| o as usize)
    }

    /// Field `i`'s name, `raw` as it came: what field `i` parsed to in an
    /// earlier head if it came as the same bytes, else parsed and kept for
    /// the next head. Call with `i` from 0 up.
    fn name(&mut self, i: usize, raw: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
        if let Some(known) = self.names.get(i) {
            if known.raw[..usize::from(known.len)] == *raw {
                return Ok(known.name.clone());
            }
        }
        let name = HeaderName::from_bytes(raw)?;
        if let Some(known) = KnownName::new(raw, &name) {
            // Past the end only if an earlier field's name was too long to
            // keep: positions after it are not kept either.
            if i < self.names.len() {
                self.names[i] = known;
            } else if i == self.names.len() {
                // Room for this head's fields only: an idle client connection
                // keeps one or two names, not `Vec`'s first four slots.
                self.names.reserve_exact(self.offsets.len() - i);
                self.names.push(known);
            }
        }
        Ok(name)
    }
}

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

    /// A socket error, classified by its kind as on hyper's connections
    /// (`classify_io`).
    pub fn io(what: &'static str, e: io::Error) -> Self {
        let kind = crate::exchange::failure::classify_io(&e);
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

/// The `Transfer-Encoding` lines name one coding, `chunked`, and no other:
/// the only one the sidecar decodes. Anything else (`gzip, chunked`, chunked
/// twice, an empty list) would reach the next hop with its codings dropped,
/// so it is refused on both sides. Empty list elements do not count (RFC
/// 9110 §5.6.1).
fn only_chunked(headers: &HeaderMap) -> bool {
    let mut chunked = 0;
    for value in headers.get_all(header::TRANSFER_ENCODING) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        for coding in value.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            if !coding.eq_ignore_ascii_case("chunked") {
                return false;
            }
            chunked += 1;
        }
    }
    chunked == 1
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
