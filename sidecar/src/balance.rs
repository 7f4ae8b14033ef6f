//! Balancing: which endpoint each attempt goes to, and the live state behind
//! that choice. Per upstream: its endpoints, retry budget and metrics
//! ([`upstream`]), kept across reloads. Per endpoint: in-flight attempts, a
//! decaying failure estimate and passive health ([`endpoint`]), and a pooled
//! HTTP client ([`client`]). The [`picker`] draws two untried, healthy
//! endpoints and takes the cheaper.

pub(crate) mod client;
pub(crate) mod endpoint;
pub(crate) mod picker;
pub(crate) mod upstream;
