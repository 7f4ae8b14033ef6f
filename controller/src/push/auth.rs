//! Who is on the other end of a push connection: a pod's projected, audience-
//! bound ServiceAccount token, checked with the TokenReview API and matched to
//! the pod it was issued for.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};
use reprise_crds::protocol::AUDIENCE;

/// A sidecar the controller has authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Pod labels (for policy selection).
    pub labels: BTreeMap<String, String>,
    /// What its subscription request announced it understands
    /// ([`reprise_crds::protocol::CAPABILITIES_HEADER`]; none from an older
    /// sidecar).
    pub capabilities: BTreeSet<String>,
}

/// Why a sidecar was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No bearer token, or the pod headers are missing.
    #[error("missing bearer token or pod headers")]
    Missing,
    /// The API server did not accept the token (expired, forged, revoked, or for another audience).
    #[error("token not accepted: {0}")]
    Rejected(String),
    /// The token belongs to a different pod or namespace than the one claimed.
    #[error("token does not belong to pod {0}")]
    WrongPod(String),
    /// The TokenReview or Pod lookup failed.
    #[error("cannot check the token: {0}")]
    Api(#[source] kube::Error),
}

/// The answer an [`Authenticator`] works out.
pub type Authenticating<'a> =
    Pin<Box<dyn Future<Output = Result<Identity, AuthError>> + Send + 'a>>;

/// Checks tokens. A trait so unit tests of the push protocol can use fixed identities.
pub trait Authenticator: Send + Sync + 'static {
    /// Checks `token` for the pod `namespace/pod`.
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
        namespace: &'a str,
        pod: &'a str,
    ) -> Authenticating<'a>;
}

/// The real authenticator: TokenReview plus a Pod lookup, cached briefly.
pub(crate) struct TokenReviewer {
    client: Client,
    cache: Mutex<HashMap<u64, (Instant, Identity)>>,
}

/// How long an accepted token is trusted without asking the API server again.
const CACHE_TTL: Duration = Duration::from_secs(60);
const POD_NAME_CLAIM: &str = "authentication.kubernetes.io/pod-name";

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer").finish_non_exhaustive()
    }
}

impl TokenReviewer {
    /// An authenticator using `client`.
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    async fn review(&self, token: &str, namespace: &str, pod: &str) -> Result<Identity, AuthError> {
        let key = fingerprint(token, namespace, pod);
        if let Some((at, id)) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            if at.elapsed() < CACHE_TTL {
                return Ok(id.clone());
            }
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(vec![AUDIENCE.to_string()]),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let result = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(AuthError::Api)?;
        let status = result.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(AuthError::Rejected(
                status.error.unwrap_or_else(|| "not authenticated".into()),
            ));
        }
        if !status.audiences.iter().flatten().any(|a| a == AUDIENCE) {
            return Err(AuthError::Rejected(format!(
                "token audience is not {AUDIENCE}"
            )));
        }
        let user = status.user.unwrap_or_default();
        let username = user.username.unwrap_or_default();
        let prefix = format!("system:serviceaccount:{namespace}:");
        let Some(account) = username.strip_prefix(&prefix) else {
            return Err(AuthError::WrongPod(format!(
                "{namespace}/{pod} (token is for {username})"
            )));
        };
        let bound_pod = user
            .extra
            .as_ref()
            .and_then(|e| e.get(POD_NAME_CLAIM))
            .and_then(|v| v.first());
        if bound_pod.map(String::as_str) != Some(pod) {
            return Err(AuthError::WrongPod(format!(
                "{namespace}/{pod} (token is bound to {bound_pod:?})"
            )));
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let found = pods.get(pod).await.map_err(AuthError::Api)?;
        let pod_account = found
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        if pod_account != account {
            return Err(AuthError::WrongPod(format!(
                "{namespace}/{pod} (runs as {pod_account}, token is for {account})"
            )));
        }
        let id = Identity {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            labels: found.labels().clone(),
            capabilities: Default::default(),
        };
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (Instant::now(), id.clone()));
        Ok(id)
    }
}

impl Authenticator for TokenReviewer {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
        namespace: &'a str,
        pod: &'a str,
    ) -> Authenticating<'a> {
        Box::pin(self.review(token, namespace, pod))
    }
}

/// A synchronous check `(token, namespace, pod) -> identity` is an
/// authenticator too: fixed identities for tests and benchmarks.
impl<F> Authenticator for F
where
    F: Fn(&str, &str, &str) -> Result<Identity, AuthError> + Send + Sync + 'static,
{
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
        namespace: &'a str,
        pod: &'a str,
    ) -> Authenticating<'a> {
        Box::pin(std::future::ready(self(token, namespace, pod)))
    }
}

fn fingerprint(token: &str, namespace: &str, pod: &str) -> u64 {
    // A cache key, not a secret; the token itself is never stored or logged.
    let bytes = token
        .bytes()
        .chain([0])
        .chain(namespace.bytes())
        .chain([0])
        .chain(pod.bytes());
    reprise_crds::snapshot::fnv1a(bytes)
}
