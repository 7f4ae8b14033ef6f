//! A snapshot policy read from a Gateway API route rule rather than a
//! RetryPolicy (`docs/src/tasks/httproute.md`): the controller maps the
//! route's matches, `retry` and `timeouts` to a [`RetryRule`] and this
//! [`SnapshotRoute`], and both ends resolve them here into the sidecar's
//! [`Rule`]s, one per match (a route rule's matches are ORed).
//!
//! What a route can say that a RetryPolicy cannot is here: element-wise path
//! prefixes, query parameters, regular expressions, a single method matched
//! while only some are retried, a deadline that answers `504`, and an
//! attempt timeout turned off. Regular expressions (Gateway API's
//! implementation-specific `RegularExpression`) run as the rule's CEL
//! condition (`matches`, RE2 syntax, the whole value), checked here first
//! so that a broken one is refused with its field.

use serde::{Deserialize, Serialize};

use crate::config::Rule;
use crate::matching::{HeaderMatch, QueryMatch, RequestMatch};
use crate::policy::MethodSet;
use crate::validation::ValidationErrors;

/// Most matches one route rule may have (Gateway API's `maxItems`).
pub const MAX_MATCHES: usize = 64;

/// The kinds of route Reprise reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RouteKind {
    /// `gateway.networking.k8s.io/v1` HTTPRoute.
    #[serde(rename = "HTTPRoute")]
    Http,
    /// `gateway.networking.k8s.io/v1` GRPCRoute.
    #[serde(rename = "GRPCRoute")]
    Grpc,
}

impl RouteKind {
    /// The kind's name, as written in YAML and in rule ids.
    pub fn name(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
        }
    }
}

/// What a route rule adds to its [`RetryRule`](crate::retry_rule::RetryRule).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotRoute {
    /// The kind of route.
    pub kind: RouteKind,
    /// The route's name.
    pub route: String,
    /// The rule's `name`, or its index in `rules`.
    pub rule: String,
    /// The requests it applies to: any of these; none: every request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<RouteMatch>,
    /// When the total deadline (`timeouts.request`) ends the retries, the
    /// client gets `504` (Gateway API's request timeout).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deadline_answers_timeout: bool,
    /// `timeouts.backendRequest: 0s`: attempts have no timeout at all.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_attempt_timeout: bool,
}

/// One of a route rule's matches: every condition present must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteMatch {
    /// Where it runs among the rules of its precedence class: the
    /// controller ranks every match of every route for a Service as Gateway
    /// API orders them.
    #[serde(default)]
    pub priority: i32,
    /// The one method matched (any when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The path must equal this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_exact: Option<String>,
    /// The path must start with this string (a GRPCRoute's service without
    /// a method: `/pkg.Service/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// The path must start with these whole elements (`PathPrefix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_segment_prefix: Option<String>,
    /// The whole path must match this regular expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_regex: Option<String>,
    /// Headers that must equal a value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderMatch>,
    /// Headers whose whole value must match a regular expression (`value`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub header_regexes: Vec<HeaderMatch>,
    /// Query parameters that must equal a value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<QueryMatch>,
}

impl SnapshotRoute {
    /// The rules this route rule runs as, from `rule` (its RetryRule
    /// resolved under `id`): one per match, the first under `id`, the others
    /// under `id/N`, all reporting their traffic as `id`. `p` prefixes the
    /// field paths of errors.
    pub fn rules(&self, rule: Rule, id: &str, p: &str, errs: &mut ValidationErrors) -> Vec<Rule> {
        let mut rule = rule;
        rule.policy.deadline_answers_timeout = self.deadline_answers_timeout;
        if self.no_attempt_timeout {
            rule.policy.attempt_timeout = Some(std::time::Duration::ZERO);
        }
        if self.matches.len() > MAX_MATCHES {
            errs.push(
                format!("{p}.matches"),
                format!(
                    "must have at most {MAX_MATCHES} items (got {})",
                    self.matches.len()
                ),
            );
        }
        if self.matches.is_empty() {
            rule.methods = MethodSet::parse_one("*").unwrap_or(MethodSet::NONE);
            return vec![rule];
        }
        self.matches
            .iter()
            .enumerate()
            .map(|(j, m)| {
                let mut r = rule.clone();
                r.priority = m.priority;
                if j > 0 {
                    r.id = format!("{id}/{j}");
                    r.report_as = Some(id.to_string());
                }
                m.apply(&mut r, &format!("{p}.matches[{j}]"), errs);
                r
            })
            .collect()
    }
}

impl RouteMatch {
    /// Sets `rule`'s matched methods, request match and CEL condition.
    fn apply(&self, rule: &mut Rule, p: &str, errs: &mut ValidationErrors) {
        rule.methods = match &self.method {
            None => MethodSet::parse_one("*").unwrap_or(MethodSet::NONE),
            // CONNECT and TRACE are never retried: a rule for them matches
            // nothing, and they pass through as every request a rule does not take.
            Some(m) if m == "CONNECT" || m == "TRACE" => MethodSet::NONE,
            Some(m) => match MethodSet::parse_one(m)
                .filter(|_| m != "*" && m.bytes().all(|b| b.is_ascii_uppercase()))
            {
                Some(set) => set,
                None => {
                    errs.push(
                        format!("{p}.method"),
                        format!("must be an HTTP method in upper case (got \"{m}\")"),
                    );
                    MethodSet::NONE
                }
            },
        };
        for (field, path) in [
            ("pathExact", &self.path_exact),
            ("pathPrefix", &self.path_prefix),
            ("pathSegmentPrefix", &self.path_segment_prefix),
        ] {
            if let Some(path) = path {
                if !path.starts_with('/') {
                    errs.push(
                        format!("{p}.{field}"),
                        format!("must start with / (got \"{path}\")"),
                    );
                }
            }
        }
        let mut cel = Vec::new();
        if let Some(re) = &self.path_regex {
            if check_regex(errs, &format!("{p}.pathRegex"), re) {
                cel.push(format!("request.path.matches({})", whole(re)));
            }
        }
        for (i, h) in self.header_regexes.iter().enumerate() {
            let field = format!("{p}.headerRegexes[{i}]");
            let name = h.name.to_ascii_lowercase();
            if !valid_header_name(&name) {
                errs.push(
                    format!("{field}.name"),
                    format!("must be a header name (got \"{}\")", h.name),
                );
                continue;
            }
            let re = h.value.as_deref().unwrap_or_default();
            if check_regex(errs, &format!("{field}.value"), re) {
                let key = literal(&name);
                cel.push(format!(
                    "({key} in request.headers && request.headers[{key}].matches({}))",
                    whole(re)
                ));
            }
        }
        rule.request_match = RequestMatch {
            path_exact: self.path_exact.clone(),
            path_prefix: self.path_prefix.clone(),
            path_segment_prefix: self.path_segment_prefix.clone(),
            query: self.query.clone(),
            headers: self
                .headers
                .iter()
                .map(|h| HeaderMatch {
                    name: h.name.to_ascii_lowercase(),
                    value: h.value.clone(),
                })
                .collect(),
            cel: None,
        };
        rule.cel = if cel.is_empty() {
            None
        } else {
            let source = cel.join(" && ");
            match crate::cel_match::CelMatch::compile(&source) {
                Ok(c) => Some(c),
                Err(e) => {
                    errs.push(format!("{p}.regularExpressions"), e);
                    None
                }
            }
        };
    }
}

/// A header name as HTTP allows it (RFC 9110 token characters).
fn valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Refuses a regular expression the sidecar cannot run (RE2 syntax, as
/// the `regex` crate and CEL's `matches` take it); true when it is good.
fn check_regex(errs: &mut ValidationErrors, field: &str, re: &str) -> bool {
    if re.len() > 1024 {
        errs.push(
            field,
            format!("must be at most 1024 bytes (got {})", re.len()),
        );
        return false;
    }
    match regex::Regex::new(re) {
        Ok(_) => true,
        Err(e) => {
            // The parser's message spans lines (the pattern, a caret); one line reads better in a status.
            let e = e.to_string();
            let e = e.split_whitespace().collect::<Vec<_>>().join(" ");
            errs.push(
                field,
                format!("must be a regular expression (RE2 syntax): {e}"),
            );
            false
        }
    }
}

/// The CEL string literal of a regular expression anchored to the whole value.
fn whole(re: &str) -> String {
    literal(&format!("^(?:{re})$"))
}

/// `s` as a CEL string literal.
fn literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cel_match::CelRequest;
    use crate::retry_rule::RetryRule;

    fn route(matches: Vec<RouteMatch>) -> SnapshotRoute {
        SnapshotRoute {
            kind: RouteKind::Http,
            route: "api".into(),
            rule: "0".into(),
            matches,
            deadline_answers_timeout: true,
            no_attempt_timeout: false,
        }
    }

    fn resolve(route: &SnapshotRoute) -> Result<Vec<Rule>, String> {
        let mut errs = ValidationErrors::default();
        let (rule, _) = RetryRule::default().resolve("shop/r", "api.shop", "spec", &mut errs);
        let rules = route.rules(rule, "shop/r", "route", &mut errs);
        if errs.is_empty() {
            Ok(rules)
        } else {
            Err(errs.to_string())
        }
    }

    fn matches(rule: &Rule, method: &str, path: &str, query: Option<&str>) -> bool {
        let headers = [("x-tenant", "blue-7")];
        let header = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.as_bytes())
        };
        rule.matches("api.shop", method, path, query, header)
            && rule.cel.as_ref().is_none_or(|c| {
                c.evaluate(&CelRequest {
                    method,
                    path,
                    host: "api",
                    headers: &headers,
                })
                .unwrap_or(false)
            })
    }

    #[test]
    fn each_match_is_a_rule_reporting_as_the_route_rule() {
        let rules = resolve(&route(vec![
            RouteMatch {
                path_segment_prefix: Some("/retry".into()),
                ..RouteMatch::default()
            },
            RouteMatch {
                method: Some("POST".into()),
                query: vec![QueryMatch {
                    name: "a".into(),
                    value: "1".into(),
                }],
                ..RouteMatch::default()
            },
        ]))
        .expect("valid");
        assert_eq!(
            rules.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["shop/r", "shop/r/1"]
        );
        assert!(rules.iter().all(|r| r.report_id() == "shop/r"));
        assert!(rules.iter().all(|r| r.policy.deadline_answers_timeout));
        assert!(matches(&rules[0], "DELETE", "/retry/x", None));
        assert!(!matches(&rules[0], "GET", "/retryx", None));
        assert!(matches(&rules[1], "POST", "/", Some("a=1")));
        assert!(!matches(&rules[1], "GET", "/", Some("a=1")));
        assert!(!matches(&rules[1], "POST", "/", Some("a=2")));
        // Matching POST is not retrying it: the retried methods stay the rule's.
        assert!(!rules[1].policy.methods.contains("POST"));
    }

    #[test]
    fn regular_expressions_match_the_whole_value() {
        let rules = resolve(&route(vec![RouteMatch {
            path_regex: Some("/v[0-9]+/items".into()),
            header_regexes: vec![HeaderMatch {
                name: "X-Tenant".into(),
                value: Some("blue-[0-9]".into()),
            }],
            ..RouteMatch::default()
        }]))
        .expect("valid");
        assert!(matches(&rules[0], "GET", "/v2/items", None));
        assert!(!matches(&rules[0], "GET", "/v2/items/3", None), "anchored");
        assert!(!matches(&rules[0], "GET", "/x/v2/items", None), "anchored");
    }

    #[test]
    fn broken_matches_are_refused_with_their_field() {
        let err = resolve(&route(vec![RouteMatch {
            method: Some("get".into()),
            path_segment_prefix: Some("retry".into()),
            path_regex: Some("(".into()),
            header_regexes: vec![HeaderMatch {
                name: "bad name".into(),
                value: Some("x".into()),
            }],
            ..RouteMatch::default()
        }]))
        .expect_err("refused");
        assert!(
            err.contains(
                "route.matches[0].method: must be an HTTP method in upper case (got \"get\")"
            ),
            "{err}"
        );
        assert!(
            err.contains("route.matches[0].pathSegmentPrefix: must start with /"),
            "{err}"
        );
        assert!(
            err.contains("route.matches[0].pathRegex: must be a regular expression"),
            "{err}"
        );
        assert!(
            err.contains("route.matches[0].headerRegexes[0].name: must be a header name"),
            "{err}"
        );
    }

    #[test]
    fn cel_literals_escape_quotes_and_backslashes() {
        assert_eq!(literal(r"a'b\c"), r"'a\'b\\c'");
        let rules = resolve(&route(vec![RouteMatch {
            path_regex: Some(r"/it's\.json".into()),
            ..RouteMatch::default()
        }]))
        .expect("valid");
        assert!(matches(&rules[0], "GET", "/it's.json", None));
        assert!(!matches(&rules[0], "GET", "/it'sxjson", None));
    }
}
