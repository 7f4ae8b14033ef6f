//! What the upstream keeps of every request: the request itself, what the
//! script chose and whether the answer went out; and the delivery count of
//! request ids across upstreams.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::{lock, ActionKind};
use crate::http1;

/// One request as the upstream received it.
#[derive(Clone, Debug)]
pub struct Received {
    /// Its position among the requests this upstream received, from 0.
    pub seq: usize,
    /// When it was read in full.
    pub at: Instant,
    /// `HTTP/1.1`, `HTTP/1.0` or `HTTP/2.0`.
    pub version: http::Version,
    /// Method.
    pub method: String,
    /// Request target (HTTP/1) or path and query (HTTP/2).
    pub path: String,
    /// `:authority` (HTTP/2 only).
    pub authority: Option<String>,
    /// Header fields, names lower-case, in the order received.
    pub headers: Vec<(String, String)>,
    /// `x-reprise-attempt`, when present and a number.
    pub attempt: Option<u32>,
    /// The value of the id header set by [`Builder::count_ids`].
    pub id: Option<String>,
    /// The body; empty when the upstream does not keep bodies.
    pub body: Vec<u8>,
    /// The body's length.
    pub body_len: usize,
    /// [`digest`] of the body.
    pub body_digest: u64,
    /// What the script chose (`None` while the script runs).
    pub action: Option<ActionKind>,
    /// The whole answer was written (false: a fault, or cut by [`Upstream::close`]).
    pub answered: bool,
}

impl Received {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        http1::header(&self.headers, name)
    }

    /// Every value of header `name`, in order.
    pub fn header_values(&self, name: &str) -> Vec<&str> {
        http1::header_values(&self.headers, name)
    }
}

/// 64-bit FNV-1a of `bytes`: a body digest that a client can send along and
/// the upstream can check without keeping the body.
pub fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// How many times each request id arrived, counted across every upstream
/// that shares this table (the endpoints of one service), so one lookup says
/// whether a request was delivered more than once anywhere.
#[derive(Clone, Debug, Default)]
pub struct Deliveries(Arc<Mutex<HashMap<String, u32>>>);

impl Deliveries {
    pub(super) fn add(&self, id: &str) {
        *lock(&self.0).entry(id.to_string()).or_default() += 1;
    }

    /// Deliveries of request `id`.
    pub fn of(&self, id: &str) -> u32 {
        lock(&self.0).get(id).copied().unwrap_or(0)
    }

    /// Every id delivered more than once, with its count.
    pub fn repeated(&self) -> Vec<(String, u32)> {
        let mut out: Vec<(String, u32)> = lock(&self.0)
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_fnv1a_64() {
        assert_eq!(digest(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(digest(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(digest(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
