use super::*;

fn parse(bytes: &[u8]) -> Result<Option<RequestHead>, HeadError> {
    parse_request(&mut BytesMut::from(bytes), 64 * 1024, &mut Spans::new())
}

fn head(bytes: &str) -> RequestHead {
    parse(bytes.as_bytes()).expect("valid").expect("complete")
}

fn status(bytes: &str) -> StatusCode {
    parse(bytes.as_bytes()).expect_err("refused").status
}

#[test]
fn a_request_head_is_parsed_into_the_request_and_its_framing() {
    let mut buf = BytesMut::from(
        &b"\r\nPOST http://api/a?b=1 HTTP/1.1\r\nHost: api\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhelloGET"[..],
    );
    let h = parse_request(&mut buf, 1024, &mut Spans::new())
        .expect("valid")
        .expect("complete");
    assert_eq!(h.method, Method::POST);
    assert_eq!(h.uri, "http://api/a?b=1");
    assert_eq!(h.version, Version::HTTP_11);
    assert_eq!(h.framing, Framing::Length(5));
    assert!(h.keep_alive && !h.expect_continue && !h.upgrade && !h.trailers);
    assert_eq!(h.headers["host"], "api");
    let xa: Vec<_> = h.headers.get_all("x-a").iter().collect();
    assert_eq!(xa, ["1", "2"]);
    assert_eq!(&buf[..], b"helloGET", "the body and what follows stay");
    // A partial head needs more bytes and consumes none.
    let bytes = &b"GET / HTTP/1.1\r\nHost: a"[..];
    let mut partial = BytesMut::from(bytes);
    assert!(parse_request(&mut partial, 1024, &mut Spans::new())
        .expect("ok")
        .is_none());
    assert_eq!(&partial[..], bytes);
}

#[test]
fn request_framing_follows_hypers_server() {
    let framing = |h: &str| head(&format!("POST / HTTP/1.1\r\n{h}\r\n")).framing;
    assert_eq!(framing(""), Framing::Length(0));
    assert_eq!(framing("content-length: 7\r\n"), Framing::Length(7));
    assert_eq!(
        framing("content-length: 7\r\ncontent-length: 7\r\n"),
        Framing::Length(7)
    );
    assert_eq!(framing("transfer-encoding: chunked\r\n"), Framing::Chunked);
    assert_eq!(framing("transfer-encoding: Chunked\r\n"), Framing::Chunked);
    assert_eq!(
        framing("transfer-encoding: , chunked,\r\n"),
        Framing::Chunked
    );
    // Chunked beside a length: chunked wins, the length goes, and the
    // connection ends after this request, whichever came first.
    for both in [
        "content-length: 3\r\ntransfer-encoding: chunked\r\n",
        "transfer-encoding: chunked\r\ncontent-length: 3\r\n",
    ] {
        let h = head(&format!("POST / HTTP/1.1\r\n{both}\r\n"));
        assert_eq!(h.framing, Framing::Chunked, "{both:?}");
        assert!(!h.headers.contains_key("content-length"), "{both:?}");
        assert!(!h.keep_alive, "{both:?}");
    }
    for bad in [
        "content-length: 5, 5\r\n",
        "content-length: +5\r\n",
        "content-length: -1\r\n",
        "content-length: 0x5\r\n",
        "content-length: \r\n",
        "content-length: 99999999999999999999\r\n",
        "content-length: 5\r\ncontent-length: 6\r\n",
    ] {
        assert_eq!(
            status(&format!("POST / HTTP/1.1\r\n{bad}\r\n")),
            StatusCode::BAD_REQUEST,
            "{bad:?}"
        );
    }
    assert_eq!(
        status("POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n"),
        StatusCode::BAD_REQUEST
    );
}

#[test]
fn keep_alive_expect_upgrade_and_trailers_are_read_from_the_head() {
    let keep = |s: &str| head(s).keep_alive;
    assert!(keep("GET / HTTP/1.1\r\n\r\n"));
    assert!(!keep("GET / HTTP/1.1\r\nconnection: Close\r\n\r\n"));
    assert!(!keep(
        "GET / HTTP/1.1\r\nconnection: close\r\nconnection: keep-alive\r\n\r\n"
    ));
    assert!(!keep("GET / HTTP/1.0\r\n\r\n"));
    assert!(keep("GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n"));
    assert!(
        head("PUT / HTTP/1.1\r\nexpect: 100-Continue\r\ncontent-length: 3\r\n\r\n").expect_continue
    );
    assert!(
        !head("PUT / HTTP/1.1\r\nexpect: 100-continue\r\n\r\n").expect_continue,
        "no body to wait for"
    );
    assert!(
        !head("PUT / HTTP/1.0\r\nexpect: 100-continue\r\ncontent-length: 3\r\n\r\n")
            .expect_continue
    );
    assert!(head("GET / HTTP/1.1\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n").upgrade);
    assert!(!head("GET / HTTP/1.0\r\nupgrade: websocket\r\n\r\n").upgrade);
    assert!(head("CONNECT api:80 HTTP/1.1\r\n\r\n").upgrade);
    assert!(head("POST / HTTP/1.1\r\nte: gzip, trailers\r\n\r\n").trailers);
}

#[test]
fn malformed_and_oversized_heads_get_their_status() {
    for bad in [
        "NOT A REQUEST LINE\r\n\r\n",
        "GET\r\n\r\n",
        "GET / HTTP/9.9\r\n\r\n",
        "GET / HTTP/1.1 x\r\n\r\n",
        "G\0T / HTTP/1.1\r\n\r\n",
        "GET /\x7f HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1\r\nno colon\r\n\r\n",
        "GET / HTTP/1.1\r\nx-a: 1\r\n folded\r\n\r\n",
        "GET / HTTP/1.1\r\ncontent-length : 1\r\n\r\n",
    ] {
        assert_eq!(status(bad), StatusCode::BAD_REQUEST, "{bad:?}");
    }
    let many: String = (0..=MAX_HEADERS).map(|i| format!("x{i}: y\r\n")).collect();
    assert_eq!(
        status(&format!("GET / HTTP/1.1\r\n{many}\r\n")),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    let mut endless =
        BytesMut::from(format!("GET / HTTP/1.1\r\nx: {}", "a".repeat(2000)).as_bytes());
    assert_eq!(
        parse_request(&mut endless, 1024, &mut Spans::new())
            .expect_err("cut off")
            .status,
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_TARGET_BYTES));
    assert_eq!(
        parse_request(
            &mut BytesMut::from(long.as_bytes()),
            1 << 20,
            &mut Spans::new()
        )
        .expect_err("too long")
        .status,
        StatusCode::URI_TOO_LONG
    );
}

/// The head `encode_response` writes, its lines after the status line sorted
/// (without `date`), and the framing.
fn encode(
    status: u16,
    headers: &[(&str, &str)],
    body: BodyLength,
    exchange: Exchange,
) -> (String, Vec<String>, ResponseFraming) {
    let mut map = HeaderMap::new();
    for (k, v) in headers {
        map.append(
            HeaderName::from_bytes(k.as_bytes()).expect("name"),
            HeaderValue::from_str(v).expect("value"),
        );
    }
    let mut dst = Vec::new();
    let framing = encode_response(
        &mut dst,
        StatusCode::from_u16(status).expect("status"),
        &map,
        body,
        exchange,
    )
    .expect("encoded");
    let text = String::from_utf8(dst).expect("ascii");
    assert!(text.ends_with("\r\n\r\n"), "{text:?}");
    let mut lines = text.split("\r\n").filter(|l| !l.is_empty());
    let status_line = lines.next().expect("status line").to_owned();
    let mut fields: Vec<String> = lines.map(str::to_owned).collect();
    assert_eq!(
        fields.iter().filter(|f| f.starts_with("date: ")).count(),
        1,
        "{text:?}"
    );
    fields.retain(|f| !f.starts_with("date: "));
    fields.sort();
    (status_line, fields, framing)
}

const KEEP: Exchange = Exchange {
    http10: false,
    head: false,
    connect: false,
    keep_alive: true,
    trailers: false,
};

#[test]
fn a_response_head_gets_hypers_framing_fields() {
    let (line, fields, f) = encode(200, &[("content-length", "5")], BodyLength::Known(5), KEEP);
    assert_eq!(line, "HTTP/1.1 200 OK");
    assert_eq!(fields, ["content-length: 5"]);
    assert_eq!(
        (f.encoding, f.last, f.upgrade),
        (Encoding::Length(5), false, false)
    );
    // No length field: the body's own, chunked when unknown, 0 when ended.
    let (_, fields, f) = encode(200, &[], BodyLength::Known(7), KEEP);
    assert_eq!(
        (fields, f.encoding),
        (vec!["content-length: 7".to_owned()], Encoding::Length(7))
    );
    let (_, fields, f) = encode(502, &[("x-reprise-error", "x")], BodyLength::Unknown, KEEP);
    assert_eq!(fields, ["transfer-encoding: chunked", "x-reprise-error: x"]);
    assert_eq!(f.encoding, Encoding::Chunked);
    let (line, fields, f) = encode(204, &[], BodyLength::Ended, KEEP);
    assert_eq!(line, "HTTP/1.1 204 No Content");
    assert!(fields.is_empty());
    assert_eq!(f.encoding, Encoding::Length(0));
    let (_, fields, _) = encode(200, &[("content-length", "3")], BodyLength::Ended, KEEP);
    assert_eq!(
        fields,
        ["content-length: 0"],
        "a length the body does not have goes"
    );
    // HEAD: the length the body would have had stays, no body goes.
    let head = Exchange { head: true, ..KEEP };
    let (_, fields, f) = encode(200, &[("content-length", "9")], BodyLength::Ended, head);
    assert_eq!(
        (fields, f.encoding),
        (vec!["content-length: 9".to_owned()], Encoding::Length(0))
    );
    let (_, fields, f) = encode(200, &[], BodyLength::Unknown, head);
    assert!(fields.is_empty());
    assert_eq!(f.encoding, Encoding::Length(0));
    // A given length is checked when the body's is unknown.
    let mut dst = b"kept".to_vec();
    let mut map = HeaderMap::new();
    map.append("content-length", HeaderValue::from_static("3"));
    map.append("content-length", HeaderValue::from_static("4"));
    let e = encode_response(&mut dst, StatusCode::OK, &map, BodyLength::Unknown, KEEP)
        .expect_err("differing lengths");
    assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(dst, b"kept", "nothing of the head is left behind");
}

#[test]
fn connection_fields_follow_the_clients_version_and_keep_alive() {
    let close = Exchange {
        keep_alive: false,
        ..KEEP
    };
    let (_, fields, f) = encode(200, &[], BodyLength::Ended, close);
    assert_eq!(fields, ["connection: close", "content-length: 0"]);
    assert!(f.last);
    let (_, fields, f) = encode(200, &[("connection", "close")], BodyLength::Ended, KEEP);
    assert_eq!(
        fields,
        ["connection: close", "content-length: 0"],
        "not twice"
    );
    assert!(f.last);
    let http10 = Exchange {
        http10: true,
        ..KEEP
    };
    let (line, fields, f) = encode(200, &[], BodyLength::Known(2), http10);
    assert_eq!(line, "HTTP/1.0 200 OK");
    assert_eq!(fields, ["connection: keep-alive", "content-length: 2"]);
    assert!(!f.last);
    // HTTP/1.0 cannot chunk: a body of unknown length runs to the close.
    let (_, fields, f) = encode(200, &[], BodyLength::Unknown, http10);
    assert!(fields.is_empty(), "{fields:?}");
    assert_eq!((f.encoding, f.last), (Encoding::Close, true));
    let (line, fields, f) = encode(
        200,
        &[],
        BodyLength::Ended,
        Exchange {
            http10: true,
            keep_alive: false,
            ..KEEP
        },
    );
    assert_eq!(line, "HTTP/1.0 200 OK");
    assert_eq!(fields, ["content-length: 0"]);
    assert!(f.last);
}

#[test]
fn upgrades_and_connect_hand_the_connection_over_without_framing() {
    let (line, fields, f) = encode(
        101,
        &[("connection", "upgrade"), ("upgrade", "websocket")],
        BodyLength::Ended,
        KEEP,
    );
    assert_eq!(line, "HTTP/1.1 101 Switching Protocols");
    assert_eq!(fields, ["connection: upgrade", "upgrade: websocket"]);
    assert!(f.upgrade && f.last);
    let connect = Exchange {
        connect: true,
        ..KEEP
    };
    let (_, fields, f) = encode(200, &[("content-length", "0")], BodyLength::Ended, connect);
    assert!(fields.is_empty(), "no length on a CONNECT 2xx: {fields:?}");
    assert!(f.upgrade);
    let (_, _, f) = encode(502, &[], BodyLength::Known(4), connect);
    assert!(!f.upgrade, "a refused CONNECT keeps the connection HTTP");
}

#[test]
fn trailers_go_only_chunked_to_a_client_that_asked_and_as_declared() {
    let asked = Exchange {
        trailers: true,
        ..KEEP
    };
    let (_, fields, f) = encode(
        200,
        &[("trailer", "grpc-status, x-sum")],
        BodyLength::Unknown,
        asked,
    );
    assert_eq!(
        fields,
        ["trailer: grpc-status, x-sum", "transfer-encoding: chunked"]
    );
    assert_eq!(f.trailers, ["grpc-status", "x-sum"]);
    let (_, _, f) = encode(200, &[("trailer", "x-sum")], BodyLength::Unknown, KEEP);
    assert!(f.trailers.is_empty(), "not asked for");
    let (_, _, f) = encode(200, &[("trailer", "x-sum")], BodyLength::Known(3), asked);
    assert!(f.trailers.is_empty(), "not chunked");
}

#[test]
fn a_refusal_is_a_whole_response_that_closes() {
    let mut dst = Vec::new();
    encode_refusal(&mut dst, &HeadError::too_large("over"));
    let text = String::from_utf8(dst).expect("ascii");
    assert!(text.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
    assert!(text.contains("\r\nx-reprise-error: header_too_large\r\n"));
    assert!(text.contains("\r\nconnection: close\r\n"));
    assert!(text.contains("\r\ncontent-length: 0\r\n"));
    assert!(text.ends_with("\r\n\r\n"));
}

#[test]
fn names_kept_from_a_connections_earlier_requests_parse_as_a_fresh_parser_would() {
    let mut kept = Spans::new();
    for head in [
        "GET / HTTP/1.1\r\nHost: a\r\nUser-Agent: h2load\r\n\r\n",
        "GET / HTTP/1.1\r\nhost: a\r\nUSER-AGENT: h2load\r\n\r\n",
        "GET / HTTP/1.1\r\nUser-Agent: curl\r\nHost: b\r\nAccept: */*\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: c\r\n\r\n",
    ] {
        let again = parse_request(&mut BytesMut::from(head.as_bytes()), 1024, &mut kept)
            .expect("valid")
            .expect("complete");
        let fresh = self::head(head);
        let fields = |h: &RequestHead| -> Vec<(String, String)> {
            h.headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_str().expect("ascii").to_owned()))
                .collect()
        };
        assert_eq!(fields(&again), fields(&fresh), "{head}");
    }
}

#[test]
fn a_transfer_coding_other_than_one_chunked_is_501() {
    for coding in [
        "transfer-encoding: gzip, chunked\r\n",
        "transfer-encoding: gzip\r\n",
        "transfer-encoding: chunked, gzip\r\n",
        "transfer-encoding: chunked, chunked\r\n",
        "transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n",
        "transfer-encoding: chunked\r\ntransfer-encoding: gzip\r\n",
        "transfer-encoding: identity\r\n",
        "transfer-encoding: \r\n",
        "transfer-encoding: chunked;q=1\r\n",
        "content-length: 5\r\ntransfer-encoding: gzip\r\n",
    ] {
        let e = parse(format!("POST / HTTP/1.1\r\n{coding}\r\n").as_bytes()).expect_err("refused");
        assert_eq!(
            (e.status, e.kind),
            (StatusCode::NOT_IMPLEMENTED, "unsupported_transfer_coding"),
            "{coding:?}"
        );
    }
}

#[test]
fn host_is_one_line_and_an_absolute_target_names_it() {
    for twice in [
        "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n",
        "GET http://a/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    ] {
        let e = parse(twice.as_bytes()).expect_err("refused");
        assert_eq!(
            (e.status, e.kind),
            (StatusCode::BAD_REQUEST, "duplicate_host"),
            "{twice:?}"
        );
    }
    // RFC 9112 §3.2.2: the target's authority (without userinfo) replaces
    // the field, wherever the field was.
    for (target, host, want) in [
        ("http://alpha/x", "beta", "alpha"),
        ("http://alpha:8080/x", "alpha", "alpha:8080"),
        ("http://u:p@alpha/x", "beta", "alpha"),
        ("http://[::1]:9/x", "beta", "[::1]:9"),
        ("http://alpha/x", "alpha", "alpha"),
    ] {
        let h = head(&format!(
            "GET {target} HTTP/1.1\r\nX-A: 1\r\nHost: {host}\r\nX-B: 2\r\n\r\n"
        ));
        let hosts: Vec<_> = h.headers.get_all("host").iter().collect();
        assert_eq!(hosts, [want], "{target} {host}");
        let names: Vec<_> = h.headers.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["x-a", "host", "x-b"], "in its place");
    }
    // Origin form and CONNECT's authority form keep the field as sent.
    assert_eq!(
        head("GET /x HTTP/1.1\r\nHost: beta\r\n\r\n").headers["host"],
        "beta"
    );
    assert_eq!(
        head("CONNECT alpha:443 HTTP/1.1\r\nHost: beta\r\n\r\n").headers["host"],
        "beta"
    );
}

#[test]
fn a_hundred_fields_are_taken_and_the_next_is_431() {
    let fields = |n: usize| -> String { (0..n).map(|i| format!("x{i}: y\r\n")).collect() };
    let h = head(&format!("GET / HTTP/1.1\r\n{}\r\n", fields(MAX_HEADERS)));
    assert_eq!(h.headers.len(), MAX_HEADERS);
    let e = parse(format!("GET / HTTP/1.1\r\n{}\r\n", fields(MAX_HEADERS + 1)).as_bytes())
        .expect_err("refused");
    assert_eq!(
        (e.status, e.kind),
        (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "too_many_headers"
        )
    );
}

/// Feeds `head` to one connection's parser `piece` bytes at a time: the
/// request, and how many times httparse ran.
fn in_pieces(head: &[u8], piece: usize, max_head: usize) -> (Result<RequestHead, HeadError>, u32) {
    let mut spans = Spans::new();
    let mut buf = BytesMut::new();
    for part in head.chunks(piece) {
        buf.extend_from_slice(part);
        match parse_request(&mut buf, max_head, &mut spans) {
            Ok(None) => {}
            Ok(Some(h)) => return (Ok(h), spans.head_parses()),
            Err(e) => return (Err(e), spans.head_parses()),
        }
    }
    panic!("the head never completed")
}

#[test]
fn a_head_in_small_pieces_is_parsed_once_it_has_ended() {
    // 62 KB of fields in 64-byte pieces: one look at the first piece (an
    // early refusal of a request line that is not HTTP), then one parse
    // once the blank line is in; in between only the new bytes are
    // searched for it. It used to be a parse of the whole buffer per piece.
    let fields: String = (0..62)
        .map(|i| format!("x-{i:02}: {}\r\n", "a".repeat(1000)))
        .collect();
    let head = format!("GET / HTTP/1.1\r\nHost: api\r\n{fields}\r\n");
    let (h, parses) = in_pieces(head.as_bytes(), 64, 64 * 1024);
    assert_eq!(h.expect("valid").headers.len(), 63);
    assert_eq!(parses, 2);
    let (h, parses) = in_pieces(head.as_bytes(), head.len(), 64 * 1024);
    assert!(h.is_ok());
    assert_eq!(parses, 1, "a head that came whole is parsed once");
    // The blank line split over pieces, each way.
    for piece in 1..=4 {
        let (h, _) = in_pieces(b"\r\n\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", piece, 1024);
        assert_eq!(h.expect("valid").headers["host"], "a", "{piece}");
        let (h, _) = in_pieces(b"GET / HTTP/1.1\nHost: a\n\n", piece, 1024);
        assert_eq!(h.expect("valid").headers["host"], "a", "{piece}");
    }
    // Over the limit: one more parse, of the limit's bytes, for its status.
    let (e, parses) = in_pieces(head.as_bytes(), 64, 8 * 1024);
    assert_eq!(
        e.expect_err("too large").status,
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    assert_eq!(parses, 2);
    // Refused at the first look, before the rest arrives.
    let (e, parses) = in_pieces(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 4, 1024);
    assert_eq!(e.expect_err("not HTTP").status, StatusCode::BAD_REQUEST);
    assert_eq!(parses, 1);
}

#[test]
fn empty_lines_before_a_request_count_against_the_head_limit() {
    // Skipped as httparse skips them (RFC 9112 §2.2), and still bytes of the
    // head: a flood of them is a 431 however it arrives.
    let flood = "\r\n".repeat(600);
    for piece in [1, 7, 64, 2000] {
        let (e, _) = in_pieces(flood.as_bytes(), piece, 1024);
        assert_eq!(
            e.expect_err("too large").status,
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "{piece}"
        );
    }
    let ok = format!("{}GET / HTTP/1.1\r\n\r\n", "\r\n".repeat(10));
    for piece in [1, 3, 64] {
        assert!(in_pieces(ok.as_bytes(), piece, 1024).0.is_ok(), "{piece}");
    }
}

/// What one connection makes of `bytes` fed `piece` bytes at a time: the
/// refusal's status, the request line and fields, or `None` if the head
/// never ended.
fn outcome(bytes: &[u8], piece: usize, max_head: usize) -> Option<Result<String, StatusCode>> {
    let mut spans = Spans::new();
    let mut buf = BytesMut::new();
    for part in bytes.chunks(piece) {
        buf.extend_from_slice(part);
        match parse_request(&mut buf, max_head, &mut spans) {
            Ok(None) => {}
            Ok(Some(h)) => return Some(Ok(format!("{} {} {:?}", h.method, h.uri, h.headers))),
            Err(e) => return Some(Err(e.status)),
        }
    }
    None
}

#[test]
fn a_head_is_refused_or_not_the_same_way_however_it_arrives() {
    for (bytes, want) in [
        // Found by the fuzzer: a bad version with no blank line after it.
        (
            &b"POST / HTTPr-Encoding: chunked\r\nContent-Length: 3\r*\r\n5;x=y\r\n"[..],
            Some(Err(StatusCode::BAD_REQUEST)),
        ),
        // A bad field in a head that never ends: no answer, whole or cut.
        (b"GET / HTTP/1.1\r\nHost: a\r\nno colon\r\nX: 1\r\n", None),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nno colon\r\nX: 1\r\n\r\n",
            Some(Err(StatusCode::BAD_REQUEST)),
        ),
        // Not HTTP at all: refused on its first bytes.
        (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
            Some(Err(StatusCode::BAD_REQUEST)),
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /next",
            Some(Ok("GET / {\"host\": \"a\"}".into())),
        ),
    ] {
        for piece in [1, 2, 3, 5, 7, 16, 64, bytes.len()] {
            assert_eq!(
                outcome(bytes, piece, 1024),
                want,
                "{:?} in {piece}-byte pieces",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}
