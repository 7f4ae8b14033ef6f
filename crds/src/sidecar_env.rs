//! The environment contract between the injection webhook and the sidecar:
//! the variables the webhook sets on an injected `reprise-sidecar` container
//! and the sidecar reads in Kubernetes mode. Both sides name them from here,
//! so neither can drift from the other (`docs/src/reference/environment.md`).

/// `https://host:port` of the controller's push endpoint. Its presence puts
/// the sidecar in Kubernetes mode.
pub const CONTROLLER: &str = "REPRISE_CONTROLLER";
/// TLS name to verify on the controller's certificate (default: the URL's host).
pub const CONTROLLER_SERVER_NAME: &str = "REPRISE_CONTROLLER_SERVER_NAME";
/// This pod's name (downward API).
pub const POD_NAME: &str = "REPRISE_POD_NAME";
/// This pod's namespace (downward API).
pub const POD_NAMESPACE: &str = "REPRISE_POD_NAMESPACE";
/// The projected ServiceAccount token (audience [`crate::protocol::AUDIENCE`]),
/// re-read on every connect.
pub const TOKEN_PATH: &str = "REPRISE_TOKEN_PATH";
/// Where the token is when [`TOKEN_PATH`] is unset.
pub const DEFAULT_TOKEN_PATH: &str = "/var/run/secrets/reprise/token";
/// A PEM file with the controller's CA.
pub const CA_PATH: &str = "REPRISE_CA_PATH";
/// Where the CA is when neither [`CA_PATH`] nor [`CA_PEM`] is set.
pub const DEFAULT_CA_PATH: &str = "/var/run/secrets/reprise/ca.crt";
/// The controller's CA as PEM text (the webhook sets it); wins over [`CA_PATH`].
pub const CA_PEM: &str = "REPRISE_CA_PEM";
/// Where the last good snapshot is kept.
pub const SNAPSHOT_PATH: &str = "REPRISE_SNAPSHOT_PATH";
/// Where the snapshot is kept when [`SNAPSHOT_PATH`] is unset.
pub const DEFAULT_SNAPSHOT_PATH: &str = "/var/lib/reprise/snapshot.json";
/// Endpoint address rewrite for local test clusters (`FROM/LEN=TO/LEN`); unset in real clusters.
pub const ENDPOINT_ADDRESS_MAP: &str = "REPRISE_ENDPOINT_ADDRESS_MAP";
/// The log filter (e.g. `info`, `debug`, `info,reprise::request=off`); both binaries read it.
pub const LOG: &str = "REPRISE_LOG";
/// Retried or failed requests the admin `/diagnostics` page keeps, 0..=1000
/// (0 turns it off): what `proxy.diagnostics_retained` is in a file, for the
/// snapshot's configuration. The webhook sets it from the pod's
/// `reprise.dev/diagnostics-retained` annotation, else the injection
/// config's `diagnosticsRetained`.
pub const DIAGNOSTICS_RETAINED: &str = "REPRISE_DIAGNOSTICS_RETAINED";
/// `false` keeps attempts from carrying the request's deadline to the next
/// hop (`proxy.deadlines.propagate`); unset is `true`. The webhook sets it
/// from the `reprise.dev/deadline-propagate` annotation of the pod, else of
/// its namespace.
pub const DEADLINE_PROPAGATE: &str = "REPRISE_DEADLINE_PROPAGATE";
/// `false` ignores deadlines that come with requests
/// (`proxy.deadlines.accept_incoming`); unset is `true`. The webhook sets it
/// from the `reprise.dev/deadline-accept-incoming` annotation of the pod,
/// else of its namespace.
pub const DEADLINE_ACCEPT_INCOMING: &str = "REPRISE_DEADLINE_ACCEPT_INCOMING";
