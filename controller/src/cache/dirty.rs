//! What changed since the push source last looked: the policies and
//! Services (with their EndpointSlices) events touched, or everything (a
//! fresh list, a BackendTLSPolicy, a CA bundle). The push source reads and
//! clears it to compute again only what a change can reach.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use reprise_crds::resource::RetryPolicy;

use crate::policy::target::SERVICE_NAME_LABEL;

/// Objects touched since the last [`Dirty::take`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Touched {
    /// Everything may have changed.
    pub all: bool,
    /// RetryPolicies, by namespace and name.
    pub policies: HashSet<(String, String)>,
    /// Services (themselves or their EndpointSlices), by namespace and name.
    pub services: HashSet<(String, String)>,
    /// Namespaces whose labels may have changed (a producer policy's
    /// `callerNamespaces.selector` reads them).
    pub namespaces: HashSet<String>,
    /// Gateway API routes, by namespace (HTTPRoute and GRPCRoute alike).
    pub routes: HashSet<String>,
}

/// What one event touched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Touch {
    /// A RetryPolicy.
    Policy(String, String),
    /// A Service, or one of its EndpointSlices.
    Service(String, String),
    /// A Namespace (its labels).
    Namespace(String),
    /// An HTTPRoute or GRPCRoute in a namespace.
    Route(String),
    /// Something every snapshot may depend on.
    All,
    /// Nothing snapshots are made of.
    Nothing,
}

/// The shared record of what was touched. Cheap to clone: clones share it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Dirty(Arc<Mutex<Touched>>);

impl Dirty {
    /// Records `touch`.
    pub(crate) fn touch(&self, touch: Touch) {
        let mut t = self.lock();
        match touch {
            Touch::Policy(ns, name) if !t.all => {
                t.policies.insert((ns, name));
            }
            Touch::Service(ns, name) if !t.all => {
                t.services.insert((ns, name));
            }
            Touch::Namespace(ns) if !t.all => {
                t.namespaces.insert(ns);
            }
            Touch::Route(ns) if !t.all => {
                t.routes.insert(ns);
            }
            Touch::All => {
                *t = Touched {
                    all: true,
                    ..Touched::default()
                }
            }
            _ => {}
        }
    }

    /// What was touched since the last call, cleared.
    pub(crate) fn take(&self) -> Touched {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Touched> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What an event on a RetryPolicy touched.
pub(crate) fn policy(p: &RetryPolicy) -> Touch {
    Touch::Policy(p.namespace().unwrap_or_default(), p.name_any())
}

/// What an event on a Service touched.
pub(crate) fn service(s: &Service) -> Touch {
    Touch::Service(s.namespace().unwrap_or_default(), s.name_any())
}

/// What an event on an EndpointSlice touched: its Service.
pub(crate) fn slice(s: &EndpointSlice) -> Touch {
    match s.labels().get(SERVICE_NAME_LABEL) {
        Some(service) => Touch::Service(s.namespace().unwrap_or_default(), service.clone()),
        None => Touch::Nothing,
    }
}

/// What an event on a Namespace touched.
pub(crate) fn namespace(n: &k8s_openapi::api::core::v1::Namespace) -> Touch {
    Touch::Namespace(n.name_any())
}

/// What an event on an HTTPRoute touched: its namespace's routes.
pub(crate) fn http_route(r: &crate::policy::route::HTTPRoute) -> Touch {
    Touch::Route(r.namespace().unwrap_or_default())
}
