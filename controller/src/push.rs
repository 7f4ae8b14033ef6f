//! The push server (`docs/src/concepts/controller.md`): every sidecar holds a TLS
//! stream open and receives its snapshot on every change (debounced), and
//! answers with ACK or NACK; see [`reprise_crds::protocol`] for the wire
//! format. It runs on every replica.
//!
//! - `server.rs`: the listener, requests and their authentication, what an
//!   ACK changes, encoded snapshots shared by alike sidecars.
//! - `stream.rs`: one sidecar's stream, upgraded or not, and the
//!   registration that counts it as connected.
//! - `source.rs`: what a sidecar is pushed, computed from the shared cache.
//! - `auth.rs`: who is on the other end (TokenReview).
//!
//! What each sidecar was sent and ACKed is recorded in the
//! [`SidecarRegistry`](crate::sidecars::SidecarRegistry), a module below
//! this one that the reconciler reads too.

mod auth;
mod server;
mod source;
mod stream;

pub(crate) use auth::TokenReviewer;
pub use auth::{AuthError, Authenticating, Authenticator, Identity};
pub use server::PushServer;
pub(crate) use source::CacheSource;
pub use source::SnapshotSource;
