//! Reprise's test kit: what the sidecar's integration tests, the end-to-end
//! tests, the demo and the soak share.
//!
//! - [`upstream`]: one scriptable, fault-injecting upstream server on loopback
//!   (HTTP/1.1 on raw sockets, h2c through hyper) that records every request.
//! - [`sidecar`]: the process harness for the real `reprise-sidecar` binary.
//! - [`docs`]: the user guide's generated reference pages (rendered, compared
//!   with the committed page, rewritten with `REPRISE_BLESS=1`).
//! - [`config`]: typed builders over the configuration file's types, rendered
//!   as YAML.
//! - [`prometheus`]: a parser for the Prometheus text format.
//! - [`grpc`]: a tonic gRPC server with fault modes, and a client.
//! - [`client`]: one-shot HTTP clients (hyper, and raw bytes on a socket).
//! - [`http1`]: HTTP/1.1 message framing (heads, Content-Length, chunked),
//!   which the upstream and the raw client share.
//! - [`tls`]: a certificate authority made in the test, and TLS on loopback
//!   in front of a plain-text server.
//! - [`dns`]: a DNS server on loopback whose answers the test sets and
//!   changes (names to addresses, failures, silence).
//! - [`layers`]: a crate's module layering read from its sources, held
//!   against a table of floors (`testkit/tests/layers.rs` holds the tables).
//!
//! Test support: a failure to set something up panics with a message naming
//! what failed, or returns `anyhow` errors where a long-running driver (the
//! soak) must report it instead. Everything listens on loopback; every loop
//! is bounded in count and in time.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

/// Builder methods that set the field of the same name (`field: Type`).
macro_rules! field_setters {
    ($($(#[$doc:meta])* $field:ident: $ty:ty),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $field(mut self, value: $ty) -> Self {
                self.$field = value;
                self
            }
        )*
    };
}

pub mod client;
pub mod config;
pub mod dns;
pub mod docs;
pub mod grpc;
pub mod http1;
pub mod layers;
pub mod prometheus;
pub mod sidecar;
pub mod tls;
pub mod upstream;
