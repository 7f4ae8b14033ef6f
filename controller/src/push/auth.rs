//! Who is on the other end of a push connection: a pod's projected, audience-
//! bound ServiceAccount token, checked with the TokenReview API and matched to
//! the pod it was issued for. What a check costs the API server is bounded:
//! answers are cached by a digest that proves the same token, refusals
//! too (briefly), and a fixed number of checks run at once.

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

use super::paced::Paced;

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
    /// Too many tokens are being checked at once.
    #[error("too many token checks in flight")]
    Busy,
    /// This pod connects (or sends ACKs) more often than its pace allows.
    #[error("too many requests from this pod")]
    TooOften,
}

impl AuthError {
    /// The refusal as the cache keeps it.
    fn cached(&self) -> AuthError {
        match self {
            AuthError::Rejected(r) => AuthError::Rejected(r.clone()),
            AuthError::WrongPod(r) => AuthError::WrongPod(r.clone()),
            AuthError::Missing => AuthError::Missing,
            AuthError::Api(_) | AuthError::Busy | AuthError::TooOften => AuthError::Busy,
        }
    }
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

/// The real authenticator: TokenReview plus a Pod lookup. What the
/// TokenReview said is cached briefly ([`ReviewCache`]); the Pod is read on
/// every connection (its labels select policies, and a deleted pod's token
/// must stop working at once). At most [`MAX_IN_FLIGHT`] of these API calls
/// run at a time: unique junk tokens defeat any cache, not this.
pub(crate) struct TokenReviewer {
    client: Client,
    cache: ReviewCache,
    in_flight: tokio::sync::Semaphore,
    /// Pod reads per pod, once its token is proven: a pod that reconnects
    /// (or POSTs ACKs) in a loop spends its own pace, no one else's.
    pod_reads: Paced<(String, String)>,
}

/// How long an accepted token is trusted without asking the API server again.
const CACHE_TTL: Duration = Duration::from_secs(60);
/// How long a refused token stays refused without asking again.
const FAILURE_TTL: Duration = Duration::from_secs(10);
/// Tokens the cache holds at most; the oldest go first.
const CACHE_ENTRIES: usize = 16_384;
/// API calls (TokenReviews, Pod reads) authenticating sidecars at once.
pub(crate) const MAX_IN_FLIGHT: usize = 16;
/// Longest a request waits for one of those calls before it is answered
/// `503` (the sidecar retries with backoff).
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(2);
/// Pod reads one pod's connections may cause back to back, then one per
/// [`POD_READ_EVERY`].
const POD_READ_BURST: u32 = 10;
const POD_READ_EVERY: Duration = Duration::from_secs(1);
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
            cache: ReviewCache::default(),
            in_flight: tokio::sync::Semaphore::new(MAX_IN_FLIGHT),
            pod_reads: Paced::new(POD_READ_BURST, POD_READ_EVERY, CACHE_ENTRIES),
        }
    }

    async fn review(&self, token: &str, namespace: &str, pod: &str) -> Result<Identity, AuthError> {
        let key = fingerprint(token, namespace, pod);
        let account = match self.cache.get(&key, Instant::now()) {
            Some(Ok(account)) => account,
            Some(Err(reason)) => return Err(reason),
            None => {
                let _slot = self.slot().await?;
                let reviewed = self.token_review(token, namespace, pod).await;
                match &reviewed {
                    Ok(account) => self.cache.insert(key, Ok(account.clone()), Instant::now()),
                    Err(e @ (AuthError::Rejected(_) | AuthError::WrongPod(_))) => {
                        self.cache.insert(key, Err(e.cached()), Instant::now());
                    }
                    Err(_) => {}
                }
                reviewed?
            }
        };
        if !self
            .pod_reads
            .take(&(namespace.to_string(), pod.to_string()))
        {
            return Err(AuthError::TooOften);
        }
        let _slot = self.slot().await?;
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
        Ok(Identity {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            labels: found.labels().clone(),
            capabilities: Default::default(),
        })
    }

    /// One of the [`MAX_IN_FLIGHT`] API calls, or [`AuthError::Busy`].
    async fn slot(&self) -> Result<tokio::sync::SemaphorePermit<'_>, AuthError> {
        match tokio::time::timeout(IN_FLIGHT_WAIT, self.in_flight.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(AuthError::Busy),
        }
    }

    /// The ServiceAccount `token` authenticates for `namespace/pod`, per a
    /// TokenReview.
    async fn token_review(
        &self,
        token: &str,
        namespace: &str,
        pod: &str,
    ) -> Result<String, AuthError> {
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
        Ok(account.to_string())
    }
}

/// What TokenReviews said, by [`fingerprint`]: the ServiceAccount a token
/// authenticates for its pod (the identity only: the pod's labels are read
/// on every connection), or why it was refused. An accepted token is kept
/// [`CACHE_TTL`], a refused one [`FAILURE_TTL`]; at most [`CACHE_ENTRIES`],
/// expired entries evicted first, then the oldest.
#[derive(Debug, Default)]
pub(crate) struct ReviewCache {
    entries: Mutex<HashMap<Fingerprint, Said>>,
}

/// When a TokenReview said what: the ServiceAccount, or the refusal.
type Said = (Instant, Result<String, AuthError>);

/// A SHA-256 digest of a token and the pod it claims: a hit proves the same
/// token, as a comparison of the token would.
type Fingerprint = [u8; 32];

impl ReviewCache {
    /// What was said of `key`, unless it expired by `now`.
    pub(crate) fn get(&self, key: &Fingerprint, now: Instant) -> Option<Result<String, AuthError>> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (at, said) = entries.get(key)?;
        let ttl = if said.is_ok() { CACHE_TTL } else { FAILURE_TTL };
        if now.saturating_duration_since(*at) >= ttl {
            return None;
        }
        Some(match said {
            Ok(account) => Ok(account.clone()),
            Err(e) => Err(e.cached()),
        })
    }

    /// Keeps what was said of `key` at `now`, making room first.
    pub(crate) fn insert(&self, key: Fingerprint, said: Result<String, AuthError>, now: Instant) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= CACHE_ENTRIES / 2 {
            entries.retain(|_, (at, said)| {
                let ttl = if said.is_ok() { CACHE_TTL } else { FAILURE_TTL };
                now.saturating_duration_since(*at) < ttl
            });
        }
        if entries.len() >= CACHE_ENTRIES && !entries.contains_key(&key) {
            if let Some(oldest) = entries
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| *k)
            {
                entries.remove(&oldest);
            }
        }
        entries.insert(key, (now, said));
    }

    /// Tokens held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
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

/// The cache key of `token` for `namespace/pod`: the token itself is never
/// stored or logged, and no two tokens share a key.
pub(crate) fn fingerprint(token: &str, namespace: &str, pod: &str) -> Fingerprint {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [token, namespace, pod] {
        // Lengths first: no two (token, namespace, pod) read as one.
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part.as_bytes());
    }
    let mut key = [0; 32];
    key.copy_from_slice(ctx.finish().as_ref());
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_keeps_accepted_tokens_a_minute_and_refused_ones_briefly() {
        let cache = ReviewCache::default();
        let t0 = Instant::now();
        let ok = fingerprint("token-a", "shop", "web-0");
        let bad = fingerprint("junk", "shop", "web-0");
        cache.insert(ok, Ok("web".into()), t0);
        cache.insert(bad, Err(AuthError::Rejected("forged".into())), t0);
        let later = |s| t0 + Duration::from_secs(s);
        assert!(matches!(cache.get(&ok, later(59)), Some(Ok(a)) if a == "web"));
        assert!(matches!(
            cache.get(&bad, later(9)),
            Some(Err(AuthError::Rejected(_)))
        ));
        assert!(
            cache.get(&bad, later(10)).is_none(),
            "asked again after 10 s"
        );
        assert!(
            cache.get(&ok, later(60)).is_none(),
            "asked again after a minute"
        );
        assert!(
            cache
                .get(&fingerprint("token-a", "shop", "web-1"), t0)
                .is_none(),
            "the same token for another pod is another key"
        );
    }

    #[test]
    fn the_cache_is_bounded_and_evicts_expired_entries_then_the_oldest() {
        let cache = ReviewCache::default();
        let t0 = Instant::now();
        for i in 0..CACHE_ENTRIES {
            let t = t0 + Duration::from_millis(i as u64);
            cache.insert(fingerprint(&format!("t{i}"), "ns", "p"), Ok("sa".into()), t);
        }
        assert_eq!(cache.len(), CACHE_ENTRIES);
        // Full: one more evicts the oldest.
        let t = t0 + Duration::from_secs(30);
        cache.insert(fingerprint("new", "ns", "p"), Ok("sa".into()), t);
        assert_eq!(cache.len(), CACHE_ENTRIES);
        assert!(cache.get(&fingerprint("t0", "ns", "p"), t).is_none());
        assert!(cache.get(&fingerprint("t1", "ns", "p"), t).is_some());
        // Once they expired, an insert sweeps them all.
        let t = t0 + Duration::from_secs(120);
        cache.insert(fingerprint("newer", "ns", "p"), Ok("sa".into()), t);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn fingerprints_tell_tokens_and_pods_apart() {
        assert_eq!(fingerprint("a", "b", "c"), fingerprint("a", "b", "c"));
        assert_ne!(fingerprint("ab", "", "c"), fingerprint("a", "b", "c"));
        assert_ne!(fingerprint("a", "bc", ""), fingerprint("a", "b", "c"));
    }
}
