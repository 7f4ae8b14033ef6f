//! Reads grow from [`READ_INIT`] by doubling up to the cap their caller
//! gives; past it only by the room a reclaimed buffer brings (under twice
//! the cap), whatever the socket holds.

use std::task::Waker;

use super::*;

/// Sizes of the reads that take 1 MiB from a source that always has more
/// than any read's room, with `max` as the cap.
fn read_sizes(max: usize) -> Vec<usize> {
    let data = vec![7u8; 1 << 20];
    let mut io: &[u8] = &data;
    let mut buf = BytesMut::new();
    let mut size = READ_INIT;
    let mut cx = Context::from_waker(Waker::noop());
    let mut sizes = Vec::new();
    loop {
        match poll_fill(&mut io, &mut buf, &mut size, max, &mut cx) {
            Poll::Ready(Ok(0)) => return sizes,
            Poll::Ready(Ok(n)) => {
                sizes.push(n);
                // Handed over whole, as a body frame is.
                drop(buf.split());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn a_request_read_grows_to_64_kib_and_stays_under_128() {
    let sizes = read_sizes(REQUEST_READ_MAX);
    // Past the cap, every read takes the 120 KiB a reclaimed buffer holds.
    assert_eq!(
        sizes[..6],
        [8 << 10, 16 << 10, 32 << 10, 64 << 10, 120 << 10, 120 << 10]
    );
    assert!(sizes.iter().all(|&n| n < 2 * REQUEST_READ_MAX), "{sizes:?}");
    assert_eq!(sizes.iter().sum::<usize>(), 1 << 20);
}

#[test]
fn a_response_read_grows_to_256_kib_and_stays_under_512() {
    let sizes = read_sizes(RESPONSE_READ_MAX);
    assert!(sizes.contains(&RESPONSE_READ_MAX), "{sizes:?}");
    assert!(
        sizes.iter().all(|&n| n < 2 * RESPONSE_READ_MAX),
        "{sizes:?}"
    );
    assert_eq!(sizes.iter().sum::<usize>(), 1 << 20);
}
