//! Integration tests: the sidecar in front of real upstream servers on
//! loopback, one test per retry behaviour of the two product documents.

mod support;

mod bad_input;
mod body;
mod captured;
mod classification;
mod cli;
mod drain;
mod gauges;
mod grpc;
mod grpc_interop;
mod hedging;
mod hosts;
mod http1_server;
mod limits;
mod matching;
mod methods;
mod routing;
mod tracing;
mod tunnel;
