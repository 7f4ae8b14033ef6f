//! Balancing: which endpoint each attempt goes to, and the live state behind
//! that choice. Per endpoint: in-flight attempts, a decaying failure
//! estimate, passive health and the kept timers of its attempts
//! ([`endpoint`]), and a pooled HTTP client ([`client`]). The [`picker`]
//! draws two untried, healthy endpoints and takes the cheaper. An
//! upstream's endpoints are composed with its budget and metrics a floor
//! above, in `retry::upstream`.

pub(crate) mod client;
pub(crate) mod endpoint;
pub(crate) mod picker;
