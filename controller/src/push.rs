//! The push server (`docs/src/concepts/controller.md`): every sidecar holds a TLS
//! stream open and receives its snapshot on every change (debounced), and
//! answers with ACK or NACK; see [`reprise_crds::protocol`] for the wire
//! format. It runs on every replica.
//!
//! - `server.rs`: the listener, requests and their authentication, what an
//!   ACK changes, encoded snapshots shared by alike sidecars.
//! - `stream.rs`: one sidecar's stream, upgraded or not, and the
//!   registration that counts it as connected.
//! - `groups.rs`: alike sidecars' shared snapshot, computed again only when
//!   a change may affect it, its lines (whole or delta) encoded once.
//! - `source.rs`: what a sidecar is pushed, computed from the shared cache,
//!   each policy's entries kept until a change touches them.
//! - `auth.rs`: who is on the other end (TokenReview), at a bounded cost.
//! - `paced.rs`: paces per key (source address, pod) for what a client could
//!   otherwise repeat at the controller's expense.
//!
//! What each sidecar was sent and ACKed is recorded in the
//! [`SidecarRegistry`](crate::sidecars::SidecarRegistry), a module below
//! this one that the reconciler reads too.

mod auth;
mod groups;
mod paced;
mod server;
mod source;
mod stream;

pub(crate) use auth::TokenReviewer;
pub use auth::{AuthError, Authenticating, Authenticator, Identity};
pub use server::{PushServer, StreamLimits, PUSH_LIMITS};
pub(crate) use source::CacheSource;
pub use source::{Changed, SnapshotSource};

/// The snapshot source the controller pushes from, reading `cache`: for
/// benchmarks and tests that drive the real push path (`examples/cluster_scale.rs`).
pub fn cache_source(cache: crate::cache::Cache) -> std::sync::Arc<dyn SnapshotSource> {
    std::sync::Arc::new(CacheSource::new(cache))
}
