//! Paces per key (a source address, a pod): a key may act `burst` times
//! back to back, then once `every`; past that it is told to wait. Used for
//! what an unauthenticated or hostile client could otherwise repeat at
//! the controller's expense: failed authentications per source address, Pod
//! reads per pod. The keys remembered are bounded: at most `max_keys`,
//! those whose pace is rested forgotten first, then the one due soonest.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Keys and when each one's next action would be on time (a GCRA).
#[derive(Debug)]
pub(crate) struct Paced<K> {
    burst: u32,
    every: Duration,
    max_keys: usize,
    due: Mutex<HashMap<K, Instant>>,
}

impl<K: Hash + Eq + Clone> Paced<K> {
    /// `burst` actions, then one `every`, for at most `max_keys` keys.
    pub(crate) fn new(burst: u32, every: Duration, max_keys: usize) -> Self {
        Paced {
            burst: burst.max(1),
            every,
            max_keys,
            due: Mutex::default(),
        }
    }

    /// Whether `key` may act now (without counting it).
    pub(crate) fn may(&self, key: &K) -> bool {
        let now = Instant::now();
        let due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        due.get(key).is_none_or(|at| self.allows(*at, now))
    }

    /// Counts an action of `key`.
    pub(crate) fn spend(&self, key: &K) {
        let now = Instant::now();
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        self.make_room(&mut due, key, now);
        let at = due.entry(key.clone()).or_insert(now);
        *at = (*at).max(now) + self.every;
    }

    /// Counts an action of `key` if it may act now; whether it may.
    pub(crate) fn take(&self, key: &K) -> bool {
        let now = Instant::now();
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        if due.get(key).is_some_and(|at| !self.allows(*at, now)) {
            return false;
        }
        self.make_room(&mut due, key, now);
        let at = due.entry(key.clone()).or_insert(now);
        *at = (*at).max(now) + self.every;
        true
    }

    fn allows(&self, due: Instant, now: Instant) -> bool {
        due <= now + self.every * (self.burst - 1)
    }

    fn make_room(&self, due: &mut HashMap<K, Instant>, key: &K, now: Instant) {
        if due.len() < self.max_keys || due.contains_key(key) {
            return;
        }
        due.retain(|_, at| *at > now);
        if due.len() >= self.max_keys {
            if let Some(first) = due
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(k, _)| k.clone())
            {
                due.remove(&first);
            }
        }
    }

    /// Keys remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.due.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[tokio::test(start_paused = true)]
    async fn a_key_acts_a_burst_then_once_an_interval() {
        let every = Duration::from_secs(6);
        let paced = Paced::new(10, every, 100);
        let (pod, other): (IpAddr, IpAddr) = (
            "10.0.0.7".parse().expect("ip"),
            "10.0.0.8".parse().expect("ip"),
        );
        for _ in 0..10 {
            assert!(paced.may(&pod));
            paced.spend(&pod);
        }
        assert!(!paced.may(&pod), "over the burst");
        assert!(!paced.take(&pod));
        assert!(paced.may(&other), "another key is not held up");
        tokio::time::advance(every).await;
        assert!(paced.take(&pod), "one more after the interval");
        assert!(!paced.may(&pod));
    }

    #[tokio::test(start_paused = true)]
    async fn the_keys_remembered_are_bounded() {
        let paced = Paced::new(1, Duration::from_secs(1), 4096);
        for i in 0..5_000u32 {
            paced.spend(&IpAddr::from(i.to_be_bytes()));
        }
        assert_eq!(paced.len(), 4096);
    }
}
