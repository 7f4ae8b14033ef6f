//! Reprise's retry policy model, shared by the controller and the sidecar.
//!
//! Everything that crosses a process boundary lives here: the standalone
//! configuration file (the `upstreams:` format plus retry rules), the resolved [`Config`] a sidecar executes, its
//! defaults, and the validation both processes run so that a policy the
//! controller accepts is exactly a policy the sidecar accepts.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod cel_match;
pub mod config;
pub mod file;
pub mod grpc;
pub mod matching;
pub mod policy;
pub mod protocol;
// The same KubeSchema copy as retry_rule's, of RetryPolicySpec and
// CallerNamespaces.
#[cfg(feature = "resource")]
#[allow(unreachable_pub)]
pub mod resource;
// kube's KubeSchema derive copies RetryRule and Retries, `pub` and all, into
// a function body, and rustc calls each copy an unreachable `pub` item at the
// original's span; no attribute reaches the copy. Without the feature (the
// sidecar's build) the module is still checked.
#[cfg_attr(feature = "resource", allow(unreachable_pub))]
pub mod retry_rule;
pub mod sidecar_env;
pub mod snapshot;
pub mod tls;
pub mod traffic;
pub mod validation;

pub use config::{BudgetSettings, Config, Endpoint, PassiveHealth, ProxySettings, Rule, Upstream};
pub use matching::{HeaderMatch, RequestMatch};
pub use policy::{FailureBoundary, MethodSet, Protocol, RetryPolicy, StatusSet};
pub use validation::{ValidationError, ValidationErrors};

/// Errors from loading or validating Reprise configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration file could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file that was being read.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The configuration file is not a regular file (a FIFO, a device, a
    /// directory, a socket): refused without reading it.
    #[error("{path}: not a regular file ({kind}); refused without reading it")]
    NotRegular {
        /// The file.
        path: String,
        /// What it is instead.
        kind: &'static str,
    },
    /// The configuration file is larger than [`file::MAX_FILE_BYTES`].
    #[error("{path}: {size} bytes, over the {limit}-byte limit; refused without parsing it")]
    TooLarge {
        /// The file.
        path: String,
        /// Its size (or, for a file that grew while it was read, the bytes
        /// read: the limit and one).
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The configuration file is not UTF-8.
    #[error("{path}: not valid UTF-8 at byte {offset}")]
    NotUtf8 {
        /// The file.
        path: String,
        /// Offset of the first byte that is not part of a UTF-8 character.
        offset: usize,
        /// The decoding error.
        #[source]
        source: std::str::Utf8Error,
    },
    /// The configuration file is not valid YAML or has fields of the wrong type or name.
    #[error("{path}: {source}")]
    Parse {
        /// The file that was being parsed.
        path: String,
        /// The YAML error, which names the field and its line.
        #[source]
        source: serde_yaml::Error,
    },
    /// A snapshot delta does not apply to the snapshot a sidecar runs; the
    /// sidecar asks for the whole snapshot again.
    #[error("snapshot delta refused: {reason}")]
    Delta {
        /// What did not match.
        reason: String,
    },
    /// A sidecar's traffic report breaks a rule (`traffic.rs`): refused whole.
    #[error("traffic report: {field}: {rule}")]
    Report {
        /// The field, e.g. `traffic["shop/reads"].success`.
        field: String,
        /// The rule it breaks, with the value it had.
        rule: String,
    },
    /// The configuration parsed but breaks one or more rules.
    #[error("{path}: {source}")]
    Invalid {
        /// The file (or snapshot) that was being validated.
        path: String,
        /// Every rule that was broken, each naming its field.
        #[source]
        source: ValidationErrors,
    },
}
