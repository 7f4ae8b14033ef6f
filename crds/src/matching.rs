//! Request-only matchers for retry rules: method, path, headers, and a CEL
//! expression (compiled and run by [`crate::cel_match`]).

use serde::{Deserialize, Serialize};

/// Which requests a rule applies to, beyond its method list and upstream filter.
/// Every present condition must hold; an empty match accepts every request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestMatch {
    /// The path must equal this exactly (query string excluded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_exact: Option<String>,
    /// The path must start with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// The path must be this or go on with `/` after it: whole path
    /// elements, as Gateway API's `PathPrefix` (`/retry` matches `/retry`
    /// and `/retry/x`, not `/retryx`; a trailing `/` of the prefix is
    /// ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_segment_prefix: Option<String>,
    /// Every listed query parameter must be present with its value (the
    /// first occurrence of the name, compared as sent, case-sensitively).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<QueryMatch>,
    /// Every listed header must match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderMatch>,
    /// A CEL expression over the request that must yield true. Resolved
    /// configurations hold it compiled, as [`crate::Rule::cel`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cel: Option<String>,
}

/// One header condition: present, or equal to a value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatch {
    /// Header name, case-insensitive.
    pub name: String,
    /// When set, the header's value must equal this exactly; when absent the
    /// header only has to be present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// One query parameter condition: the first `name=` in the query must carry `value`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryMatch {
    /// Parameter name, case-sensitive.
    pub name: String,
    /// Its value, exactly as sent.
    pub value: String,
}

/// True when `path` is `prefix` or goes on with `/` after it, a trailing
/// `/` of `prefix` ignored: Gateway API's element-wise `PathPrefix`.
pub fn segment_prefix_matches(prefix: &str, path: &str) -> bool {
    let prefix = match prefix.strip_suffix('/') {
        Some(p) => p,
        None => prefix,
    };
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// The value of the first parameter `name` in `query` (`a=1&b=2`); a
/// parameter without `=` has the empty value.
pub fn query_value<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}

impl RequestMatch {
    /// True when the request's path and headers satisfy every condition but
    /// the CEL expression (which the resolved rule runs).
    /// `header` returns the value of a header by lower-case name.
    pub fn matches<'a>(&self, path: &str, header: impl Fn(&str) -> Option<&'a [u8]>) -> bool {
        if let Some(exact) = &self.path_exact {
            if path != exact {
                return false;
            }
        }
        if let Some(prefix) = &self.path_prefix {
            if !path.starts_with(prefix.as_str()) {
                return false;
            }
        }
        if let Some(prefix) = &self.path_segment_prefix {
            if !segment_prefix_matches(prefix, path) {
                return false;
            }
        }
        self.headers
            .iter()
            .all(|h| match (header(&h.name), &h.value) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(got), Some(want)) => got == want.as_bytes(),
            })
    }

    /// True when the request's query (without `?`; `None` when the target
    /// has none) satisfies every query condition.
    pub fn matches_query(&self, query: Option<&str>) -> bool {
        self.query
            .iter()
            .all(|q| query.and_then(|s| query_value(s, &q.name)) == Some(q.value.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_conditions_must_hold() {
        let m = RequestMatch {
            path_exact: None,
            path_prefix: Some("/v1/".into()),
            path_segment_prefix: None,
            query: Vec::new(),
            headers: vec![
                HeaderMatch {
                    name: "x-tenant".into(),
                    value: Some("a".into()),
                },
                HeaderMatch {
                    name: "x-idempotency-key".into(),
                    value: None,
                },
            ],
            cel: None,
        };
        let both = |n: &str| match n {
            "x-tenant" => Some(&b"a"[..]),
            "x-idempotency-key" => Some(&b"k1"[..]),
            _ => None,
        };
        assert!(m.matches("/v1/items", both));
        assert!(!m.matches("/v2/items", both));
        assert!(!m.matches("/v1/items", |n: &str| if n == "x-tenant" {
            Some(&b"b"[..])
        } else {
            None
        }));
        assert!(RequestMatch::default().matches("/anything", |_: &str| None));
    }

    #[test]
    fn a_segment_prefix_matches_whole_path_elements() {
        for (prefix, path, want) in [
            ("/retry", "/retry", true),
            ("/retry", "/retry/", true),
            ("/retry", "/retry/x", true),
            ("/retry", "/retryx", false),
            ("/retry/", "/retry", true),
            ("/retry/", "/retry/x", true),
            ("/retry/", "/retryx", false),
            ("/", "/anything", true),
            ("/", "/", true),
            ("/a/b", "/a", false),
            ("/a/b", "/a/b/c", true),
        ] {
            assert_eq!(
                segment_prefix_matches(prefix, path),
                want,
                "{prefix} against {path}"
            );
        }
    }

    #[test]
    fn query_conditions_take_the_first_occurrence_as_sent() {
        let m = RequestMatch {
            query: vec![QueryMatch {
                name: "animal".into(),
                value: "whale".into(),
            }],
            ..RequestMatch::default()
        };
        assert!(m.matches_query(Some("animal=whale")));
        assert!(m.matches_query(Some("x=1&animal=whale&animal=dolphin")));
        assert!(!m.matches_query(Some("animal=dolphin&animal=whale")));
        assert!(
            !m.matches_query(Some("Animal=whale")),
            "names are case-sensitive"
        );
        assert!(!m.matches_query(Some("animal")));
        assert!(!m.matches_query(None));
        assert!(RequestMatch::default().matches_query(None));
    }
}
