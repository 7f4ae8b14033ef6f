//! One endpoint's live state: in-flight attempts and passive health.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use http::uri::Authority;
use reprise_crds::{Endpoint, PassiveHealth};

use crate::clock;

/// Live state of one endpoint, shared by every request and kept across reloads
/// while the endpoint stays in the configuration.
#[derive(Debug)]
pub struct EndpointState {
    /// The configured endpoint.
    pub endpoint: Endpoint,
    /// Pooled connections to it.
    pub client: crate::upstream::EndpointClient,

    /// `address:port`, pre-built for request URIs.
    pub authority: Authority,
    in_flight: AtomicU32,
    consecutive_failures: AtomicU32,
    ejected_until_ms: AtomicU64,
    ejections: AtomicU64,
}

/// Decrements the endpoint's in-flight count when the attempt ends.
#[derive(Debug)]
pub struct InFlight<'a>(&'a EndpointState);

impl EndpointState {
    /// Fresh state for `endpoint`.
    pub fn new(endpoint: Endpoint, client: crate::upstream::EndpointClient) -> Self {
        let authority = Authority::try_from(endpoint.addr.to_string().as_str())
            .unwrap_or_else(|_| Authority::from_static("invalid"));
        Self {
            endpoint,
            client,
            authority,

            in_flight: AtomicU32::new(0),
            consecutive_failures: AtomicU32::new(0),
            ejected_until_ms: AtomicU64::new(0),
            ejections: AtomicU64::new(0),
        }
    }

    /// Attempts currently waiting on this endpoint.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Marks an attempt started; the guard marks it ended.
    pub fn start(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    /// True while passive health has this endpoint ejected.
    pub fn is_ejected(&self) -> bool {
        self.ejected_until_ms.load(Ordering::Relaxed) > clock::now_ms()
    }

    /// Times this endpoint has been ejected.
    pub fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// Records a success: the consecutive-failure count restarts.
    pub fn record_success(&self) {
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }

    /// Records a transport failure or mid-stream error; ejects the endpoint when the
    /// consecutive count reaches the threshold. Returns true when this call ejected it.
    pub fn record_failure(&self, health: &PassiveHealth) -> bool {
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if health.consecutive_failures == 0 || n < health.consecutive_failures {
            return false;
        }
        self.consecutive_failures.store(0, Ordering::Relaxed);
        let until =
            clock::now_ms() + u64::try_from(health.ejection.as_millis()).unwrap_or(u64::MAX / 2);
        self.ejected_until_ms.store(until, Ordering::Relaxed);
        self.ejections.fetch_add(1, Ordering::Relaxed);
        true
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
