use super::*;

#[test]
fn request_framing_follows_the_headers() {
    let head = |h: &[(&str, &str)]| RequestHead {
        method: "POST".into(),
        target: "/".into(),
        minor_version: 1,
        headers: h
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let framing = |h: &[(&str, &str)]| request_framing(&head(h)).ok();
    assert_eq!(framing(&[]), Some(Framing::Empty));
    assert_eq!(
        framing(&[("content-length", "12")]),
        Some(Framing::Length(12))
    );
    assert_eq!(
        framing(&[("content-length", "5"), ("content-length", "5")]),
        Some(Framing::Length(5))
    );
    assert_eq!(
        framing(&[("content-length", "5, 5")]),
        Some(Framing::Length(5))
    );
    assert_eq!(
        framing(&[("content-length", "5"), ("transfer-encoding", "chunked")]),
        Some(Framing::Chunked)
    );
    for bad in ["5, 6", "-5", "+5", "", "99999999999999999999999"] {
        assert_eq!(framing(&[("content-length", bad)]), None, "{bad:?}");
    }
    assert!(!head(&[]).wants_close());
    assert!(head(&[("connection", "keep-alive, Close")]).wants_close());
    assert!(RequestHead {
        minor_version: 0,
        ..head(&[])
    }
    .wants_close());
}

#[test]
fn responses_on_one_connection_are_split_by_their_framing() {
    let wire = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi\
HTTP/1.1 204 No Content\r\n\r\n\
HTTP/1.1 503 X\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbusy\r\n0\r\n\r\n\
HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nrest of the stream";
    let r = parse_responses(wire).expect("well framed");
    let seen: Vec<(u16, &[u8])> = r.iter().map(|r| (r.status, r.body.as_slice())).collect();
    assert_eq!(
        seen,
        [
            (200, &b"hi"[..]),
            (204, b""),
            (503, b"busy"),
            (200, b"rest of the stream")
        ]
    );
    assert_eq!(r[0].header("CONTENT-LENGTH"), Some("2"));
    assert!(r[3].closes());
    assert!(parse_responses(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort").is_err());
    assert!(parse_responses(b"garbage\r\n\r\n").is_err());
}

#[tokio::test]
async fn a_wire_reads_keep_alive_requests_in_a_row() {
    let (mut client, server) = tokio::io::duplex(64);
    let writer = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        client
            .write_all(
                b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc\
POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\ndef\r\n0\r\n\r\n\
GET /c HTTP/1.1\r\nHost: x\r\n\r\n",
            )
            .await
            .expect("write");
    });
    let mut wire = Wire::new(server);
    let mut got = Vec::new();
    for _ in 0..4 {
        match wire.read_request().await.expect("read") {
            Some(r) => got.push((r.head.target, r.body)),
            None => break,
        }
    }
    writer.await.expect("writer");
    assert_eq!(
        got,
        [
            ("/a".to_string(), b"abc".to_vec()),
            ("/b".into(), b"def".to_vec()),
            ("/c".into(), vec![])
        ]
    );
}
