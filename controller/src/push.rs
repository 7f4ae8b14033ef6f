//! The push server (README: "Push protocol"): every sidecar holds a TLS
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
//! - `sidecars.rs`: the connected sidecars and their ACKs, as sync counts.

mod auth;
mod server;
mod sidecars;
mod source;
mod stream;

pub(crate) use auth::TokenReviewer;
pub use auth::{AuthError, Authenticating, Authenticator, Identity};
pub use server::PushServer;
pub use sidecars::{SidecarRegistry, SidecarState};
pub(crate) use source::CacheSource;
pub use source::SnapshotSource;
