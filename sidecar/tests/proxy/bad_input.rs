//! Bad input from both sides: malformed, oversized, ambiguous and slow client
//! requests written by hand over raw TCP, and garbage `Retry-After` values from
//! the upstream. The sidecar must answer (or close) without panicking, without
//! unbounded memory or waiting, and without passing anything ambiguous on: the
//! upstream sees nothing, or exactly one well-framed request.

use std::time::{Duration, Instant};

use reprise_sidecar::HEADER_READ_TIMEOUT;
use reprise_testkit::http1::{self, Response};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::support::{
    api, retries, retry_after, Action, Config, ProxyConfig, Retries, Sidecar, Upstream,
};

/// Bound on one raw exchange: every case here is decided in well under this.
const EXCHANGE: Duration = Duration::from_secs(10);

/// What came back on one raw connection.
#[derive(Debug)]
struct Raw {
    /// Every byte the sidecar sent before closing (or resetting) the connection.
    bytes: Vec<u8>,
    /// Bytes of the request the sidecar accepted before it closed (the write
    /// stopped at the first error).
    written: usize,
}

impl Raw {
    /// The responses in `bytes`; panics on one that is not well framed.
    fn responses(&self) -> Vec<Response> {
        http1::parse_responses(&self.bytes)
            .unwrap_or_else(|e| panic!("not well-framed HTTP responses ({e}): {:?}", self.text()))
    }

    /// The status of the only response; panics unless exactly one came back.
    fn status(&self) -> u16 {
        let responses = self.responses();
        assert_eq!(responses.len(), 1, "one response: {:?}", self.text());
        responses[0].status
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).to_string()
    }
}

/// Writes `request` to the sidecar and reads until it closes the connection.
/// Panics if it neither answers nor closes within [`EXCHANGE`].
async fn exchange(sidecar: &Sidecar, request: &[u8]) -> Raw {
    exchange_stream(sidecar, std::iter::once(request.to_vec())).await
}

/// Like [`exchange`], writing `chunks` one after another until a write fails.
async fn exchange_stream(
    sidecar: &Sidecar,
    chunks: impl Iterator<Item = Vec<u8>> + Send + 'static,
) -> Raw {
    let stream = TcpStream::connect(sidecar.addr)
        .await
        .expect("connect sidecar");
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        let mut written = 0;
        for c in chunks {
            // The sidecar may close (and reset) before taking it all: that is an answer too.
            if wr.write_all(&c).await.is_err() {
                break;
            }
            written += c.len();
        }
        // Handed back rather than dropped: a half-close could read as the end of the request.
        (written, wr)
    });
    let read = async {
        let mut bytes = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return bytes,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
            }
        }
    };
    let bytes = timeout(EXCHANGE, read)
        .await
        .expect("the sidecar neither answered nor closed the connection");
    let (written, _wr) = timeout(EXCHANGE, writer)
        .await
        .expect("writer finished")
        .expect("writer task");
    Raw { bytes, written }
}

/// Gives a request the sidecar might still forward time to reach the upstream,
/// so "the upstream saw nothing" is not read too early.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(200)).await;
}

async fn plain_sidecar() -> (Upstream, Sidecar) {
    let up = Upstream::always(Action::Echo).await;
    let sidecar = Sidecar::start(api(&[&up])).await;
    (up, sidecar)
}

/// Sends each request on its own connection to a [`plain_sidecar`], expects
/// 400 for each, and that none of them reached the upstream; returns both.
async fn refused(requests: &[&[u8]]) -> (Upstream, Sidecar) {
    let (up, sidecar) = plain_sidecar().await;
    for request in requests {
        let r = exchange(&sidecar, request).await;
        assert_eq!(r.status(), 400, "{:?}", String::from_utf8_lossy(request));
    }
    settle().await;
    assert_eq!(up.count(), 0);
    (up, sidecar)
}

/// `POST /` with each of `heads` (header lines), then `body`.
fn posts_with(heads: &[&str], body: &str) -> Vec<String> {
    heads
        .iter()
        .map(|head| format!("POST / HTTP/1.1\r\nhost: api\r\n{head}\r\n{body}"))
        .collect()
}

#[tokio::test]
async fn malformed_request_lines_get_400_and_never_reach_the_upstream() {
    refused(&[
        b"NOT A REQUEST LINE\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET / HTTP/9.9\r\nhost: api\r\n\r\n",
        b"GET / HTTP/1.1 trailing\r\nhost: api\r\n\r\n",
        b"G\x00T / HTTP/1.1\r\nhost: api\r\n\r\n",
        b"GET /\x7f HTTP/1.1\r\nhost: api\r\n\r\n",
    ])
    .await;
}

#[tokio::test]
async fn a_header_line_without_a_colon_gets_400() {
    refused(&[
        b"GET / HTTP/1.1\r\nhost: api\r\nNoColonHere\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: api\r\nx-name value\r\n\r\n",
        // Obsolete line folding (RFC 9112 §5.2): refused, not glued to the previous header.
        b"GET / HTTP/1.1\r\nhost: api\r\nx-a: 1\r\n folded\r\n\r\n",
    ])
    .await;
}

#[tokio::test]
async fn oversized_headers_get_431() {
    let (up, sidecar) = plain_sidecar().await;

    // Many small headers within the head limit: too many to parse.
    let mut many = b"GET / HTTP/1.1\r\nhost: api\r\n".to_vec();
    for i in 0..150 {
        many.extend_from_slice(format!("x-h{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert_eq!(exchange(&sidecar, &many).await.status(), 431);

    // 200 KiB of headers against the default 64 KiB head limit: the sidecar
    // stops reading at the limit, answers and closes. (Its answer is sent
    // before any reset that closing on unread bytes causes, so it is read first.)
    let mut big = b"GET / HTTP/1.1\r\nhost: api\r\n".to_vec();
    for _ in 0..200 {
        big.extend_from_slice(b"x-big: ");
        big.extend_from_slice(&[b'a'; 1016]);
        big.extend_from_slice(b"\r\n");
    }
    big.extend_from_slice(b"\r\n");
    let r = exchange(&sidecar, &big).await;
    assert_eq!(r.status(), 431, "{}", r.text());
    settle().await;
    assert_eq!(up.count(), 0);
}

#[tokio::test]
async fn an_endless_header_stream_is_cut_off_not_buffered() {
    let (up, sidecar) = plain_sidecar().await;
    // 64 MiB of header lines, far more than the socket buffers on both sides
    // can hold: the writes can only all succeed if the sidecar keeps reading
    // (and buffering) them. It must stop at its 64 KiB head limit and close.
    let start = b"GET / HTTP/1.1\r\nhost: api\r\n".to_vec();
    let mut line = b"x-flood: ".to_vec();
    line.extend_from_slice(&[b'a'; 1021]);
    line.extend_from_slice(b"\r\n");
    let chunk: Vec<u8> = line.repeat(64); // 66 KiB, cloned lazily as it is written
    let count = (64 << 20) / chunk.len();
    let total = start.len() + count * chunk.len();
    let chunks = std::iter::once(start).chain(std::iter::repeat_n(chunk, count));
    let started = Instant::now();
    let r = exchange_stream(&sidecar, chunks).await;
    assert!(
        r.written < total,
        "the sidecar read all {total} bytes of a head without closing"
    );
    assert_eq!(r.status(), 431);
    assert!(started.elapsed() < EXCHANGE);
    settle().await;
    assert_eq!(up.count(), 0);
}

#[tokio::test]
async fn an_oversized_uri_is_refused() {
    // Default 64 KiB head limit, a 100 KiB URI: the head is over the limit,
    // 431 however the bytes arrive (only the first 64 KiB are parsed), never
    // forwarded.
    let (up, sidecar) = plain_sidecar().await;
    let uri = format!("/{}", "a".repeat(100 * 1024));
    let request = format!("GET {uri} HTTP/1.1\r\nhost: api\r\n\r\n");
    let r = exchange(&sidecar, request.as_bytes()).await;
    assert_eq!(r.status(), 431, "{}", r.text());
    settle().await;
    assert_eq!(up.count(), 0);

    // A head limit large enough to read it whole: the 65,534-byte URI limit
    // (hyper's) answers 414.
    let up = Upstream::always(Action::Echo).await;
    let sidecar = Sidecar::start(
        Config::from(api(&[&up])).proxy(ProxyConfig::new().max_request_header_bytes(262144)),
    )
    .await;
    let r = exchange(&sidecar, request.as_bytes()).await;
    assert_eq!(r.status(), 414, "{}", r.text());
    settle().await;
    assert_eq!(up.count(), 0);
}

#[tokio::test]
async fn an_invalid_chunk_size_gets_400_and_is_never_retried() {
    let bad = b"POST /orders HTTP/1.1\r\nhost: api\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n";
    // Buffered for replay: the body fails while it is read, before any attempt.
    let retry_posts = || {
        retries()
            .attempts(3)
            .retry_post(true)
            .backoff_base_ms(1)
            .backoff_cap_ms(1)
            .reuse_endpoints(true)
    };
    let a = Upstream::always(Action::Reply(503)).await;
    let b = Upstream::always(Action::Echo).await;
    let sidecar =
        Sidecar::start(api(&[&a, &b]).retries(retry_posts().buffer_max_bytes(1024))).await;
    let r = exchange(&sidecar, bad).await;
    let responses = r.responses();
    assert_eq!(responses.len(), 1, "{}", r.text());
    assert_eq!(responses[0].status, 400);
    assert_eq!(
        responses[0].header("x-reprise-error"),
        Some("request_body_error"),
        "{:?}",
        responses[0].headers
    );
    // Streamed (over the replay cap): the first attempt is under way when the
    // framing breaks. The body error is the client's: answered 400, never
    // retried, and not held against the endpoint (one failure would eject it).
    let c = Upstream::always(Action::Reply(503)).await;
    let d = Upstream::always(Action::Echo).await;
    let streaming = Sidecar::start(
        api(&[&c, &d])
            .consecutive_failures(1)
            .retries(retry_posts().buffer_max_bytes(0)),
    )
    .await;
    let r = exchange(&streaming, bad).await;
    assert_eq!(r.status(), 400, "{}", r.text());
    for e in &streaming.stats("api").endpoints {
        assert_eq!(
            e.ejections, 0,
            "{:?} ejected for the client's error",
            e.addr
        );
    }
    settle().await;
    assert_eq!(
        a.count() + b.count() + c.count() + d.count(),
        0,
        "no upstream received a complete request"
    );
    assert_eq!(
        sidecar.outcomes("api", "exhausted") + streaming.outcomes("api", "exhausted"),
        0
    );
    assert_eq!(
        sidecar.outcomes("api", "recovered") + streaming.outcomes("api", "recovered"),
        0
    );
}

#[tokio::test]
async fn content_length_with_chunked_is_read_as_chunked_and_the_smuggled_request_is_dropped() {
    // Both orders of the two headers. hyper drops Content-Length, decodes the
    // chunked body, and closes the connection after answering, so the bytes
    // after the chunked body are never parsed as a second request.
    for (i, head) in [
        "content-length: 4\r\ntransfer-encoding: chunked\r\n",
        "transfer-encoding: chunked\r\ncontent-length: 4\r\n",
        "Content-Length: 64\r\nTransfer-Encoding: chunked\r\n",
    ]
    .into_iter()
    .enumerate()
    {
        let (up, sidecar) = plain_sidecar().await;
        let request = format!(
            "POST /a HTTP/1.1\r\nhost: api\r\n{head}\r\n5\r\nhello\r\n0\r\n\r\n\
             GET /smuggled HTTP/1.1\r\nhost: api\r\n\r\n"
        );
        let r = exchange(&sidecar, request.as_bytes()).await;
        let responses = r.responses();
        assert_eq!(
            responses.len(),
            1,
            "case {i}: exactly one answer: {}",
            r.text()
        );
        assert_eq!(responses[0].status, 200, "case {i}");
        assert_eq!(responses[0].body, b"hello", "case {i}: the chunked body");
        settle().await;
        let got = up.received();
        assert_eq!(got.len(), 1, "case {i}: nothing smuggled: {got:?}");
        assert_eq!(got[0].body, b"hello");
        let names: Vec<&str> = got[0].headers.iter().map(|(k, _)| k.as_str()).collect();
        assert!(
            !(names.contains(&"content-length") && names.contains(&"transfer-encoding")),
            "case {i}: the upstream saw both framings: {names:?}"
        );
        assert!(
            names.iter().filter(|n| **n == "content-length").count() <= 1,
            "case {i}: {names:?}"
        );
        if let Some(v) = got[0].header("content-length") {
            assert_eq!(v, "5", "case {i}: a length, if any, is the real one");
        }
    }
}

#[tokio::test]
async fn a_transfer_coding_other_than_chunked_gets_501_and_is_never_forwarded() {
    // RFC 9112 §6.1: a coding the server does not understand is a 501. The
    // sidecar understands `chunked` alone, as nginx and Envoy do: `gzip,
    // chunked` was once read as chunked and forwarded as identity bytes.
    let (up, sidecar) = plain_sidecar().await;
    for coding in [
        "gzip, chunked",
        "gzip",
        "chunked, identity",
        "identity",
        "chunked, chunked",
        "x-custom, chunked",
    ] {
        let request = format!(
            "POST / HTTP/1.1\r\nhost: api\r\nconnection: close\r\ntransfer-encoding: {coding}\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        let r = exchange(&sidecar, request.as_bytes()).await;
        let responses = r.responses();
        assert_eq!(responses.len(), 1, "{coding}: {}", r.text());
        assert_eq!(responses[0].status, 501, "{coding}");
        assert_eq!(
            responses[0].header("x-reprise-error"),
            Some("unsupported_transfer_coding"),
            "{coding}"
        );
    }
    // Two lines of `chunked` are chunked twice.
    let twice = b"POST / HTTP/1.1\r\nhost: api\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    assert_eq!(exchange(&sidecar, twice).await.status(), 501);
    settle().await;
    assert_eq!(up.count(), 0);
    // HTTP/1.0 has no chunked coding at all: a framing error, not a coding.
    refused(&[
        b"POST / HTTP/1.0\r\nhost: api\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ])
    .await;
}

#[tokio::test]
async fn a_bare_lf_in_the_trailers_gets_400_and_closes_before_the_next_request() {
    // Parsers disagree on where such a trailer section ends (hyper reads on
    // to the next CRLF CRLF, swallowing the pipelined GET; nginx ends it at
    // the blank line): refused, and nothing after it is read as a request.
    let (up, sidecar) = plain_sidecar().await;
    let request = b"POST /first HTTP/1.1\r\nhost: api\r\ntransfer-encoding: chunked\r\n\r\n\
        3\r\nabc\r\n0\r\nX-T: y\n\r\n\
        GET /second HTTP/1.1\r\nhost: api\r\n\r\n";
    let r = exchange(&sidecar, request).await;
    let responses = r.responses();
    assert_eq!(
        responses.len(),
        1,
        "one answer, then the close: {}",
        r.text()
    );
    assert_eq!(responses[0].status, 400, "{}", r.text());
    assert_eq!(
        responses[0].header("x-reprise-error"),
        Some("request_body_error")
    );
    settle().await;
    let got = up.received();
    assert!(
        got.iter().all(|r| r.path != "/second"),
        "the next request was read: {got:?}"
    );
    // The same trailer with CRLF is fine, and so is what follows it.
    let request = b"POST /first HTTP/1.1\r\nhost: api\r\ntransfer-encoding: chunked\r\n\r\n\
        3\r\nabc\r\n0\r\nX-T: y\r\n\r\n\
        GET /second HTTP/1.1\r\nhost: api\r\nconnection: close\r\n\r\n";
    let r = exchange(&sidecar, request).await;
    let statuses: Vec<u16> = r.responses().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200], "{}", r.text());
}

#[tokio::test]
async fn a_get_body_is_forwarded_however_it_is_framed() {
    // One rule for every framing: a body the client sent goes on (nginx and
    // HAProxy forward both); a chunked one on a GET was once dropped while
    // one with a length went.
    let (up, sidecar) = plain_sidecar().await;
    for (framing, body) in [
        ("transfer-encoding: chunked", "5\r\nhello\r\n0\r\n\r\n"),
        ("content-length: 5", "hello"),
    ] {
        let request = format!(
            "GET /search HTTP/1.1\r\nhost: api\r\nconnection: close\r\n{framing}\r\n\r\n{body}"
        );
        let r = exchange(&sidecar, request.as_bytes()).await;
        let responses = r.responses();
        assert_eq!(responses.len(), 1, "{framing}: {}", r.text());
        assert_eq!(responses[0].status, 200, "{framing}");
        assert_eq!(responses[0].body, b"hello", "{framing}: echoed");
    }
    let got = up.received();
    assert_eq!(got.len(), 2);
    for r in &got {
        assert_eq!(r.body, b"hello", "{:?}", r.headers);
    }
}

#[tokio::test]
async fn conflicting_content_lengths_get_400() {
    let posts = posts_with(
        &[
            "content-length: 5\r\ncontent-length: 6\r\n",
            "content-length: 5, 6\r\n",
            "content-length: -5\r\n",
            "content-length: +5\r\n",
            "content-length: 99999999999999999999999\r\n",
        ],
        "hello!",
    );
    let requests: Vec<&[u8]> = posts.iter().map(String::as_bytes).collect();
    let (up, sidecar) = refused(&requests).await;

    // Repeated equal values are one length (RFC 9110 §8.6), forwarded once.
    let request = "POST / HTTP/1.1\r\nhost: api\r\nconnection: close\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\nhello";
    let r = exchange(&sidecar, request.as_bytes()).await;
    assert_eq!(r.status(), 200, "{}", r.text());
    let got = up.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, b"hello");
    assert_eq!(
        got[0].header_values("content-length"),
        ["5"],
        "one content-length upstream"
    );
}

/// Two retries with a 1-5 ms backoff that may go back to the same endpoint.
fn quick_reuse() -> Retries {
    retries()
        .attempts(2)
        .backoff_base_ms(1)
        .backoff_cap_ms(5)
        .reuse_endpoints(true)
}

/// One endpoint answering `status` with `Retry-After: value`, behind `retries`.
async fn busy_behind_retries(status: u16, value: &str, retries: Retries) -> (Upstream, Sidecar) {
    let up = Upstream::always(retry_after(status, value, "busy")).await;
    let sidecar = Sidecar::start(api(&[&up]).retries(retries)).await;
    (up, sidecar)
}

#[tokio::test]
async fn a_garbage_retry_after_falls_back_to_the_backoff() {
    for value in [
        "-5",
        "99999999999999999999",
        "Wed, 21 Oct 2015",
        "",
        "1.5",
        "0x10",
        "ÿ",
        "4294967296 4294967296",
    ] {
        for status in [429, 503] {
            let (a, sidecar) =
                busy_behind_retries(status, value, quick_reuse().total_deadline_ms(2000)).await;
            let started = Instant::now();
            let r = timeout(Duration::from_secs(5), sidecar.send("GET", "api", "/", b""))
                .await
                .unwrap_or_else(|_| panic!("Retry-After {value:?} hung the request"));
            assert_eq!(r.status, status, "{value:?}: the last answer is passed on");
            assert_eq!(
                a.count(),
                3,
                "{value:?}: ignored, so the normal backoff retried twice"
            );
            assert!(
                started.elapsed() < Duration::from_millis(1000),
                "{value:?} slept: {:?}",
                started.elapsed()
            );
        }
    }
}

#[tokio::test]
async fn a_huge_but_well_formed_retry_after_ends_the_retries_at_once() {
    // Ten digits parse (317 years); retry_after_max_ms (default 30 s) refuses it.
    let (a, sidecar) = busy_behind_retries(503, "9999999999", quick_reuse()).await;
    let r = timeout(Duration::from_secs(5), sidecar.send("GET", "api", "/", b""))
        .await
        .expect("no sleep for the Retry-After");
    assert_eq!(r.status, 503);
    assert_eq!(a.count(), 1, "no retry");
    assert_eq!(sidecar.outcomes("api", "exhausted"), 1);
}

/// Reads until the sidecar closes; panics if `whose` connection stays open
/// well past the header read timeout.
async fn until_closed(rd: &mut (impl AsyncRead + Unpin), whose: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    let _ = timeout(
        HEADER_READ_TIMEOUT + Duration::from_secs(10),
        rd.read_to_end(&mut bytes),
    )
    .await
    .unwrap_or_else(|_| {
        panic!("the sidecar kept {whose} connection open past its header read timeout")
    });
    bytes
}

/// `prefix` one byte every 200 ms, then (with `endless`) more header bytes at
/// the same pace: each read makes progress, so only a deadline on the whole
/// head ends it. Returns when the sidecar closed, and what it sent.
async fn slowloris(sidecar: &Sidecar, prefix: &[u8], endless: bool) -> (Duration, Vec<u8>) {
    let stream = TcpStream::connect(sidecar.addr).await.expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    let started = Instant::now();
    let prefix = prefix.to_vec();
    let writer = tokio::spawn(async move {
        let tail = std::iter::repeat_n(b'a', if endless { usize::MAX } else { 0 });
        for b in prefix.iter().copied().chain(tail) {
            if wr.write_all(&[b]).await.is_err() {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Then silence, with the connection held open.
        Some(wr)
    });
    let bytes = until_closed(&mut rd, "a slow client's").await;
    writer.abort();
    (started.elapsed(), bytes)
}

#[tokio::test]
async fn slow_and_silent_clients_are_cut_off_at_the_header_read_timeout() {
    let (up, sidecar) = plain_sidecar().await;
    // All at once, so the test waits for the timeout once.
    let ((headers, headers_sent), (preface, _), (silent, silent_sent), (idle, idle_sent)) = tokio::join!(
        // Headers one byte at a time, never finished.
        slowloris(&sidecar, b"GET / HTTP/1.1\r\nhost: api\r\nx-slow: ", true),
        // All but the last byte of the HTTP/2 preface: the protocol is never decided.
        slowloris(&sidecar, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r", false),
        // Connects and sends nothing at all.
        async {
            let mut s = TcpStream::connect(sidecar.addr).await.expect("connect");
            let started = Instant::now();
            let bytes = until_closed(&mut s, "a silent").await;
            (started.elapsed(), bytes)
        },
        // One request answered, then a keep-alive connection that stays idle:
        // the next head's deadline runs from the response's end.
        async {
            let mut s = TcpStream::connect(sidecar.addr).await.expect("connect");
            s.write_all(b"GET /once HTTP/1.1\r\nhost: api\r\n\r\n")
                .await
                .expect("write");
            let started = Instant::now();
            let bytes = until_closed(&mut s, "an idle keep-alive").await;
            (started.elapsed(), bytes)
        },
    );
    let window =
        HEADER_READ_TIMEOUT - Duration::from_secs(1)..HEADER_READ_TIMEOUT + Duration::from_secs(5);
    for (what, took) in [
        ("slow headers", headers),
        ("slow h2 preface", preface),
        ("silent", silent),
        ("idle after a response", idle),
    ] {
        assert!(window.contains(&took), "{what}: closed after {took:?}");
    }
    // Closed without an answer: there is no request to answer.
    assert_eq!(String::from_utf8_lossy(&headers_sent), "");
    assert_eq!(String::from_utf8_lossy(&silent_sent), "");
    let answered = String::from_utf8_lossy(&idle_sent);
    assert!(
        answered.starts_with("HTTP/1.1 200") && answered.matches("HTTP/1.1").count() == 1,
        "one answer, then the close: {answered}"
    );
    assert_eq!(
        up.count(),
        1,
        "only the idle connection's one request went up"
    );
}
