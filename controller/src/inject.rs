//! Sidecar injection (`docs/src/concepts/injection.md`): the mutating webhook
//! that adds `reprise-sidecar` to new Pods, and the annotations a Pod uses to
//! opt out or override the injection config.
//!
//! - `config.rs`: the injection config (the chart's ConfigMap).
//! - `pod.rs`: the decision on one Pod (skip, refuse, inject) and its
//!   volumes and proxy variables; pure, unit-tested without an API server.
//! - `container.rs`: the sidecar container itself, and in transparent pods
//!   the `reprise-init` container that installs the capture rules.
//! - `overrides.rs`: per-pod annotation overrides and transparent capture,
//!   and the deadline switches a pod or its namespace sets.
//! - `namespaces.rs`: the namespace annotations injection reads.
//! - `webhook.rs`: the HTTPS admission server (`/inject`, and
//!   `/inject/transparent` for namespaces opted into transparent mode).
//! - `ca_bundle.rs`: keeping the webhook configuration's `caBundle` set.

mod ca_bundle;
mod config;
mod container;
mod namespaces;
mod overrides;
mod pod;
mod webhook;

pub(crate) use ca_bundle::keep_ca_bundle;
pub(crate) use config::InjectionConfig;
pub(crate) use namespaces::Namespaces;
pub(crate) use webhook::{supports_native_sidecars, ApiServer, Webhook, WebhookLimits};

/// Name of the injected container.
pub(crate) const SIDECAR_NAME: &str = "reprise-sidecar";
/// Name of the init container that installs transparent pods' rules.
pub(crate) const INIT_NAME: &str = "reprise-init";
/// Set to `"false"` on a Pod to opt it out (the chart's object selector also
/// skips Pods labelled `reprise.dev/inject=disabled`).
pub(crate) const INJECT: &str = "reprise.dev/inject";
/// Written on injected Pods; its presence makes injection idempotent.
pub(crate) const INJECTED: &str = "reprise.dev/injected";
/// Set to `"false"` to keep `HTTP_PROXY`/`NO_PROXY` out of the app containers.
pub(crate) const PROXY_ENV: &str = "reprise.dev/proxy-env";
/// Per-pod overrides, each replacing one value of the injection config.
pub(crate) const CPU_REQUEST: &str = "reprise.dev/sidecar-cpu-request";
/// See [`CPU_REQUEST`].
pub(crate) const MEMORY_REQUEST: &str = "reprise.dev/sidecar-memory-request";
/// See [`CPU_REQUEST`].
pub(crate) const CPU_LIMIT: &str = "reprise.dev/sidecar-cpu-limit";
/// See [`CPU_REQUEST`].
pub(crate) const MEMORY_LIMIT: &str = "reprise.dev/sidecar-memory-limit";
/// See [`CPU_REQUEST`].
pub(crate) const LOG_LEVEL: &str = "reprise.dev/log-level";
/// See [`CPU_REQUEST`].
pub(crate) const IMAGE: &str = "reprise.dev/sidecar-image";
/// See [`CPU_REQUEST`]: the requests the sidecar's `/diagnostics` keeps
/// (`REPRISE_DIAGNOSTICS_RETAINED`; 0 turns it off).
pub(crate) const DIAGNOSTICS_RETAINED: &str = "reprise.dev/diagnostics-retained";
/// `"false"`: the sidecar's attempts carry no deadline to the next hop
/// (`REPRISE_DEADLINE_PROPAGATE`). On a Pod, or on its Namespace for every
/// pod created in it (the Pod's own wins).
pub(crate) const DEADLINE_PROPAGATE: &str = "reprise.dev/deadline-propagate";
/// `"false"`: the sidecar ignores deadlines that come with requests
/// (`REPRISE_DEADLINE_ACCEPT_INCOMING`). On a Pod or its Namespace, as
/// [`DEADLINE_PROPAGATE`].
pub(crate) const DEADLINE_ACCEPT_INCOMING: &str = "reprise.dev/deadline-accept-incoming";
/// `"true"`: capture the Pod's outbound TCP transparently (`reprise-init`,
/// no `HTTP_PROXY`); `"false"` opts a Pod out in a namespace labelled
/// `reprise.dev/transparent=enabled`.
pub(crate) const TRANSPARENT: &str = "reprise.dev/transparent";
/// Transparent pods: the only destination ports redirected (default all).
pub(crate) const INCLUDE_OUTBOUND_PORTS: &str = "reprise.dev/include-outbound-ports";
/// Transparent pods: destination ports never redirected, besides the
/// injection config's (DNS).
pub(crate) const EXCLUDE_OUTBOUND_PORTS: &str = "reprise.dev/exclude-outbound-ports";
/// Transparent pods: destination CIDRs never redirected, besides the
/// injection config's and the API server's.
pub(crate) const EXCLUDE_OUTBOUND_CIDRS: &str = "reprise.dev/exclude-outbound-cidrs";
