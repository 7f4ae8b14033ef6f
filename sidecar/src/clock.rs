//! A process-local millisecond clock on tokio's time, so paused-time tests drive it.

use std::sync::OnceLock;

use tokio::time::Instant;

static ORIGIN: OnceLock<Instant> = OnceLock::new();

/// Milliseconds since the first call in this process (never 0).
pub fn now_ms() -> u64 {
    let origin = *ORIGIN.get_or_init(Instant::now);
    u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
}
