//! Integration tests: the sidecar in front of real upstream servers on
//! loopback, one test per retry behaviour of the two product documents.

mod support;

mod bad_input;
mod body;
mod captured;
mod classification;
mod cli;
mod config_file;
mod deadlines;
mod diagnostics;
mod dns;
mod drain;
mod gauges;
mod grpc;
mod grpc_interop;
mod h2c_limits;
mod hedging;
mod hosts;
mod http1_server;
mod limits;
mod listeners;
mod matching;
mod methods;
mod resources;
mod routing;
mod tls;
mod tracing;
mod tunnel;
