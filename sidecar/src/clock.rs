//! The process's clocks: a millisecond clock on tokio's time (so paused-time
//! tests drive it), the wall clock in Unix milliseconds (what a deadline
//! that travels between hops is written in), and the HTTP `date` every
//! response without one gets.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::HeaderValue;
use tokio::time::Instant;

static ORIGIN: OnceLock<Instant> = OnceLock::new();

/// Milliseconds since the first call in this process (never 0).
pub(crate) fn now_ms() -> u64 {
    let origin = *ORIGIN.get_or_init(Instant::now);
    u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
}

/// How often [`keep_date`] reads the wall clock: Envoy's cached date is
/// refreshed at the same period, so a `date` is at most this late.
pub(crate) const DATE_REFRESH: Duration = Duration::from_millis(500);

/// The second [`date`] formats, stored by [`keep_date`]; 0 while no refresher
/// runs, and then each call reads the clock itself.
static DATE_SECS: AtomicU64 = AtomicU64::new(0);

/// The `date` value for now (RFC 9110 §6.6.1: a proxy that forwards a
/// response without one adds it), formatted once a second per thread.
///
/// While [`keep_date`] runs this reads no clock: the value changes once a
/// second, and a clock read per response is not free (measured:
/// `e2e/bench/results/2026-12-04-issue18-clocks-and-copies.md`).
pub(crate) fn date() -> HeaderValue {
    thread_local! {
        static CACHED: RefCell<(u64, HeaderValue)> =
            const { RefCell::new((u64::MAX, HeaderValue::from_static(""))) };
    }
    let secs = match DATE_SECS.load(Ordering::Relaxed) {
        0 => unix_secs(),
        kept => kept,
    };
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != secs {
            let text = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs));
            cached.1 = HeaderValue::from_maybe_shared(Bytes::from(text))
                .unwrap_or_else(|_| HeaderValue::from_static(""));
            cached.0 = secs;
        }
        cached.1.clone()
    })
}

/// Keeps [`date`]'s second current, every [`DATE_REFRESH`], until dropped
/// (with its runtime, say), when [`date`] goes back to reading the clock.
pub(crate) async fn keep_date() {
    /// Hands [`date`] back its own clock reads when the refresher goes.
    struct Stop;
    impl Drop for Stop {
        fn drop(&mut self) {
            DATE_SECS.store(0, Ordering::Relaxed);
        }
    }
    let _stop = Stop;
    let mut tick = tokio::time::interval(DATE_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        DATE_SECS.store(unix_secs(), Ordering::Relaxed);
    }
}

/// Milliseconds since the Unix epoch, on the wall clock (0 on a clock set
/// before it).
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whole seconds since the Unix epoch (never 0 on a set clock).
fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_secs().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seconds_of(value: &HeaderValue) -> u64 {
        let text = value.to_str().expect("ascii");
        httpdate::parse_http_date(text)
            .expect("an HTTP date")
            .duration_since(UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs()
    }

    // `DATE_SECS` is process-wide: no other test in the library's test
    // binary runs a refresher (`server::serve` does; only the integration
    // tests, each binary its own process, call it).
    #[tokio::test]
    async fn the_date_follows_the_refresher_and_the_clock_once_it_stops() {
        // Without a refresher: the clock, read per call.
        let before = unix_secs();
        let own = seconds_of(&date());
        assert!(own >= before && own <= unix_secs(), "{own} vs {before}");

        let refresher = tokio::spawn(keep_date());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_ne!(DATE_SECS.load(Ordering::Relaxed), 0, "refreshed");
        // The refresher's second is what responses carry: set it apart
        // from the clock to see that no clock is read.
        DATE_SECS.store(1_000_000_000, Ordering::Relaxed);
        assert_eq!(seconds_of(&date()), 1_000_000_000);

        refresher.abort();
        let _ = refresher.await;
        assert_eq!(DATE_SECS.load(Ordering::Relaxed), 0, "handed back");
        let after = seconds_of(&date());
        assert!(after >= before && after <= unix_secs(), "{after}");
    }
}
