//! The CPU time of parsing one request head fed to the server codec whole
//! and in small pieces, as a client that trickles its head makes it arrive:
//! a 62 KB head in 64-byte pieces under the default 64 KiB limit, and a
//! 1 MiB head in 256-byte pieces under the largest limit. The codec alone,
//! no sockets; the best of several runs.
//!
//!     cargo run --release -p reprise-sidecar --example head_pieces
//!
//! Results: `e2e/bench/results/2026-12-06-hostile-codec.md`.
#![forbid(unsafe_code)]

use std::time::Instant;

use bytes::BytesMut;
use reprise_sidecar::http1::server::parse_request;
use reprise_sidecar::http1::Spans;

/// A `GET` head of about `bytes` bytes in at most 100 fields.
fn head(bytes: usize) -> Vec<u8> {
    let mut h = b"GET / HTTP/1.1\r\nHost: api\r\n".to_vec();
    let value = (bytes / 90).max(1000);
    let mut i = 0;
    while h.len() + value + 16 < bytes {
        h.extend_from_slice(format!("x-{i:04}: {}\r\n", "a".repeat(value)).as_bytes());
        i += 1;
    }
    h.extend_from_slice(b"\r\n");
    h
}

/// Seconds to parse `h` fed `piece` bytes at a time, as one connection.
fn once(h: &[u8], piece: usize, max: usize) -> f64 {
    let mut spans = Spans::new();
    let mut buf = BytesMut::new();
    let start = Instant::now();
    for part in h.chunks(piece) {
        buf.extend_from_slice(part);
        match parse_request(&mut buf, max, &mut spans) {
            Ok(None) => {}
            Ok(Some(_)) => return start.elapsed().as_secs_f64(),
            Err(e) => panic!("refused: {e}"),
        }
    }
    panic!("the head never ended")
}

fn best(h: &[u8], piece: usize, max: usize, runs: usize) -> f64 {
    (0..runs)
        .map(|_| once(h, piece, max))
        .fold(f64::MAX, f64::min)
}

fn main() {
    for (size, piece, max, runs) in [
        (62 * 1024, 64, 64 * 1024, 50),
        (1000 * 1024, 256, 1 << 20, 5),
    ] {
        let h = head(size);
        let whole = best(&h, h.len(), max, runs * 4);
        let cut = best(&h, piece, max, runs);
        println!(
            "{} B head, limit {max}: whole {:.1} us, in {piece}-byte pieces {:.1} us ({:.0}x)",
            h.len(),
            whole * 1e6,
            cut * 1e6,
            cut / whole
        );
    }
}
