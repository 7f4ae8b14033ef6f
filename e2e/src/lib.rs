//! Reprise's demo and end-to-end harness.
//!
//! Real HTTP upstream servers on loopback (a flaky one and a healthy one, as in
//! the gateway document's runnable demo) and helpers to run the real
//! `reprise-sidecar` binary in front of them.
#![forbid(unsafe_code)]

pub mod cluster;
pub mod jaeger;
pub mod upstream_server;
