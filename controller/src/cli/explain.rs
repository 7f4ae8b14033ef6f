//! `reprise-controller explain`, the request tester: for a client pod, a
//! method, a URL and headers, which policy would apply, which endpoints are
//! eligible, and on which failures the request would be retried. It sends no
//! traffic: it lists the cluster into a [`Cache`] and asks the same snapshot
//! source the push server uses, then the same matching the sidecar runs. It
//! says which source applied (a RetryPolicy or a route, the client's
//! namespace's or the Service's) and which matching ones it overrode
//! (`docs/src/concepts/precedence.md`).

use std::collections::BTreeMap;
use std::fmt::Write;

use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use reprise_crds::cel_match::CelRequest;
use reprise_crds::resource::RetryPolicy;
use reprise_crds::{Config, FailureBoundary, Rule, Upstream};

use crate::cache::Cache;
use crate::policy::budget::XBackendTrafficPolicy;
use crate::policy::route::{GRPCRoute, HTTPRoute};
use crate::push::{CacheSource, Identity, SnapshotSource};
use crate::Error;

// The subcommand's help is the doc comment of `Command::Explain`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Client namespace.
    #[arg(long, short = 'n', default_value = "default")]
    namespace: String,
    #[command(flatten)]
    request: Request,
}

/// The request to explain, without its namespace: `kubectl reprise explain`
/// takes that from kubectl's `-n` and the context.
#[derive(Debug, clap::Args)]
pub struct Request {
    /// Client pod whose labels select policies.
    #[arg(long)]
    pod: Option<String>,
    /// Labels of a hypothetical client pod (key=value, repeatable).
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Header `name: value` (repeatable).
    #[arg(long = "header", short = 'H')]
    headers: Vec<String>,
    /// Method.
    method: String,
    /// URL, e.g. http://api/v1/items.
    url: String,
}

/// A request to explain.
#[derive(Clone, Debug)]
struct Question {
    /// Client namespace.
    namespace: String,
    /// Client pod (for its labels); absent means a pod with `labels`.
    pod: Option<String>,
    /// Labels of a hypothetical client pod.
    labels: BTreeMap<String, String>,
    /// Method.
    method: String,
    /// URL, e.g. `http://api/v1/items`.
    url: String,
    /// Headers as `name: value`.
    headers: Vec<(String, String)>,
}

impl Question {
    fn new(namespace: String, request: Request) -> Self {
        Question {
            namespace,
            pod: request.pod,
            labels: request
                .labels
                .iter()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            method: request.method.to_ascii_uppercase(),
            url: request.url,
            headers: request
                .headers
                .iter()
                .filter_map(|h| h.split_once(':'))
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .collect(),
        }
    }
}

/// Prints the answer to `args` from the live cluster.
pub async fn print(args: Args) -> anyhow::Result<()> {
    let client = super::client().await?;
    print!(
        "{}",
        answer_from(client, args.namespace, args.request).await?
    );
    Ok(())
}

/// The answer to `request` from a client pod in `namespace`, read from the
/// live cluster through `client`.
pub async fn answer_from(
    client: Client,
    namespace: String,
    request: Request,
) -> Result<String, Error> {
    explain(client, &Question::new(namespace, request)).await
}

/// Answers `q` from the live cluster state, as the sidecar would decide.
async fn explain(client: Client, q: &Question) -> Result<String, Error> {
    let labels = match &q.pod {
        Some(name) => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &q.namespace);
            pods.get(name).await.map_err(Error::Kube)?.labels().clone()
        }
        None => q.labels.clone(),
    };
    let all = ListParams::default();
    // Every namespace's: a producer's policies and routes reach this one.
    let policies = Api::<RetryPolicy>::all(client.clone())
        .list(&all)
        .await
        .map_err(Error::Kube)?
        .items;
    let namespaces = optional(Api::<Namespace>::all(client.clone()).list(&all).await)?;
    let http_routes = optional(Api::<HTTPRoute>::all(client.clone()).list(&all).await)?;
    let grpc_routes = optional(Api::<GRPCRoute>::all(client.clone()).list(&all).await)?;
    let budgets = optional(
        Api::<XBackendTrafficPolicy>::all(client.clone())
            .list(&all)
            .await,
    )?;
    let services = Api::<Service>::all(client.clone())
        .list(&all)
        .await
        .map_err(Error::Kube)?
        .items;
    let slices = Api::<EndpointSlice>::all(client)
        .list(&all)
        .await
        .map_err(Error::Kube)?
        .items;
    let cache = Cache::fixed(policies, services, slices).with_gateway_api(
        namespaces,
        http_routes,
        grpc_routes,
        budgets,
    );
    let id = Identity {
        namespace: q.namespace.clone(),
        pod: q.pod.clone().unwrap_or_default(),
        labels,
        capabilities: Default::default(),
    };
    let snapshot = CacheSource::new(cache.clone()).snapshot_for(&id);
    let config = snapshot.resolve().map_err(Error::InvalidSnapshot)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "client: {}/{} labels {:?}",
        q.namespace,
        q.pod.as_deref().unwrap_or("(hypothetical)"),
        id.labels
    );
    let _ = writeln!(
        out,
        "policies applying to this client: {}",
        snapshot.policies.len()
    );
    let skipped: Vec<String> = cache
        .policies()
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(q.namespace.as_str()))
        .filter(|p| !snapshot.policies.iter().any(|s| s.name == p.name_any()))
        .map(|p| p.name_any())
        .collect();
    if !skipped.is_empty() {
        let _ = writeln!(
            out,
            "not applying (other pods, invalid, or target unresolved): {}",
            skipped.join(", ")
        );
    }
    answer(&config, q, &mut out);
    Ok(out)
}

/// The part of the answer that depends only on the resolved configuration,
/// in the order the sidecar decides: the upstream the URL's host names, the
/// first rule that matches the request, and what that rule retries.
fn answer(config: &Config, q: &Question, out: &mut String) {
    let uri: http::Uri = match q.url.parse() {
        Ok(u) => u,
        Err(e) => {
            let _ = writeln!(out, "invalid URL: {e}");
            return;
        }
    };
    let host = uri.host().unwrap_or("");
    let path = uri.path();
    let Some(upstream) = upstream_for(config, host) else {
        let _ = writeln!(
            out,
            "host {host}: no policy targets it; the sidecar forwards it once, without retries"
        );
        return;
    };
    list_endpoints(upstream, out);
    let Some(rule) = first_matching_rule(config, upstream, q, host, (path, uri.query()), out)
    else {
        let _ = writeln!(out, "no policy matches {} {path}: a failure is returned as is (outcome skipped: retries_off)", q.method);
        return;
    };
    let _ = writeln!(
        out,
        "policy {} ({}; priority {}) matches",
        rule.report_id(),
        source(rule.precedence),
        rule.priority
    );
    let overridden = matching_after(config, upstream, rule, q, host, (path, uri.query()));
    for r in overridden {
        let _ = writeln!(
            out,
            "  it overrides {} ({}), which matches too",
            r.report_id(),
            source(r.precedence)
        );
    }
    if !rule.policy.enabled() {
        let _ = writeln!(out, "  attempts is 0: nothing is retried");
        return;
    }
    describe_retries(&rule.policy, upstream, out);
}

/// A list the API server may not serve (a Gateway API kind whose CRD is
/// not installed, or one the user may not list): empty.
fn optional<K>(listed: Result<kube::core::ObjectList<K>, kube::Error>) -> Result<Vec<K>, Error>
where
    K: Clone,
{
    match listed {
        Ok(l) => Ok(l.items),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 403 => Ok(Vec::new()),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// Which source a rule's precedence class is.
fn source(precedence: u8) -> &'static str {
    match precedence {
        0 => "a RetryPolicy of the client's namespace",
        1 => "a route of the client's namespace",
        2 => "a RetryPolicy of the Service's namespace, for callers elsewhere",
        _ => "a route of the Service's namespace, for callers elsewhere",
    }
}

/// The rules after `first` that match the request too: what it overrides.
fn matching_after<'c>(
    config: &'c Config,
    upstream: &Upstream,
    first: &Rule,
    q: &Question,
    host: &str,
    (path, query): (&str, Option<&str>),
) -> Vec<&'c Rule> {
    let header = |name: &str| {
        q.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_bytes())
    };
    let lower: Vec<(String, &str)> = q
        .headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str()))
        .collect();
    let cel_headers: Vec<(&str, &str)> = lower.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let facts = CelRequest {
        method: &q.method,
        path,
        host,
        headers: &cel_headers,
    };
    let mut seen = vec![first.report_id()];
    config
        .rules
        .iter()
        .skip_while(|r| r.id != first.id)
        .skip(1)
        .filter(|r| {
            r.matches(&upstream.name, &q.method, path, query, header)
                && r.cel
                    .as_ref()
                    .is_none_or(|c| c.evaluate(&facts).unwrap_or(false))
        })
        .filter(|r| {
            // A route rule's several matches are one rule.
            let new = !seen.contains(&r.report_id());
            seen.push(r.report_id());
            new
        })
        .collect()
}

/// The upstream `host` names, by its name or one of its aliases.
fn upstream_for<'c>(config: &'c Config, host: &str) -> Option<&'c Upstream> {
    config
        .upstreams
        .iter()
        .find(|u| u.name == host || u.aliases.iter().any(|a| a == host))
}

/// The upstream and its ready endpoints, one a line.
fn list_endpoints(upstream: &Upstream, out: &mut String) {
    let _ = writeln!(
        out,
        "upstream {} ({} ready endpoints):",
        upstream.name,
        upstream.endpoints.len()
    );
    for e in &upstream.endpoints {
        let _ = writeln!(out, "  {} {}", e.addr, e.name.as_deref().unwrap_or(""));
    }
}

/// The first rule, in evaluation order, that matches the request `q` to
/// `upstream` at `host` and `path`: its method, path and header conditions,
/// then its CEL condition, each of whose results is noted in `out`.
fn first_matching_rule<'c>(
    config: &'c Config,
    upstream: &Upstream,
    q: &Question,
    host: &str,
    (path, query): (&str, Option<&str>),
    out: &mut String,
) -> Option<&'c Rule> {
    let header = |name: &str| {
        q.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_bytes())
    };
    // CEL reads headers by lower-case name (`CelRequest::headers`).
    let lower: Vec<(String, &str)> = q
        .headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str()))
        .collect();
    let cel_headers: Vec<(&str, &str)> = lower.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let facts = CelRequest {
        method: &q.method,
        path,
        host,
        headers: &cel_headers,
    };
    config.rules.iter().find(|r| {
        r.matches(&upstream.name, &q.method, path, query, header) && cel_holds(r, &facts, out)
    })
}

/// Whether `rule`'s CEL condition holds for the request `facts` (true
/// without one), noted in `out`. A condition that fails to evaluate does
/// not match, as in the sidecar.
fn cel_holds(rule: &Rule, facts: &CelRequest<'_>, out: &mut String) -> bool {
    let Some(cel) = &rule.cel else {
        return true;
    };
    match cel.evaluate(facts) {
        Ok(matched) => {
            let _ = writeln!(out, "policy {}: CEL {} is {matched}", rule.id, cel.source());
            matched
        }
        Err(e) => {
            let _ = writeln!(
                out,
                "policy {}: CEL {} failed ({}): no match",
                rule.id,
                cel.source(),
                e.0
            );
            false
        }
    }
}

/// What an enabled rule's policy `p` retries on `upstream`: how many times
/// and where, on which statuses and transport failures, with which body,
/// backoff, budget and deadline, and whether it hedges.
fn describe_retries(p: &reprise_crds::RetryPolicy, upstream: &Upstream, out: &mut String) {
    let _ = writeln!(
        out,
        "  up to {} retries, each to an endpoint not yet tried{}",
        p.max_retries,
        if p.reuse_endpoints {
            " (reuse allowed when none is left)"
        } else {
            ""
        }
    );
    let statuses = p.retry_statuses.statuses();
    let _ = writeln!(
        out,
        "  retried on statuses: {}",
        if statuses.is_empty() {
            "none".to_string()
        } else {
            format!("{statuses:?}")
        }
    );
    if p.retry_transport {
        let what = match p.failure_boundary {
            FailureBoundary::Connect => {
                "connect refused or timed out (before the request was written)"
            }
            FailureBoundary::BeforeHeaders => {
                "connect errors, resets, early closes and read timeouts before response headers"
            }
        };
        let _ = writeln!(out, "  retried on transport failures: {what}");
    } else {
        let _ = writeln!(out, "  transport failures are not retried");
    }
    let _ = writeln!(
        out,
        "  body: replayed when at most {} bytes; a larger body only if no byte was sent",
        p.replay_limit_bytes
    );
    let _ = writeln!(
        out,
        "  backoff: full jitter up to min({:?} * 2^(n-1), {:?}); budget {}% of requests; deadline {}",
        p.backoff_base,
        p.backoff_cap,
        upstream.budget.percent,
        p.total_deadline.map_or("none".to_string(), |d| format!("{d:?}"))
    );
    if let Some(h) = p.hedge_delay {
        let _ = writeln!(
            out,
            "  hedge: a duplicate to another endpoint after {h:?} without response headers"
        );
    }
}

#[cfg(test)]
mod tests {
    use reprise_crds::retry_rule::{Boundary, HttpMethod, Match, RetryRule, StatusPreset};
    use reprise_crds::snapshot::{Snapshot, SnapshotEndpoint, SnapshotPolicy, SnapshotUpstream};

    use super::*;

    fn config() -> Config {
        config_with_cel(None)
    }

    fn config_with_cel(cel: Option<&str>) -> Config {
        let upstream = SnapshotUpstream {
            name: "api.shop".into(),
            hosts: vec!["api".into(), "api.shop".into()],
            protocol: Default::default(),
            endpoints: vec![SnapshotEndpoint {
                address: "127.0.0.11".into(),
                port: 8080,
                pod: Some("api-1".into()),
                zone: None,
            }],
            addresses: vec![],
            ..Default::default()
        };
        let rule = RetryRule {
            methods: vec![HttpMethod::Get],
            request_match: Some(Match {
                path_prefix: Some("/v1/".into()),
                cel: cel.map(str::to_string),
                ..Default::default()
            }),
            status_presets: vec![StatusPreset::Gateway],
            failure_boundary: Boundary::BeforeHeaders,
            acknowledge_duplicate_risk: true,
            ..RetryRule::default()
        };
        let policy = SnapshotPolicy {
            namespace: "shop".into(),
            name: "reads".into(),
            generation: 1,
            upstream: "api.shop".into(),
            rule,
            precedence: 0,
            route: None,
        };
        Snapshot::new(vec![upstream], vec![policy])
            .resolve()
            .expect("valid")
    }

    fn ask(method: &str, url: &str) -> String {
        ask_with(&config(), method, url, &[])
    }

    fn ask_with(config: &Config, method: &str, url: &str, headers: &[(&str, &str)]) -> String {
        let q = Question {
            namespace: "shop".into(),
            pod: None,
            labels: BTreeMap::new(),
            method: method.into(),
            url: url.into(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let mut out = String::new();
        answer(config, &q, &mut out);
        out
    }

    #[test]
    fn explains_the_cel_condition_result() {
        let config = config_with_cel(Some("request.headers['x-tenant'] == 'a'"));
        let out = ask_with(&config, "GET", "http://api/v1/items", &[("X-Tenant", "a")]);
        assert!(
            out.contains("CEL request.headers['x-tenant'] == 'a' is true"),
            "{out}"
        );
        assert!(
            out.contains(
                "policy shop/reads (a RetryPolicy of the client's namespace; priority 0) matches"
            ),
            "{out}"
        );
        let out = ask_with(&config, "GET", "http://api/v1/items", &[("x-tenant", "b")]);
        assert!(out.contains("is false"), "{out}");
        assert!(out.contains("no policy matches GET /v1/items"), "{out}");
        let out = ask_with(&config, "GET", "http://api/v1/items", &[]);
        assert!(
            out.contains("failed (No such key: x-tenant): no match"),
            "{out}"
        );
    }

    #[test]
    fn explains_match_endpoints_and_retryable_failures() {
        let out = ask("GET", "http://api/v1/items");
        for expected in [
            "policy shop/reads (a RetryPolicy of the client's namespace; priority 0) matches",
            "127.0.0.11:8080 api-1",
            "retried on statuses: [502, 503, 504]",
            "resets, early closes and read timeouts",
        ] {
            assert!(out.contains(expected), "{expected}: {out}");
        }
        assert!(ask("POST", "http://api/v1/items").contains("no policy matches POST /v1/items"));
        assert!(ask("GET", "http://api/v2/items").contains("no policy matches GET /v2/items"));
        assert!(ask("GET", "http://example/x").contains("no policy targets it"));
    }

    #[test]
    fn says_which_source_applied_and_which_it_overrode() {
        use crate::cache::routes::PRODUCER_ROUTES;
        let mut config = config();
        // A producer's route for the same Service, matching every GET.
        let mut errs = reprise_crds::ValidationErrors::default();
        let route = reprise_crds::snapshot::SnapshotRoute {
            kind: reprise_crds::snapshot::RouteKind::Http,
            route: "api-retries".into(),
            rule: "0".into(),
            matches: vec![reprise_crds::snapshot::RouteMatch {
                path_segment_prefix: Some("/".into()),
                ..Default::default()
            }],
            deadline_answers_timeout: false,
            no_attempt_timeout: false,
        };
        let id = "catalog/HTTPRoute:api-retries:0:api.shop";
        let (mut rule, _) = RetryRule::default().resolve(id, "api.shop", "spec", &mut errs);
        rule.precedence = PRODUCER_ROUTES;
        config
            .rules
            .extend(route.rules(rule, id, "route", &mut errs));
        config.rules.sort_by(Rule::order);
        assert!(errs.is_empty(), "{errs}");
        let out = ask_with(&config, "GET", "http://api/v1/items", &[]);
        assert!(
            out.contains(
                "policy shop/reads (a RetryPolicy of the client's namespace; priority 0) matches"
            ),
            "{out}"
        );
        assert!(
            out.contains("it overrides catalog/HTTPRoute:api-retries:0:api.shop (a route of the Service's namespace, for callers elsewhere), which matches too"),
            "{out}"
        );
        let out = ask_with(&config, "GET", "http://api/v2/items", &[]);
        assert!(out.contains("policy catalog/HTTPRoute:api-retries:0:api.shop (a route of the Service's namespace"), "{out}");
        assert!(!out.contains("overrides"), "{out}");
    }
}
