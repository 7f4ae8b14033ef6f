//! One route, for one of its Service parents, read into the rules a sidecar
//! runs, or refused whole with the field that keeps it from being applied
//! (`docs/src/tasks/httproute.md`, "What is read").
//!
//! The mapping:
//! - a rule's matches become the rule's [`RouteMatch`]es: `PathPrefix` by
//!   whole path elements, `Exact`, and `RegularExpression` for paths and
//!   headers (RE2, the whole value); query parameters `Exact` only;
//! - `retry.codes` are the statuses retried, `retry.attempts` the retries
//!   (default 1, at most 10: a larger number is clamped, and the route's
//!   status says so), `retry.backoff` the backoff base with a cap of ten
//!   times it (Envoy's default ratio);
//! - `timeouts.request` is the total deadline, which answers `504` when it
//!   ends the retries; `timeouts.backendRequest` each attempt's time to
//!   response headers (Reprise's attempt timeout ends there, not at the end
//!   of the body); `0s` turns either off;
//! - transport failures are retried only before the request was written
//!   (the `Connect` boundary); an attempt that timed out is not retried;
//! - status retries apply to GET, HEAD and OPTIONS, the author's naming of
//!   the codes standing for the acknowledgement a RetryPolicy asks for;
//!   other methods only with [`ACKNOWLEDGE_ANNOTATION`];
//! - a GRPCRoute's retries come from Reprise's annotations, which stand
//!   for the acknowledgement too (every gRPC call is a POST);
//! - a retry may go back to a pod already tried when none is left
//!   (`reuseEndpoints`): Gateway API counts attempts, not pods, and a
//!   one-replica backend must still get its retries.
//!
//! Refused whole: filters, backends other than the parent Service itself
//! (weights, several backends, other Services), query parameters matched by
//! regular expression, and any field this module does not name.

use std::collections::BTreeMap;

use reprise_crds::grpc::{code_of, GrpcStatusEntry};
use reprise_crds::matching::{HeaderMatch, QueryMatch};
use reprise_crds::retry_rule::{Boundary, HttpMethod, Retries, RetryRule};
use reprise_crds::snapshot::{RouteKind, RouteMatch, SnapshotRoute};

use super::{
    BackendRef, GrpcRouteRule, HttpRouteRule, ParentRef, ValueMatch, ACKNOWLEDGE_ANNOTATION,
    ATTEMPTS_ANNOTATION, BACKOFF_ANNOTATION, GRPC_STATUSES_ANNOTATION, REPLAY_ANNOTATION,
    REQUEST_TIMEOUT_ANNOTATION,
};

/// Most retries Reprise runs ([`reprise_crds::policy::MAX_RETRIES`]).
const MAX_ATTEMPTS: i64 = reprise_crds::policy::MAX_RETRIES as i64;
/// Longest total deadline a rule may have.
const MAX_DEADLINE_MS: i64 = reprise_crds::policy::MAX_TOTAL_DEADLINE_MS as i64;
/// Longest attempt timeout a rule may have.
const MAX_ATTEMPT_TIMEOUT_MS: i64 = 3_600_000;
/// Bodies buffered for replay when the route does not say.
pub(crate) const DEFAULT_REPLAY_BYTES: i64 = 64 * 1024;

/// What a route says, whatever its kind.
pub(crate) struct Route<'a> {
    /// Its kind.
    pub(crate) kind: RouteKind,
    /// Its namespace.
    pub(crate) namespace: &'a str,
    /// Its name.
    pub(crate) name: &'a str,
    /// Its annotations.
    pub(crate) annotations: &'a BTreeMap<String, String>,
    /// Its rules.
    pub(crate) rules: Rules<'a>,
}

/// A route's rules.
pub(crate) enum Rules<'a> {
    /// An HTTPRoute's.
    Http(&'a [HttpRouteRule]),
    /// A GRPCRoute's.
    Grpc(&'a [GrpcRouteRule]),
}

/// The Service a parent reference names, for a route in `route_namespace`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ServiceParent {
    /// Its namespace.
    pub(crate) namespace: String,
    /// Its name.
    pub(crate) name: String,
    /// The port, when the reference names one.
    pub(crate) port: Option<i32>,
}

impl ServiceParent {
    /// The Service `parent` names, when it names one.
    pub(crate) fn of(parent: &ParentRef, route_namespace: &str) -> Option<ServiceParent> {
        parent.is_service().then(|| ServiceParent {
            namespace: parent
                .namespace
                .clone()
                .unwrap_or_else(|| route_namespace.to_string()),
            name: parent.name.clone(),
            port: parent.port,
        })
    }
}

/// One rule read: its retries and timeouts, its matches (priorities not yet
/// ranked) and what ranks them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ReadRule {
    /// Retries, timeouts, methods retried.
    pub(crate) rule: RetryRule,
    /// Matches and what a RetryRule cannot say.
    pub(crate) route: SnapshotRoute,
    /// Its index in `rules`.
    pub(crate) index: usize,
}

/// A route read for one parent.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Read {
    /// Its rules, in the route's order.
    pub(crate) rules: Vec<ReadRule>,
    /// What the status says beside "accepted": values clamped, methods retried.
    pub(crate) notes: Vec<String>,
}

/// Why a route is not applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    /// Gateway API's reason for `Accepted: False`.
    pub(crate) reason: &'static str,
    /// The field and the rule, for the status message.
    pub(crate) message: String,
}

fn unsupported(field: impl std::fmt::Display, why: impl std::fmt::Display) -> Refused {
    Refused {
        reason: "UnsupportedValue",
        message: format!("{field}: {why}; Reprise does not apply the route"),
    }
}

/// Reads `route` for `parent`.
pub(crate) fn read(route: &Route<'_>, parent: &ServiceParent) -> Result<Read, Refused> {
    let mut notes = Vec::new();
    let acknowledged = flag(route.annotations, ACKNOWLEDGE_ANNOTATION)?;
    let replay = match route.annotations.get(REPLAY_ANNOTATION) {
        None => DEFAULT_REPLAY_BYTES,
        Some(v) => v
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|n| (0..=4_194_304).contains(n))
            .ok_or_else(|| {
                unsupported(
                    format!("metadata.annotations[{REPLAY_ANNOTATION}]"),
                    format!("must be a number of bytes in 0..=4194304 (got \"{v}\")"),
                )
            })?,
    };
    let mut rules = Vec::new();
    match route.rules {
        Rules::Http(http) => {
            let methods = if acknowledged {
                vec![HttpMethod::Any]
            } else {
                vec![HttpMethod::Get, HttpMethod::Head, HttpMethod::Options]
            };
            notes.push(if acknowledged {
                "retries every method but CONNECT and TRACE (reprise.dev/acknowledge-duplicate-risk)".to_string()
            } else {
                "retries GET, HEAD and OPTIONS; other methods are not retried without the reprise.dev/acknowledge-duplicate-risk annotation".to_string()
            });
            let grpc_statuses = grpc_statuses(route.annotations)?;
            for (i, r) in http.iter().enumerate() {
                let p = format!("spec.rules[{i}]");
                refuse_other(&p, &r.other)?;
                refuse_filters(&p, &r.filters)?;
                backends(&p, &r.backend_refs, parent, route.namespace)?;
                let mut matches = r
                    .matches
                    .iter()
                    .enumerate()
                    .map(|(j, m)| http_match(&format!("{p}.matches[{j}]"), m))
                    .collect::<Result<Vec<_>, _>>()?;
                if matches.is_empty() {
                    // The API server's default: `PathPrefix /`.
                    matches.push(RouteMatch {
                        path_segment_prefix: Some("/".into()),
                        ..RouteMatch::default()
                    });
                }
                let (attempts, codes, backoff) = match &r.retry {
                    None => (0, Vec::new(), None),
                    Some(retry) => {
                        refuse_other(&format!("{p}.retry"), &retry.other)?;
                        let asked = retry.attempts.unwrap_or(1);
                        if asked > MAX_ATTEMPTS {
                            notes.push(format!("{p}.retry.attempts {asked} is above Reprise's maximum: {MAX_ATTEMPTS} retries"));
                        }
                        let backoff = retry
                            .backoff
                            .as_deref()
                            .map(|d| duration_ms(&format!("{p}.retry.backoff"), d))
                            .transpose()?;
                        (asked.clamp(0, MAX_ATTEMPTS), retry.codes.clone(), backoff)
                    }
                };
                let (request, backend) = match &r.timeouts {
                    None => (None, None),
                    Some(t) => {
                        refuse_other(&format!("{p}.timeouts"), &t.other)?;
                        (
                            t.request
                                .as_deref()
                                .map(|d| duration_ms(&format!("{p}.timeouts.request"), d))
                                .transpose()?,
                            t.backend_request
                                .as_deref()
                                .map(|d| duration_ms(&format!("{p}.timeouts.backendRequest"), d))
                                .transpose()?,
                        )
                    }
                };
                let limits = Limits {
                    attempts,
                    backoff,
                    request,
                    backend,
                };
                rules.push(rule(
                    route,
                    i,
                    r.name.as_deref(),
                    RuleParts {
                        methods: methods.clone(),
                        codes,
                        grpc_statuses: grpc_statuses.clone(),
                        replay,
                        limits,
                        matches,
                    },
                    &p,
                    &mut notes,
                ));
            }
        }
        Rules::Grpc(grpc) => {
            let grpc_statuses = grpc_statuses(route.annotations)?;
            let attempts = match route.annotations.get(ATTEMPTS_ANNOTATION) {
                None if grpc_statuses.is_empty() => 0,
                None => 1,
                Some(v) => {
                    let n = v
                        .trim()
                        .parse::<i64>()
                        .ok()
                        .filter(|n| *n >= 0)
                        .ok_or_else(|| {
                            unsupported(
                                format!("metadata.annotations[{ATTEMPTS_ANNOTATION}]"),
                                format!("must be a number of retries (got \"{v}\")"),
                            )
                        })?;
                    if n > MAX_ATTEMPTS {
                        notes.push(format!("{ATTEMPTS_ANNOTATION} {n} is above Reprise's maximum: {MAX_ATTEMPTS} retries"));
                    }
                    n.min(MAX_ATTEMPTS)
                }
            };
            let annotation_ms = |name: &str| {
                route
                    .annotations
                    .get(name)
                    .map(|d| duration_ms(&format!("metadata.annotations[{name}]"), d))
                    .transpose()
            };
            let limits = Limits {
                attempts,
                backoff: annotation_ms(BACKOFF_ANNOTATION)?,
                request: annotation_ms(REQUEST_TIMEOUT_ANNOTATION)?,
                backend: None,
            };
            notes.push("retries gRPC calls (POST) as its reprise.dev annotations say".to_string());
            for (i, r) in grpc.iter().enumerate() {
                let p = format!("spec.rules[{i}]");
                refuse_other(&p, &r.other)?;
                refuse_filters(&p, &r.filters)?;
                backends(&p, &r.backend_refs, parent, route.namespace)?;
                let mut matches = r
                    .matches
                    .iter()
                    .enumerate()
                    .map(|(j, m)| grpc_match(&format!("{p}.matches[{j}]"), m))
                    .collect::<Result<Vec<_>, _>>()?;
                if matches.is_empty() {
                    // Every gRPC call, and nothing else.
                    matches.push(grpc_only(RouteMatch::default()));
                }
                rules.push(rule(
                    route,
                    i,
                    r.name.as_deref(),
                    RuleParts {
                        methods: vec![HttpMethod::Any],
                        codes: Vec::new(),
                        grpc_statuses: grpc_statuses.clone(),
                        replay,
                        limits,
                        matches,
                    },
                    &p,
                    &mut notes,
                ));
            }
        }
    }
    Ok(Read { rules, notes })
}

/// A rule's numbers, as read.
#[derive(Clone, Copy)]
struct Limits {
    attempts: i64,
    backoff: Option<i64>,
    request: Option<i64>,
    backend: Option<i64>,
}

/// What one rule is made of.
struct RuleParts {
    methods: Vec<HttpMethod>,
    codes: Vec<i32>,
    grpc_statuses: Vec<GrpcStatusEntry>,
    replay: i64,
    limits: Limits,
    matches: Vec<RouteMatch>,
}

fn rule(
    route: &Route<'_>,
    index: usize,
    name: Option<&str>,
    parts: RuleParts,
    p: &str,
    notes: &mut Vec<String>,
) -> ReadRule {
    let l = parts.limits;
    let defaults = Retries::default();
    let (base, cap) = match l.backoff {
        // Envoy's ratio: the cap is ten times the base.
        Some(base) => (
            base.min(MAX_DEADLINE_MS),
            base.saturating_mul(10).min(MAX_DEADLINE_MS),
        ),
        None => (defaults.backoff_base_ms, defaults.backoff_cap_ms),
    };
    let deadline = match l.request {
        Some(0) | None => None,
        Some(ms) if ms > MAX_DEADLINE_MS => {
            notes.push(format!(
                "{p}.timeouts.request of {ms} ms is above Reprise's longest deadline: {MAX_DEADLINE_MS} ms"
            ));
            Some(MAX_DEADLINE_MS)
        }
        Some(ms) => Some(ms),
    };
    let attempt_timeout = match l.backend {
        Some(0) | None => None,
        Some(ms) => Some(ms.min(MAX_ATTEMPT_TIMEOUT_MS)),
    };
    ReadRule {
        rule: RetryRule {
            priority: 0,
            enabled: true,
            methods: parts.methods,
            request_match: None,
            failure_boundary: Boundary::Connect,
            statuses: parts.codes,
            grpc_statuses: parts.grpc_statuses,
            status_presets: Vec::new(),
            replay_limit_bytes: parts.replay,
            // The route relaxation: the author named the codes (GEP-1731),
            // for the methods above.
            acknowledge_duplicate_risk: true,
            retries: Retries {
                attempts: i32::try_from(l.attempts).unwrap_or(0),
                backoff_base_ms: base,
                backoff_cap_ms: cap,
                total_deadline_ms: deadline,
                attempt_timeout_ms: attempt_timeout,
                reuse_endpoints: true,
                ..defaults
            },
            // A route's deadline travels down the chain as a RetryPolicy's
            // does; its retries count for the layer rule alike.
            deadlines: None,
            retry_layers: None,
        },
        route: SnapshotRoute {
            kind: route.kind,
            route: route.name.to_string(),
            rule: name.map_or_else(|| index.to_string(), str::to_string),
            matches: parts.matches,
            deadline_answers_timeout: deadline.is_some(),
            no_attempt_timeout: l.backend == Some(0),
        },
        index,
    }
}

/// `"true"` or `"false"` (absent: false).
fn flag(annotations: &BTreeMap<String, String>, name: &str) -> Result<bool, Refused> {
    match annotations.get(name).map(|v| v.trim()) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(v) => Err(unsupported(
            format!("metadata.annotations[{name}]"),
            format!("must be \"true\" or \"false\" (got \"{v}\")"),
        )),
    }
}

fn grpc_statuses(annotations: &BTreeMap<String, String>) -> Result<Vec<GrpcStatusEntry>, Refused> {
    let Some(list) = annotations.get(GRPC_STATUSES_ANNOTATION) else {
        return Ok(Vec::new());
    };
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            // Gateway API and gRPC write them in upper case, Reprise in lower.
            let name = s.to_ascii_lowercase().replace('_', "-");
            code_of(&name)
                .map(|_| GrpcStatusEntry::Name(name))
                .ok_or_else(|| {
                    unsupported(
                        format!("metadata.annotations[{GRPC_STATUSES_ANNOTATION}]"),
                        format!("\"{s}\" is not a gRPC status name or a number in 1..=16"),
                    )
                })
        })
        .collect()
}

fn refuse_other(p: &str, other: &BTreeMap<String, serde_json::Value>) -> Result<(), Refused> {
    match other.keys().next() {
        None => Ok(()),
        Some(field) => Err(unsupported(
            format!("{p}.{field}"),
            "not implemented by Reprise",
        )),
    }
}

fn refuse_filters(p: &str, filters: &[serde_json::Value]) -> Result<(), Refused> {
    match filters.first() {
        None => Ok(()),
        Some(f) => Err(unsupported(
            format!("{p}.filters"),
            format!(
                "Reprise implements no filter ({})",
                f["type"].as_str().unwrap_or("unknown type")
            ),
        )),
    }
}

/// A mesh route's backends must be its parent Service itself: Reprise
/// retries, it does not route elsewhere or split traffic.
fn backends(
    p: &str,
    refs: &[BackendRef],
    parent: &ServiceParent,
    route_namespace: &str,
) -> Result<(), Refused> {
    let field = format!("{p}.backendRefs");
    let [one] = refs else {
        return Err(unsupported(
            &field,
            if refs.is_empty() {
                "a rule without backends answers 500 in Gateway API, which Reprise does not do"
                    .to_string()
            } else {
                format!("{} backends: Reprise does not split traffic", refs.len())
            },
        ));
    };
    refuse_other(&format!("{field}[0]"), &one.other)?;
    refuse_filters(&format!("{field}[0]"), &one.filters)?;
    let same = one.group.as_deref().unwrap_or_default() == ""
        && one.kind.as_deref().unwrap_or("Service") == "Service"
        && one.name == parent.name
        && one.namespace.as_deref().unwrap_or(route_namespace) == parent.namespace
        && (one.port.is_none() || parent.port.is_none() || one.port == parent.port);
    if !same {
        return Err(Refused {
            reason: "UnsupportedValue",
            message: format!(
                "{field}[0]: must be the parent Service {}/{} itself (Reprise retries calls to a Service; it does not send them elsewhere); Reprise does not apply the route",
                parent.namespace, parent.name
            ),
        });
    }
    if one.weight == Some(0) {
        return Err(unsupported(
            format!("{field}[0].weight"),
            "0 sends the rule's requests nowhere",
        ));
    }
    Ok(())
}

fn http_match(p: &str, m: &super::HttpRouteMatch) -> Result<RouteMatch, Refused> {
    refuse_other(p, &m.other)?;
    let mut out = RouteMatch {
        method: m.method.clone(),
        ..RouteMatch::default()
    };
    let path = m.path.clone().unwrap_or_default();
    let value = path.value.unwrap_or_else(|| "/".to_string());
    match path.type_.as_deref().unwrap_or("PathPrefix") {
        "PathPrefix" => out.path_segment_prefix = Some(value),
        "Exact" => out.path_exact = Some(value),
        "RegularExpression" => out.path_regex = Some(value),
        other => {
            return Err(unsupported(
                format!("{p}.path.type"),
                format!("\"{other}\" is not a path match type"),
            ))
        }
    }
    for (k, h) in m.headers.iter().enumerate() {
        let (exact, regex) = value_match(&format!("{p}.headers[{k}]"), h)?;
        out.headers.extend(exact);
        out.header_regexes.extend(regex);
    }
    for (k, q) in m.query_params.iter().enumerate() {
        match q.type_.as_deref().unwrap_or("Exact") {
            "Exact" => out.query.push(QueryMatch {
                name: q.name.clone(),
                value: q.value.clone(),
            }),
            other => {
                return Err(unsupported(
                    format!("{p}.queryParams[{k}].type"),
                    format!("{other} query parameter matches are not supported (Exact only)"),
                ))
            }
        }
    }
    Ok(out)
}

/// A header condition as an exact or a regular-expression match.
fn value_match(
    p: &str,
    h: &ValueMatch,
) -> Result<(Option<HeaderMatch>, Option<HeaderMatch>), Refused> {
    let m = HeaderMatch {
        name: h.name.to_ascii_lowercase(),
        value: Some(h.value.clone()),
    };
    match h.type_.as_deref().unwrap_or("Exact") {
        "Exact" => Ok((Some(m), None)),
        "RegularExpression" => Ok((None, Some(m))),
        other => Err(unsupported(
            format!("{p}.type"),
            format!("\"{other}\" is not a header match type"),
        )),
    }
}

/// `m` matching gRPC calls only: `content-type: application/grpc...`.
fn grpc_only(mut m: RouteMatch) -> RouteMatch {
    m.header_regexes.push(HeaderMatch {
        name: "content-type".into(),
        value: Some("application/grpc(\\+.*|;.*)?".into()),
    });
    m
}

fn grpc_match(p: &str, m: &super::GrpcRouteMatch) -> Result<RouteMatch, Refused> {
    refuse_other(p, &m.other)?;
    let mut out = RouteMatch {
        method: Some("POST".into()),
        ..RouteMatch::default()
    };
    for (k, h) in m.headers.iter().enumerate() {
        let (exact, regex) = value_match(&format!("{p}.headers[{k}]"), h)?;
        out.headers.extend(exact);
        out.header_regexes.extend(regex);
    }
    let method = m.method.clone().unwrap_or_default();
    let (service, name) = (method.service.as_deref(), method.method.as_deref());
    match method.type_.as_deref().unwrap_or("Exact") {
        "Exact" => match (service, name) {
            (Some(s), Some(n)) => out.path_exact = Some(format!("/{s}/{n}")),
            (Some(s), None) => out.path_prefix = Some(format!("/{s}/")),
            (None, Some(n)) => out.path_regex = Some(format!("/[^/]+/{}", regex_escape(n))),
            (None, None) => return Ok(grpc_only(out)),
        },
        "RegularExpression" => {
            out.path_regex = Some(format!(
                "/{}/{}",
                service.unwrap_or("[^/]+"),
                name.unwrap_or("[^/]+")
            ))
        }
        other => {
            return Err(unsupported(
                format!("{p}.method.type"),
                format!("\"{other}\" is not a method match type"),
            ))
        }
    }
    Ok(out)
}

/// `s` with the regular-expression metacharacters escaped.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A Gateway API `Duration` (`^([0-9]{1,5}(h|m|s|ms)){1,4}$`) in milliseconds.
pub(crate) fn duration_ms(field: &str, d: &str) -> Result<i64, Refused> {
    let bad = || {
        unsupported(
            field,
            format!("\"{d}\" is not a Gateway API duration (e.g. 500ms, 2s, 1m30s)"),
        )
    };
    let mut total: i64 = 0;
    let mut rest = d;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return Err(bad());
        }
        let n: i64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('s') {
            (1_000, 1)
        } else {
            return Err(bad());
        };
        rest = &rest[len..];
        total += n * unit;
        parts += 1;
    }
    if parts == 0 || parts > 4 {
        return Err(bad());
    }
    Ok(total)
}

#[cfg(test)]
mod tests;
