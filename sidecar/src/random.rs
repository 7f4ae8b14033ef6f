//! The randomness the retry loop draws on: full-jitter backoff and the
//! power-of-two-choices pair. Behind a one-method trait (as tower's `Rng`) so
//! tests script exact draws instead of counting outcomes over many samples.

use rand::Rng as _;

/// A source of uniform random integers.
pub trait Random: Send {
    /// A uniform integer in `0..=max`.
    fn up_to(&mut self, max: u64) -> u64;
}

/// The thread's random generator, drawn from at each call. Zero-sized and
/// `Send`, so a request future may hold it across awaits (the generator
/// itself may not leave its thread).
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadRandom;

impl Random for ThreadRandom {
    fn up_to(&mut self, max: u64) -> u64 {
        rand::rng().random_range(0..=max)
    }
}

#[cfg(test)]
pub(crate) mod scripted {
    use std::collections::VecDeque;

    use super::Random;

    /// Returns the scripted draws in order (each clamped to the asked
    /// maximum), then the maximum once the script runs out.
    #[derive(Debug, Default)]
    pub(crate) struct Scripted(pub(crate) VecDeque<u64>);

    impl Scripted {
        pub(crate) fn new(draws: &[u64]) -> Self {
            Scripted(draws.iter().copied().collect())
        }
    }

    impl Random for Scripted {
        fn up_to(&mut self, max: u64) -> u64 {
            self.0.pop_front().map_or(max, |d| d.min(max))
        }
    }
}
