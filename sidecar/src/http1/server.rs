//! The server side: a client's request head parsed and its body's framing
//! decided, the response head encoded and its body's framing chosen.
//!
//! The contract: hyper 1.x's HTTP/1 server rules (`proto/h1/role.rs`,
//! `conn.rs`), which served the sidecar's clients before this codec, so a
//! client sees the same answers, but for the transfer codings and `Host`
//! (a proxy's rules, which hyper leaves to its user):
//! - Request framing (RFC 9112 §6.3): `Transfer-Encoding: chunked` is
//!   chunked, and a `Content-Length` beside it is dropped and the connection
//!   closes after the response. Any other coding, or `chunked` twice, is a
//!   `501` (RFC 9112 §6.1), nginx's and Envoy's answer: `chunked` is the one
//!   coding the sidecar decodes, and the field is hop-by-hop, so a `gzip`
//!   before it would reach the endpoint unlabelled (hyper took `gzip,
//!   chunked` as chunked and answered `400` to a list not ending in it).
//!   `Transfer-Encoding` on HTTP/1.0 is a `400`. `Content-Length` must be
//!   digits (no sign, no list) and every line equal, else `400`. Neither: no
//!   body.
//! - `Host`: a second line is a `400` (RFC 9112 §3.2; nginx's answer), so no
//!   hop after this one can pick another; an absolute-form target's
//!   authority (without userinfo) replaces the field's value (RFC 9112
//!   §3.2.2: a proxy sends the target's host, which is also the one the
//!   request is routed by).
//! - Keep-alive: HTTP/1.1 unless a `Connection` line says `close` (a later
//!   `keep-alive` does not undo it); HTTP/1.0 only with `keep-alive`.
//! - `Expect: 100-continue` (HTTP/1.1, a body to come) is answered when the
//!   body is first read; an `Upgrade` on HTTP/1.1, or `CONNECT`, may take the
//!   connection over once answered `101` or `2xx`.
//! - Limits: 100 fields and the configured head size (`431`), a target of
//!   at most 65,534 bytes (`414`); any other malformed head is a `400`. A
//!   head is parsed when its first bytes come and then once its blank line
//!   is in (or the limit is reached): however many reads it takes, its cost
//!   grows with its length only.
//! - Refusals name their kind in `x-reprise-error` ([`HeadError::kind`]:
//!   `malformed_request`, `bad_framing`, `duplicate_host`, `uri_too_long`,
//!   `header_too_large`, `too_many_headers`, `unsupported_transfer_coding`).
//! - Responses: `HTTP/1.0` to an HTTP/1.0 client; `date` added when
//!   missing; a body of known length gets `content-length`, one of unknown
//!   length is chunked (read to the close for HTTP/1.0); no body for `HEAD`,
//!   `204`, `304`, `1xx` and a `2xx` to `CONNECT`; `connection: keep-alive`
//!   for a kept HTTP/1.0 client and `connection: close` when the connection
//!   closes after it. Trailers are sent only in a chunked response to a
//!   request with `TE: trailers`, and only the fields its `Trailer` declares.

use std::mem::MaybeUninit;

use bytes::{Buf, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode, Uri, Version};

use super::{has_token, Encoding, Framing, Spans, MAX_HEADERS};

/// The longest request target (hyper's).
pub const MAX_TARGET_BYTES: usize = (u16::MAX - 1) as usize;

/// A request head as a client sent it.
#[derive(Debug)]
pub struct RequestHead {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    /// How its body is delimited: a length (0: none) or chunked.
    pub framing: Framing,
    /// The client lets the connection carry another request.
    pub keep_alive: bool,
    /// `Expect: 100-continue` on HTTP/1.1 with a body to come.
    pub expect_continue: bool,
    /// `CONNECT`, or an `Upgrade` on HTTP/1.1.
    pub upgrade: bool,
    /// `TE: trailers`: the response may carry trailers.
    pub trailers: bool,
}

/// A head that cannot be served, the status that says why and the error
/// kind the refusal names in `x-reprise-error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadError {
    pub status: StatusCode,
    pub what: &'static str,
    pub kind: &'static str,
}

impl HeadError {
    /// A head that breaks HTTP/1.1's grammar.
    const fn bad(what: &'static str) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            what,
            kind: "malformed_request",
        }
    }

    /// A body whose framing cannot be read one way only.
    const fn framing(what: &'static str) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            what,
            kind: "bad_framing",
        }
    }

    const fn too_large(what: &'static str) -> Self {
        Self {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            what,
            kind: "header_too_large",
        }
    }
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.what)
    }
}

/// Parses a request head off the front of `buf`, or `None` if more bytes
/// are needed; `max_head` bounds the bytes a head may take. Call again with
/// the same `spans` as more bytes come: they are searched for the head's end
/// where the last call stopped (`HeadScan` in `http1.rs`).
pub fn parse_request(
    buf: &mut BytesMut,
    max_head: usize,
    spans: &mut Spans,
) -> Result<Option<RequestHead>, HeadError> {
    // Empty lines before the request line go (RFC 9112 §2.2), counted.
    if matches!(buf.first(), Some(b'\r' | b'\n')) {
        let empty = empty_lines(buf);
        buf.advance(empty);
        spans.head.skipped += empty;
        if empty > 0 {
            spans.head.from = None;
        }
    }
    let limit = max_head.saturating_sub(spans.head.skipped);
    if limit == 0 {
        spans.head.reset();
        return Err(HeadError::too_large("request head over the limit"));
    }
    if buf.is_empty() {
        return Ok(None);
    }
    // Only the first `limit` bytes are parsed: a head longer than that gets
    // 431 however its bytes arrived, and an error inside the limit its own
    // status (hyper's answer depended on how much one read brought).
    let window = buf.len().min(limit);
    if let Some(from) = spans.head.from {
        if window < limit && !has_blank_line(&buf[..window], from) {
            spans.head.from = Some(window.saturating_sub(2));
            return check_line(buf, spans);
        }
    }
    parse_head(buf, window, limit, spans)
}

/// Bytes of a request line checked while its head is still coming: enough
/// for the method and the start of the target, so that a client not
/// speaking HTTP is refused at once.
const LINE_CHECK: usize = 256;

/// While a head is still coming, its request line (up to its LF, at most
/// [`LINE_CHECK`] bytes) is checked each time it has grown. The outcome
/// depends only on those bytes, so it is the same however they arrived: an
/// error further on is only acted on once the blank line or the limit
/// calls for the whole parse (a head that never ends gets no answer, fed
/// whole or in pieces).
fn check_line(buf: &[u8], spans: &mut Spans) -> Result<Option<RequestHead>, HeadError> {
    let bound = buf.len().min(LINE_CHECK);
    let line = buf[..bound]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(bound, |lf| lf + 1);
    if line <= spans.head.line_checked {
        return Ok(None);
    }
    spans.head.line_checked = line;
    let mut parsed = httparse::Request::new(&mut []);
    match httparse::ParserConfig::default().parse_request(&mut parsed, &buf[..line]) {
        Ok(_) => Ok(None),
        Err(e) => {
            spans.head.reset();
            Err(head_error(e, &parsed))
        }
    }
}

/// The refusal for httparse's error `e` on `parsed`.
fn head_error(e: httparse::Error, parsed: &httparse::Request<'_, '_>) -> HeadError {
    match e {
        httparse::Error::TooManyHeaders => HeadError {
            kind: "too_many_headers",
            ..HeadError::too_large("request head over 100 fields")
        },
        httparse::Error::Token if parsed.method.is_none() => HeadError::bad("invalid method"),
        httparse::Error::Token => HeadError::bad("invalid request target"),
        httparse::Error::Version => HeadError::bad("invalid HTTP version"),
        _ => HeadError::bad("malformed request head"),
    }
}

/// Bytes of complete empty lines (CRLF or LF) at the start of `buf`, as
/// httparse skips them.
fn empty_lines(buf: &[u8]) -> usize {
    let mut at = 0;
    loop {
        match buf.get(at..at + 2) {
            Some(b"\r\n") => at += 2,
            _ if buf.get(at) == Some(&b'\n') => at += 1,
            _ => return at,
        }
    }
}

/// `buf` holds a blank line (an LF, an optional CR, an LF) at or after
/// `from`: no head can be complete without one.
fn has_blank_line(buf: &[u8], from: usize) -> bool {
    let mut at = from;
    while let Some(lf) = buf
        .get(at..)
        .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
    {
        let lf = at + lf;
        match buf.get(lf + 1..lf + 3) {
            Some([b'\n', _]) | Some([b'\r', b'\n']) => return true,
            None if buf.get(lf + 1) == Some(&b'\n') => return true,
            _ => at = lf + 1,
        }
    }
    false
}

/// One httparse run over the first `window` bytes of `buf` (at most
/// `limit`), and the head taken off `buf` when it is complete.
fn parse_head(
    buf: &mut BytesMut,
    window: usize,
    limit: usize,
    spans: &mut Spans,
) -> Result<Option<RequestHead>, HeadError> {
    #[cfg(test)]
    {
        spans.head.parses += 1;
    }
    // Uninitialised, as in `parse_response`: zeroing 100 fields costs about
    // as much as parsing a typical head.
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut parsed,
        &buf[..window],
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(len)) => {
            spans.head.reset();
            len
        }
        Ok(httparse::Status::Partial) if buf.len() < limit => {
            // No blank line in what came so far (or httparse would have
            // completed or failed): the next search starts at its end.
            spans.head.from = Some(buf.len().saturating_sub(2));
            return Ok(None);
        }
        Ok(httparse::Status::Partial) => {
            spans.head.reset();
            return Err(HeadError::too_large("request head over the limit"));
        }
        // A head that has not ended yet is only refused for its request
        // line (`check_line`), as it would be if it came in pieces.
        Err(_) if buf.len() < limit && !has_blank_line(&buf[..window], 0) => {
            spans.head.from = Some(window.saturating_sub(2));
            return check_line(buf, spans);
        }
        Err(e) => {
            spans.head.reset();
            return Err(head_error(e, &parsed));
        }
    };
    let (Some(method), Some(target), Some(minor)) = (parsed.method, parsed.path, parsed.version)
    else {
        return Err(HeadError::bad("malformed request line"));
    };
    if target.len() > MAX_TARGET_BYTES {
        return Err(HeadError {
            status: StatusCode::URI_TOO_LONG,
            what: "request target over 65,534 bytes",
            kind: "uri_too_long",
        });
    }
    let method =
        Method::from_bytes(method.as_bytes()).map_err(|_| HeadError::bad("invalid method"))?;
    let target_at = target.as_ptr() as usize - buf.as_ptr() as usize;
    let target_end = target_at + target.len();
    spans.record(buf, parsed.headers);
    let http11 = minor == 1;
    // The head frozen once: the target and every value are slices of it.
    let head = buf.split_to(len).freeze();
    let uri = Uri::from_maybe_shared(head.slice(target_at..target_end))
        .map_err(|_| HeadError::bad("invalid request target"))?;
    // An absolute-form target names the host: a proxy sends it as `Host`,
    // whatever `Host` said (RFC 9112 §3.2.2), so the host the request is
    // routed by is the one the endpoint sees.
    let target_host = uri.scheme().and(uri.authority()).map(|a| {
        let a = a.as_str();
        a.rfind('@').map_or(a, |at| &a[at + 1..])
    });
    let mut headers = HeaderMap::with_capacity(spans.len());
    let mut keep_alive = http11;
    let mut saw_close = false;
    let mut saw_host = false;
    let (mut length, mut saw_length) = (None::<u64>, false);
    let mut transfer_encoding = false;
    let mut expect_continue = false;
    let mut upgrade = method == Method::CONNECT;
    let mut trailers = false;
    for i in 0..spans.len() {
        let [n0, n1, v0, v1] = spans.field(i);
        let name = spans
            .name(i, &head[n0..n1])
            .map_err(|_| HeadError::bad("invalid header name"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(v0..v1))
            .map_err(|_| HeadError::bad("invalid header value"))?;
        match name {
            header::HOST => {
                // Two lines would leave the next hop to choose (RFC 9112
                // §3.2: 400).
                if saw_host {
                    return Err(HeadError {
                        kind: "duplicate_host",
                        ..HeadError::bad("more than one Host line")
                    });
                }
                saw_host = true;
                if let Some(host) = target_host {
                    if !value.as_bytes().eq_ignore_ascii_case(host.as_bytes()) {
                        headers.append(name, host_value(host)?);
                        continue;
                    }
                }
            }
            header::TRANSFER_ENCODING => {
                if !http11 {
                    return Err(HeadError::framing(
                        "HTTP/1.0 request with Transfer-Encoding",
                    ));
                }
                transfer_encoding = true;
                // Chunked framing wins: a length already kept goes.
                if length.take().is_some() {
                    headers.remove(header::CONTENT_LENGTH);
                }
            }
            header::CONTENT_LENGTH => {
                saw_length = true;
                if transfer_encoding {
                    continue;
                }
                let n = super::digits(value.as_bytes())
                    .ok_or(HeadError::framing("invalid Content-Length"))?;
                match length {
                    Some(m) if m != n => {
                        return Err(HeadError::framing("differing Content-Length"))
                    }
                    // The same length again: one line is enough.
                    Some(_) => continue,
                    None => length = Some(n),
                }
            }
            header::CONNECTION => {
                // Once any line asks to close, a later `keep-alive` does not undo it.
                if saw_close || has_token(&value, "close") {
                    saw_close = true;
                    keep_alive = false;
                } else if !keep_alive {
                    keep_alive = has_token(&value, "keep-alive");
                }
            }
            header::EXPECT => {
                expect_continue = value.as_bytes().eq_ignore_ascii_case(b"100-continue");
            }
            header::UPGRADE => upgrade = http11,
            header::TE => trailers |= has_token(&value, "trailers"),
            _ => {}
        }
        headers.append(name, value);
    }
    // `chunked` alone: a coding the sidecar cannot decode is one the
    // endpoint would get unlabelled (RFC 9112 §6.1: 501; nginx and Envoy
    // answer any other coding so).
    if transfer_encoding && !super::only_chunked(&headers) {
        return Err(HeadError {
            status: StatusCode::NOT_IMPLEMENTED,
            what: "a transfer coding other than chunked",
            kind: "unsupported_transfer_coding",
        });
    }
    if transfer_encoding && saw_length {
        // Its sender and the next hop could frame the next request
        // differently: the connection ends with this one.
        keep_alive = false;
    }
    let framing = if transfer_encoding {
        Framing::Chunked
    } else {
        Framing::Length(length.unwrap_or(0))
    };
    Ok(Some(RequestHead {
        method,
        uri,
        version: if http11 {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        },
        headers,
        expect_continue: expect_continue && http11 && framing != Framing::Length(0),
        framing,
        keep_alive,
        upgrade,
        trailers,
    }))
}

fn last_coding_is_chunked(value: &HeaderValue) -> bool {
    value
        .to_str()
        .ok()
        .and_then(|s| s.rsplit(',').next())
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
}

/// `Host`'s value for an absolute-form target's `host`: out of line, as a
/// request whose `Host` disagrees with its target is rare.
#[cold]
#[inline(never)]
fn host_value(host: &str) -> Result<HeaderValue, HeadError> {
    HeaderValue::from_str(host).map_err(|_| HeadError::bad("invalid request target"))
}

/// What the response's request was, as far as the response head cares.
#[derive(Debug, Clone, Copy)]
pub struct Exchange {
    /// The request was HTTP/1.0.
    pub http10: bool,
    pub head: bool,
    pub connect: bool,
    /// The connection may carry another request after this response.
    pub keep_alive: bool,
    /// The request said `TE: trailers`.
    pub trailers: bool,
}

/// How the response goes on the wire, as its head decided.
#[derive(Debug, PartialEq, Eq)]
pub struct ResponseFraming {
    /// How its body is delimited.
    pub encoding: Encoding,
    /// The connection closes after it.
    pub last: bool,
    /// `101`, or `2xx` to `CONNECT`: the connection changes hands after the head.
    pub upgrade: bool,
    /// Trailer fields it may send (chunked, `TE: trailers`, declared).
    pub trailers: Vec<HeaderName>,
}

/// The response body's length as the head is written: ended already,
/// known, or unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    Ended,
    Known(u64),
    Unknown,
}

/// Encodes the response head into `dst` and decides its framing, as hyper's
/// server does (module docs). An invalid `Content-Length` among several is a
/// `500`, the head not written.
pub fn encode_response(
    dst: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    body: BodyLength,
    exchange: Exchange,
) -> Result<ResponseFraming, HeadError> {
    let start = dst.len();
    let code = status.as_u16();
    let connect_ok = exchange.connect && status.is_success();
    let upgrade = code == 101 || connect_ok;
    let informational = (100..200).contains(&code);
    let no_length = informational || connect_ok || code == 204 || code == 304;
    let can_body = !(exchange.head || no_length);
    let can_chunk = can_body && !exchange.http10;
    let mut last = !exchange.keep_alive;

    dst.reserve(64 + headers.len() * 32);
    if !exchange.http10 && code == 200 {
        dst.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        dst.extend_from_slice(if exchange.http10 {
            b"HTTP/1.0 "
        } else {
            b"HTTP/1.1 "
        });
        dst.extend_from_slice(status.as_str().as_bytes());
        dst.push(b' ');
        // Many parsers expect a reason phrase.
        dst.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
        dst.extend_from_slice(b"\r\n");
    }

    let mut encoding = None::<Encoding>;
    let mut wrote_date = false;
    let mut connection = None::<bool>; // Some(says_close) once written
    let mut declared = Vec::new();
    let mut chunked_last = true;
    for (name, value) in headers {
        match *name {
            header::CONTENT_LENGTH => {
                if connect_ok || encoding == Some(Encoding::Chunked) {
                    continue;
                }
                match body {
                    BodyLength::Known(n) => {
                        if encoding.is_some() {
                            continue;
                        }
                        encoding = Some(Encoding::Length(n));
                    }
                    BodyLength::Unknown => {
                        let Some(n) = super::digits(value.as_bytes()) else {
                            dst.truncate(start);
                            return Err(HeadError {
                                status: StatusCode::INTERNAL_SERVER_ERROR,
                                what: "response with an invalid Content-Length",
                                kind: "invalid_response",
                            });
                        };
                        match encoding {
                            Some(Encoding::Length(m)) if m != n => {
                                dst.truncate(start);
                                return Err(HeadError {
                                    status: StatusCode::INTERNAL_SERVER_ERROR,
                                    what: "response with differing Content-Length",
                                    kind: "invalid_response",
                                });
                            }
                            Some(_) => continue,
                            None => encoding = Some(Encoding::Length(n)),
                        }
                    }
                    // No body: a length stays only on a `HEAD` response
                    // (the one the body would have had).
                    BodyLength::Ended if exchange.head => {
                        if encoding.is_some() {
                            continue;
                        }
                        encoding = Some(Encoding::Length(0));
                    }
                    BodyLength::Ended => continue,
                }
            }
            header::TRANSFER_ENCODING => {
                if !can_chunk || matches!(encoding, Some(Encoding::Length(_))) {
                    continue;
                }
                encoding = Some(Encoding::Chunked);
                chunked_last = last_coding_is_chunked(value);
            }
            header::CONNECTION => {
                let close = has_token(value, "close");
                last |= close;
                connection = Some(connection.unwrap_or(false) || close);
            }
            header::DATE => wrote_date = true,
            header::TRAILER => {
                if !can_chunk {
                    continue;
                }
                if exchange.trailers {
                    declared.extend(
                        value
                            .to_str()
                            .into_iter()
                            .flat_map(|s| s.split(','))
                            .filter_map(|s| HeaderName::from_bytes(s.trim().as_bytes()).ok()),
                    );
                }
            }
            _ => {}
        }
        super::encode_field(dst, name, value);
    }
    if encoding == Some(Encoding::Chunked) && !chunked_last {
        dst.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    let encoding = match encoding {
        Some(e) => e,
        None => match body {
            BodyLength::Unknown if can_chunk => {
                dst.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Encoding::Chunked
            }
            BodyLength::Unknown if can_body => Encoding::Close,
            BodyLength::Unknown => Encoding::Length(0),
            BodyLength::Known(n) if n > 0 && !no_length => {
                use std::io::Write;
                let _ = write!(dst, "content-length: {n}\r\n");
                Encoding::Length(n)
            }
            BodyLength::Known(_) | BodyLength::Ended => {
                if !no_length && !exchange.head {
                    dst.extend_from_slice(b"content-length: 0\r\n");
                }
                Encoding::Length(0)
            }
        },
    };
    let encoding = if can_body {
        encoding
    } else {
        Encoding::Length(0)
    };
    if encoding == Encoding::Close {
        last = true;
    }
    // hyper's version fix-ups: a kept HTTP/1.0 client is told so; an
    // HTTP/1.1 one is told when the connection closes after this.
    if !upgrade {
        if exchange.http10 && !last && connection.is_none() {
            dst.extend_from_slice(b"connection: keep-alive\r\n");
        } else if !exchange.http10 && last && connection != Some(true) {
            dst.extend_from_slice(b"connection: close\r\n");
        }
    }
    if !wrote_date {
        dst.extend_from_slice(b"date: ");
        dst.extend_from_slice(crate::clock::date().as_bytes());
        dst.extend_from_slice(b"\r\n");
    }
    dst.extend_from_slice(b"\r\n");
    Ok(ResponseFraming {
        encoding,
        last: last || upgrade,
        upgrade,
        trailers: if encoding == Encoding::Chunked {
            declared
        } else {
            Vec::new()
        },
    })
}

/// A whole local answer to a head that could not be served, naming its
/// kind in `x-reprise-error` (the connection closes after it).
pub fn encode_refusal(dst: &mut Vec<u8>, error: &HeadError) {
    let exchange = Exchange {
        http10: false,
        head: false,
        connect: false,
        keep_alive: false,
        trailers: false,
    };
    let mut headers = HeaderMap::new();
    headers.insert(ERROR_HEADER, HeaderValue::from_static(error.kind));
    let _ = encode_response(dst, error.status, &headers, BodyLength::Ended, exchange);
}

/// Response header naming the local failure the sidecar answered for, here
/// and in every answer of `proxy::local`. A `HeaderName`, not a `&str`:
/// every response is checked for it, and a lookup by string parses the
/// name first (measured:
/// `e2e/bench/results/2026-12-04-issue18-h2c-reference.md`).
pub const ERROR_HEADER: HeaderName = HeaderName::from_static("x-reprise-error");

#[cfg(test)]
mod tests;
