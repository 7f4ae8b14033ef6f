//! Reprise's controller: reconciles `RetryPolicy` resources, resolves their
//! target Services' endpoints, writes status, and pushes validated snapshots to
//! the sidecars they apply to.
#![forbid(unsafe_code)]

pub mod auth;
pub mod crd;
pub mod endpoints;
pub mod explain;
pub mod injection;
pub mod leader;
pub mod metrics;
pub mod peers;
pub mod push;
pub mod reconcile;
pub mod run;
pub mod selection;
pub mod selftest;
pub mod sidecars;
pub mod source;
pub mod status;
pub mod telemetry;
pub mod tls;
pub mod webhook;

/// Errors of the controller library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CRD could not be rendered as YAML.
    #[error("cannot render the CRD: {0}")]
    Render(#[source] serde_yaml::Error),
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[source] kube::Error),
    /// TLS material could not be loaded or generated.
    #[error("TLS: {0}")]
    Tls(String),
    /// A namespaced object arrived without a namespace.
    #[error("object has no namespace")]
    MissingNamespace,
}
