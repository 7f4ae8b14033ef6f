//! The vocabulary every floor of the sidecar shares: what one proxied
//! exchange is made of, with no behaviour of the floors above.
//!
//! - [`body`]: the request body from the client, an HTTP/2 stream read as a
//!   body, and each attempt's body (replayed or streamed).
//! - [`request`]: one attempt's request, its head and the fields it sets.
//! - [`failure`]: how an attempt failed ([`failure::FailureKind`], the
//!   taxonomy every log line, metric and span names) and how far it got.
//! - [`outcome`] and [`report`]: what the retries came to.
//! - [`grpc`], [`hop_by_hop`]: the header fields the proxy reads or strips.
//! - [`deadline`]: the deadline that travels between hops in `baggage`.
//! - [`prefixed`]: a stream with the bytes already read from it put back.
//!
//! Nothing here imports another module of the crate but the leaves below
//! it (`testkit/tests/layers.rs` keeps it so).

pub(crate) mod body;
pub(crate) mod deadline;
pub(crate) mod failure;
pub(crate) mod grpc;
pub(crate) mod hop_by_hop;
pub(crate) mod outcome;
pub(crate) mod prefixed;
pub(crate) mod report;
pub(crate) mod request;
