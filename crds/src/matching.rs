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
        self.headers
            .iter()
            .all(|h| match (header(&h.name), &h.value) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(got), Some(want)) => got == want.as_bytes(),
            })
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
}
