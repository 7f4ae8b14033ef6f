//! Gateway API's order between the matches of every route attached to one
//! Service for one set of callers: each match gets the priority it runs at.
//!
//! HTTPRoute (the specification's "Matching precedence"): an `Exact` path,
//! then the longest `PathPrefix`, then a method match, then the most header
//! matches, then the most query parameter matches; regular-expression paths
//! (implementation-specific) after every prefix. GRPCRoute: the longest
//! service, then the longest method, then the most header matches. GRPCRoute
//! matches run before HTTPRoute ones: they take gRPC calls only. Ties go to
//! the oldest route, then the first by `namespace/name`, then the first rule
//! and match in the route's order.

use std::cmp::Reverse;

use reprise_crds::snapshot::{RouteKind, RouteMatch};

/// One match of one rule of one route, with what orders it.
#[derive(Clone, Debug)]
pub(crate) struct Ranked<'a> {
    /// The route's kind.
    pub(crate) kind: RouteKind,
    /// The route's creation time (RFC 3339 orders as text).
    pub(crate) created: Option<String>,
    /// `namespace/name` of the route.
    pub(crate) route: String,
    /// The rule's index.
    pub(crate) rule: usize,
    /// The match's index.
    pub(crate) index: usize,
    /// The match.
    pub(crate) m: &'a RouteMatch,
}

/// What sorts a match: lower first.
type Key = (
    u8,
    u8,
    Reverse<usize>,
    Reverse<usize>,
    Reverse<usize>,
    Reverse<usize>,
    bool,
);

fn key(r: &Ranked<'_>) -> Key {
    let m = r.m;
    let headers = m.headers.len() + m.header_regexes.len();
    match r.kind {
        RouteKind::Grpc => {
            // `/service/method` exact, `/service/` a prefix, else a pattern.
            let path = m
                .path_exact
                .as_deref()
                .or(m.path_prefix.as_deref())
                .unwrap_or("");
            let mut parts = path.trim_matches('/').splitn(2, '/');
            let service = parts.next().unwrap_or("").len();
            let method = parts.next().unwrap_or("").len();
            (
                0,
                0,
                Reverse(service),
                Reverse(method),
                Reverse(headers),
                Reverse(0),
                false,
            )
        }
        RouteKind::Http => {
            let (kind, len) = if let Some(p) = &m.path_exact {
                (0, p.len())
            } else if let Some(p) = &m.path_segment_prefix {
                (1, p.trim_end_matches('/').len())
            } else if let Some(p) = &m.path_regex {
                (2, p.len())
            } else {
                (1, 0)
            };
            (
                1,
                kind,
                Reverse(len),
                Reverse(usize::from(m.method.is_some())),
                Reverse(headers),
                Reverse(m.query.len()),
                false,
            )
        }
    }
}

/// The priorities of `matches`, in their order: `out[i]` is where
/// `matches[i]` runs (0 first).
pub(crate) fn rank(matches: &[Ranked<'_>]) -> Vec<i32> {
    let mut order: Vec<usize> = (0..matches.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&matches[a], &matches[b]);
        key(x)
            .cmp(&key(y))
            .then_with(|| match (&x.created, &y.created) {
                (Some(a), Some(b)) => a.cmp(b),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => std::cmp::Ordering::Equal,
            })
            .then_with(|| x.route.cmp(&y.route))
            .then_with(|| x.rule.cmp(&y.rule))
            .then_with(|| x.index.cmp(&y.index))
    });
    let mut out = vec![0; matches.len()];
    for (priority, i) in order.into_iter().enumerate() {
        out[i] = i32::try_from(priority).unwrap_or(i32::MAX);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(path: (&str, &str)) -> RouteMatch {
        let mut m = RouteMatch::default();
        match path.0 {
            "Exact" => m.path_exact = Some(path.1.into()),
            "Regex" => m.path_regex = Some(path.1.into()),
            _ => m.path_segment_prefix = Some(path.1.into()),
        }
        m
    }

    fn ranked<'a>(m: &'a RouteMatch, route: &str, created: &str, rule: usize) -> Ranked<'a> {
        Ranked {
            kind: RouteKind::Http,
            created: Some(created.into()),
            route: route.into(),
            rule,
            index: 0,
            m,
        }
    }

    #[test]
    fn exact_then_longest_prefix_then_method_headers_query_then_age_name_and_order() {
        let exact = http(("Exact", "/a"));
        let long = http(("PathPrefix", "/a/b/"));
        let short = http(("PathPrefix", "/a"));
        let mut with_method = http(("PathPrefix", "/a"));
        with_method.method = Some("GET".into());
        let mut with_header = http(("PathPrefix", "/a"));
        with_header
            .headers
            .push(reprise_crds::matching::HeaderMatch {
                name: "x".into(),
                value: Some("1".into()),
            });
        let regex = http(("Regex", "/a.*"));
        let root = http(("PathPrefix", "/"));
        let t = "2026-01-01T00:00:00Z";
        let older = "2025-01-01T00:00:00Z";
        let all = vec![
            ranked(&root, "ns/z", t, 0),
            ranked(&regex, "ns/z", t, 1),
            ranked(&short, "ns/b", t, 0),
            ranked(&short, "ns/a", t, 0),
            ranked(&short, "ns/c", older, 0),
            ranked(&with_header, "ns/z", t, 2),
            ranked(&with_method, "ns/z", t, 3),
            ranked(&long, "ns/z", t, 4),
            ranked(&exact, "ns/z", t, 5),
        ];
        let p = rank(&all);
        let mut by_priority: Vec<(i32, String)> = p
            .iter()
            .zip(&all)
            .map(|(p, r)| (*p, format!("{}#{}", r.route, r.rule)))
            .collect();
        by_priority.sort();
        let names: Vec<&str> = by_priority.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "ns/z#5", // Exact
                "ns/z#4", // the longest prefix
                "ns/z#3", // a method
                "ns/z#2", // a header
                "ns/c#0", // the oldest route
                "ns/a#0", // then by name
                "ns/b#0", "ns/z#0", // `/`: the shortest prefix
                "ns/z#1", // regular expressions after every prefix
            ]
        );
    }

    #[test]
    fn grpc_matches_run_first_longest_service_then_method() {
        let http_root = http(("PathPrefix", "/"));
        let service = RouteMatch {
            path_prefix: Some("/pkg.Svc/".into()),
            ..RouteMatch::default()
        };
        let method = RouteMatch {
            path_exact: Some("/pkg.Svc/Get".into()),
            ..RouteMatch::default()
        };
        let g = |m: &'static RouteMatch| Ranked {
            kind: RouteKind::Grpc,
            created: None,
            route: "ns/g".into(),
            rule: 0,
            index: 0,
            m,
        };
        let service: &'static RouteMatch = Box::leak(Box::new(service));
        let method: &'static RouteMatch = Box::leak(Box::new(method));
        let all = vec![ranked(&http_root, "ns/h", "2020", 0), g(service), g(method)];
        assert_eq!(rank(&all), vec![2, 1, 0]);
    }
}
