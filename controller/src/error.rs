//! The controller library's one error type.

use std::net::SocketAddr;
use std::path::PathBuf;

use reprise_crds::validation::ValidationErrors;

/// Everything the controller library can fail with. Each variant says what
/// failed and keeps its cause as [`std::error::Error::source`]; the message
/// repeats the cause too, because log lines and span statuses print only
/// the message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A listener (push stream, webhook) could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[source] kube::Error),
    /// A file of TLS material could not be read or written.
    #[error("TLS: {}: {source}", path.display())]
    TlsFile {
        /// The file (or the directory meant to hold it).
        path: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// Generating the private CA or the serving certificate failed.
    #[error("TLS: cannot generate a certificate: {0}")]
    Certificate(#[source] rcgen::Error),
    /// The serving certificate or key is not valid PEM.
    #[error("TLS: {what}: {source}")]
    Pem {
        /// `serving certificate` or `serving key`.
        what: &'static str,
        /// The parser's complaint.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// rustls refused the server configuration (e.g. a key that does not
    /// match the certificate).
    #[error("TLS: {0}")]
    Tls(#[source] rustls::Error),
    /// The TLS Secret lacks one of `ca.crt`, `tls.crt`, `tls.key`.
    #[error("TLS: Secret has no {key}")]
    SecretField {
        /// The missing key.
        key: &'static str,
    },
    /// The TLS Secret kept appearing and disappearing while this replica
    /// tried to read or create it.
    #[error("TLS: Secret {namespace}/{name} keeps appearing and disappearing")]
    SecretRace {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The snapshot computed from the cluster does not validate (the
    /// controller only pushes valid policies, so this is a bug).
    #[error("snapshot does not validate: {0}")]
    InvalidSnapshot(#[source] ValidationErrors),
    /// The CRD could not be rendered as YAML.
    #[error("cannot render the CRD: {0}")]
    Render(#[source] serde_yaml::Error),
    /// The injection config file could not be read or is invalid.
    #[error("{}: {reason}", path.display())]
    InjectionConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A namespaced object arrived without a namespace.
    #[error("object has no namespace")]
    MissingNamespace,
    /// The kubeconfig named by `--kubeconfig` or `--context` cannot be used.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// No Kubernetes configuration was found (KUBECONFIG, ~/.kube/config, in cluster).
    #[error("no Kubernetes configuration (KUBECONFIG, ~/.kube/config or in cluster): {0}")]
    InferConfig(#[source] kube::config::InferConfigError),
    /// The API server would not forward a port of the pod.
    #[error("port-forward to pod {pod}: {source}")]
    PortForward {
        /// `namespace/name`.
        pod: String,
        /// Why not.
        #[source]
        source: kube::Error,
    },
    /// An HTTP exchange through a port-forward failed.
    #[error("HTTP through the port-forward: {0}")]
    Http(#[source] hyper::Error),
    /// A pod's sidecar could not answer its diagnostics, or no controller
    /// replica what it last sent the pod.
    #[error("pod {pod}: {reason}")]
    Diagnostics {
        /// `namespace/name`.
        pod: String,
        /// What went wrong, and what to do.
        reason: String,
    },
    /// The API server does not serve RetryPolicies.
    #[error("the RetryPolicy CRD is not installed (kubectl reprise check says what to do)")]
    CrdMissing,
    /// The command line asks for something that cannot be done.
    #[error("{0}")]
    Usage(String),
    /// Output could not be written as JSON.
    #[error("JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// Output could not be written as YAML.
    #[error("YAML: {0}")]
    Yaml(#[source] serde_yaml::Error),
}

impl Error {
    /// A stable snake_case name of the variant, for the `error` label of
    /// `reprise_controller_reconcile_errors_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Bind { .. } => "bind",
            Error::Kube(_) => "kube",
            Error::TlsFile { .. } => "tls_file",
            Error::Certificate(_) => "certificate",
            Error::Pem { .. } => "pem",
            Error::Tls(_) => "tls",
            Error::SecretField { .. } | Error::SecretRace { .. } => "tls_secret",
            Error::InvalidSnapshot(_) => "invalid_snapshot",
            Error::Render(_) => "render",
            Error::InjectionConfig { .. } => "injection_config",
            Error::MissingNamespace => "missing_namespace",
            Error::Kubeconfig(_) | Error::InferConfig(_) => "kubeconfig",
            Error::PortForward { .. } => "port_forward",
            Error::Http(_) => "http",
            Error::Diagnostics { .. } => "diagnostics",
            Error::CrdMissing => "crd_missing",
            Error::Usage(_) => "usage",
            Error::Json(_) => "json",
            Error::Yaml(_) => "yaml",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_snake_case_and_messages_keep_their_cause() {
        let bind = Error::Bind {
            addr: "127.0.0.1:15010".parse().expect("addr"),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        assert_eq!(bind.metric_label(), "bind");
        assert!(
            bind.to_string()
                .starts_with("cannot listen on 127.0.0.1:15010: "),
            "{bind}"
        );
        assert!(std::error::Error::source(&bind).is_some());
        for e in [
            bind,
            Error::MissingNamespace,
            Error::SecretField { key: "tls.key" },
            Error::InvalidSnapshot(ValidationErrors::default()),
        ] {
            let label = e.metric_label();
            assert!(
                label.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{label}"
            );
        }
    }
}
