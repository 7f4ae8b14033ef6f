//! Reprise's demo and end-to-end harness.
//!
//! Real HTTP upstream servers on loopback (a flaky one and a healthy one, as
//! in the quick start), the local control plane, the soak, and one hop of a
//! call chain as the e2e app makes it (`hop`). The
//! shared pieces (the fault upstream, the sidecar process harness, config
//! builders, the Prometheus parser) live in the `reprise-testkit` crate.
#![forbid(unsafe_code)]

pub mod bench;
pub mod chain;
pub mod cluster;
pub mod docs;
pub mod hop;
pub mod jaeger;
pub mod soak;
pub mod upstream_server;
