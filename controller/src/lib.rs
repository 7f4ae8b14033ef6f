//! Reprise's controller (`docs/src/concepts/retrypolicy.md` and
//! `docs/src/concepts/controller.md`).
//!
//! The contract: every replica watches RetryPolicies, Services and
//! EndpointSlices once, into a shared [`cache`]; serves each authenticated
//! sidecar a versioned snapshot of the valid policies that select its pod
//! (with the ready endpoints of their target Services) on a long-lived
//! [`push`] stream, and records its ACKs in the [`sidecars`] registry; and
//! injects the sidecar into new Pods.
//! The replica holding the Lease [`reconcile`]s each policy from the same
//! cache and writes its status (`Accepted`, `InSync` with counts, warnings)
//! only when it changed. Nothing here touches a cluster in unit tests: the
//! reconciler runs against a mocked API and a filled cache.
//!
//! The binary's `main` parses the [`cli`] and calls [`run::run`]; the tests,
//! the `push_scale` example and other crates use the public items below.
//!
//! The modules stand on floors, each naming only the floors below it (the
//! table is `testkit/tests/layers.rs`; `docs/src/concepts/architecture.md` draws it):
//!
//! - [`cli`]: the command line; it builds [`run`]'s options.
//! - [`run`]: the process, every part wired together.
//! - `inject`: the sidecar-injecting webhook.
//! - [`push`]: the push server: snapshot streams and their ACKs.
//! - [`reconcile`]: the leader's reconciler and the peers' sync counts.
//! - [`metrics`], [`telemetry`]: counters and their listener; spans.
//! - [`cache`], [`sidecars`]: what every reader shares: the watched
//!   cluster; the connected sidecars and what each ACKed.
//! - `policy`, `error`, [`tls`], `leader`, [`traffic`], [`untrusted`]: the
//!   leaves, which import nothing from the crate but the floor below them
//!   (`listen`: the listeners' limits).
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod cache;
pub mod cli;
mod error;
mod inject;
mod leader;
pub mod listen;
pub mod metrics;
mod policy;
pub mod push;
pub mod reconcile;
pub mod run;
pub mod sidecars;
pub mod telemetry;
pub mod tls;
pub mod traffic;
pub mod untrusted;

#[cfg(test)]
mod fixtures;

pub use error::Error;
/// Gateway API's BackendTLSPolicy, as Reprise reads it.
pub use policy::backend_tls;
/// Gateway API's XBackendTrafficPolicy, as Reprise reads it.
pub use policy::budget::XBackendTrafficPolicy;
/// Gateway API's routes, as Reprise reads them.
pub use policy::route::{GRPCRoute, HTTPRoute};
