//! Full-jitter backoff: the sleep before retry `n` is uniform in
//! `[0, min(base * 2^(n-1), cap)]` (the policy computes the nominal value),
//! so clients that failed together do not retry together.

use std::time::Duration;

use crate::random::Random;

/// A uniform delay in `[0, nominal]`, to the nanosecond.
pub fn full_jitter(nominal: Duration, random: &mut dyn Random) -> Duration {
    let nanos = u64::try_from(nominal.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(random.up_to(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::scripted::Scripted;
    use crate::random::ThreadRandom;

    #[test]
    fn jitter_spans_zero_to_the_nominal_delay() {
        let nominal = Duration::from_millis(100);
        assert_eq!(
            full_jitter(nominal, &mut Scripted::new(&[0])),
            Duration::ZERO
        );
        assert_eq!(
            full_jitter(nominal, &mut Scripted::new(&[40_000_000])),
            Duration::from_millis(40)
        );
        // The largest draw is the nominal delay itself, never more.
        assert_eq!(
            full_jitter(nominal, &mut Scripted::new(&[u64::MAX])),
            nominal
        );
        assert_eq!(
            full_jitter(Duration::ZERO, &mut Scripted::new(&[5])),
            Duration::ZERO
        );
        let real = full_jitter(nominal, &mut ThreadRandom);
        assert!(real <= nominal, "{real:?}");
    }
}
