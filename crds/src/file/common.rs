//! Field checks shared by the gateway `retries` block and the rules.

use std::time::Duration;

use super::retries::{HedgeSpec, StatusEntry};
use crate::grpc::GrpcStatusSet;
use crate::policy::{
    FailureBoundary, MethodSet, StatusSet, GATEWAY_STATUSES, MAX_REPLAY_LIMIT_BYTES,
    MAX_TOTAL_DEADLINE_MS, TRANSIENT_STATUSES,
};
use crate::validation::ValidationErrors;

/// True for a lower-case DNS name of labels of letters, digits and '-'.
pub(crate) fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// `value` (or `default` when absent) checked against `min..=max`.
pub(crate) fn ranged(
    errs: &mut ValidationErrors,
    field: &str,
    value: Option<u64>,
    default: u64,
    min: u64,
    max: u64,
) -> u64 {
    let v = value.unwrap_or(default);
    if v < min {
        errs.push(field, format!("must be at least {min} (got {v})"));
    } else if v > max {
        errs.push(field, format!("must be at most {max} (got {v})"));
    }
    v
}

/// Backoff base and cap: the cap must be at least the base.
pub(crate) fn backoff(
    errs: &mut ValidationErrors,
    p: &str,
    base: Option<u64>,
    cap: Option<u64>,
) -> (Duration, Duration) {
    let base = ranged(errs, &format!("{p}.backoff_base_ms"), base, 25, 0, 600_000);
    let cap = ranged(errs, &format!("{p}.backoff_cap_ms"), cap, 250, 0, 600_000);
    if cap < base {
        errs.push(
            format!("{p}.backoff_cap_ms"),
            format!("must be >= backoff_base_ms ({base}) (got {cap})"),
        );
    }
    (Duration::from_millis(base), Duration::from_millis(cap))
}

/// `total_deadline_ms`: absent is unbounded; a present 0 is refused.
pub(crate) fn total_deadline(
    errs: &mut ValidationErrors,
    p: &str,
    value: Option<u64>,
) -> Option<Duration> {
    let field = format!("{p}.total_deadline_ms");
    match value {
        None => None,
        Some(0) => {
            errs.push(
                field,
                "must not be 0; omit the field for an unbounded deadline",
            );
            None
        }
        Some(v) if v > MAX_TOTAL_DEADLINE_MS => {
            errs.push(
                field,
                format!("must be at most {MAX_TOTAL_DEADLINE_MS} (got {v})"),
            );
            None
        }
        Some(v) => Some(Duration::from_millis(v)),
    }
}

/// The replay buffer cap (`buffer_max_bytes` or `replay_limit_bytes`).
pub(crate) fn replay_limit(errs: &mut ValidationErrors, field: &str, value: Option<u64>) -> u64 {
    let v = value.unwrap_or(0);
    if v > MAX_REPLAY_LIMIT_BYTES {
        errs.push(
            field,
            format!("must be at most {MAX_REPLAY_LIMIT_BYTES} (4 MiB) (got {v})"),
        );
    }
    v.min(MAX_REPLAY_LIMIT_BYTES)
}

/// `hedge`: `off`, `false`, or `{ delay_ms }`.
pub(crate) fn hedge(
    errs: &mut ValidationErrors,
    p: &str,
    value: Option<&HedgeSpec>,
) -> Option<Duration> {
    match value {
        None | Some(HedgeSpec::Enabled(false)) => None,
        Some(HedgeSpec::Word(w)) if w == "off" => None,
        Some(HedgeSpec::Word(w)) => {
            errs.push(
                format!("{p}.hedge"),
                format!("must be off or {{ delay_ms: N }} (got \"{w}\")"),
            );
            None
        }
        Some(HedgeSpec::Enabled(true)) => {
            errs.push(
                format!("{p}.hedge"),
                "must be off or { delay_ms: N }: a hedge needs its delay",
            );
            None
        }
        Some(HedgeSpec::Delay { delay_ms }) => {
            let v = ranged(
                errs,
                &format!("{p}.hedge.delay_ms"),
                Some(*delay_ms),
                0,
                1,
                600_000,
            );
            Some(Duration::from_millis(v))
        }
    }
}

/// A status list: codes in 400..=599 or the presets `gateway` and `transient`,
/// each entry checked at `field[i]`. Every status list of both formats goes
/// through here: the file's `retry_statuses` and `rules[].statuses`, and a
/// RetryPolicy's `statuses` and `statusPresets`.
pub(crate) fn statuses(
    errs: &mut ValidationErrors,
    field: &str,
    entries: &[StatusEntry],
) -> StatusSet {
    let mut set = StatusSet::NONE;
    for (i, e) in entries.iter().enumerate() {
        match e {
            StatusEntry::Code(c) if (400..=599).contains(c) => {
                set.insert(u16::try_from(*c).unwrap_or(0))
            }
            StatusEntry::Code(c) => errs.push(
                format!("{field}[{i}]"),
                format!("must be a 4xx or 5xx status in 400..=599 (got {c})"),
            ),
            StatusEntry::Preset(name) => match name.as_str() {
                "gateway" => GATEWAY_STATUSES.iter().for_each(|s| set.insert(*s)),
                "transient" => TRANSIENT_STATUSES.iter().for_each(|s| set.insert(*s)),
                other => errs.push(
                    format!("{field}[{i}]"),
                    format!(
                        "must be a status code or a preset (gateway, transient) (got \"{other}\")"
                    ),
                ),
            },
        }
    }
    set
}

/// What a retry rule retries, as far as the duplicate-risk rule is concerned.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Retried {
    /// The methods retried.
    pub(crate) methods: MethodSet,
    /// How far a failed attempt may have got.
    pub(crate) boundary: FailureBoundary,
    /// The HTTP statuses retried.
    pub(crate) statuses: StatusSet,
    /// The gRPC statuses retried.
    pub(crate) grpc_statuses: GrpcStatusSet,
}

/// The duplicate-risk rule of a retry rule, for the file's `rules[]` and a
/// RetryPolicy alike: methods other than GET, HEAD and OPTIONS, the
/// before-headers failure boundary, status retries and gRPC status retries
/// each need the acknowledgement. Unless `acknowledged`, one error at
/// `field` (the acknowledgement, as the format spells it) names each of them;
/// `before_headers` is how the format writes that boundary. The CRD states
/// the same rule in CEL (`RetryRule`'s validation on
/// `acknowledgeDuplicateRisk`); a test in `retry_rule` holds the two to
/// agreement. (An upstream's `retries` block has its own, older rule:
/// `retry_post` and the acknowledgement for PUT, DELETE, PATCH and `*`.)
pub(crate) fn duplicate_risk(
    errs: &mut ValidationErrors,
    field: &str,
    before_headers: &str,
    acknowledged: bool,
    retried: Retried,
) {
    if acknowledged {
        return;
    }
    let mut needs = Vec::new();
    if retried.methods.has_unsafe() {
        needs.push("methods other than GET, HEAD and OPTIONS");
    }
    if retried.boundary == FailureBoundary::BeforeHeaders {
        needs.push(before_headers);
    }
    if !retried.statuses.is_empty() {
        needs.push("status retries");
    }
    if !retried.grpc_statuses.is_empty() {
        needs.push("gRPC status retries");
    }
    if !needs.is_empty() {
        errs.push(
            field,
            format!(
                "must be true for {} (a retry may duplicate an upstream operation)",
                needs.join(", ")
            ),
        );
    }
}

/// A method list; CONNECT and TRACE are refused because they are never retried.
pub(crate) fn methods(errs: &mut ValidationErrors, field: &str, names: &[String]) -> MethodSet {
    let mut set = MethodSet::NONE;
    for (i, name) in names.iter().enumerate() {
        match MethodSet::parse_one(name) {
            Some(m) => set = set.union(m),
            None if name.eq_ignore_ascii_case("CONNECT") || name.eq_ignore_ascii_case("TRACE") => errs.push(
                format!("{field}[{i}]"),
                format!("{} is never retried", name.to_ascii_uppercase()),
            ),
            None => errs.push(
                format!("{field}[{i}]"),
                format!("must be one of GET, HEAD, OPTIONS, PUT, DELETE, POST, PATCH or * (got \"{name}\")"),
            ),
        }
    }
    set
}

/// Compiles a rule's `match.cel`; a broken expression is reported at `field`
/// with its position.
pub(crate) fn cel(
    errs: &mut ValidationErrors,
    field: &str,
    source: Option<&str>,
) -> Option<crate::cel_match::CelMatch> {
    match crate::cel_match::CelMatch::compile(source?) {
        Ok(m) => Some(m),
        Err(e) => {
            errs.push(field, e);
            None
        }
    }
}

/// Virtual addresses as written (`IP:PORT`, `[IPv6]:PORT`): each must parse,
/// have a port, and appear once.
pub(crate) fn addresses(
    errs: &mut ValidationErrors,
    field: &str,
    written: &[String],
) -> Vec<std::net::SocketAddr> {
    let mut out = Vec::with_capacity(written.len());
    let mut seen = std::collections::HashSet::with_capacity(written.len());
    for (i, a) in written.iter().enumerate() {
        match a.parse::<std::net::SocketAddr>() {
            Ok(addr) if addr.port() == 0 => errs.push(
                format!("{field}[{i}]"),
                format!("must have a port in 1..=65535 (got \"{a}\")"),
            ),
            Ok(addr) if !seen.insert(addr) => errs.push(
                format!("{field}[{i}]"),
                format!("must be unique (got \"{a}\" twice)"),
            ),
            Ok(addr) => out.push(addr),
            Err(_) => errs.push(
                format!("{field}[{i}]"),
                format!("must be IP:PORT, e.g. 10.96.0.10:80 or [fd00::10]:80 (got \"{a}\")"),
            ),
        }
    }
    out
}
