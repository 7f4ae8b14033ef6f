//! `GET /diagnostics` on the admin listener: the requests the diagnostics
//! ring keeps (`observe::diagnostics`), newest first, as
//! `{"requests": [...]}`.
//!
//! The contract: the query parameters `upstream` (a name, compared without
//! case), `outcome` (`recovered`, `exhausted` or `skipped`) and `limit` (a
//! whole number from 1) narrow the list, the filters before the limit; any
//! other parameter or value is refused with `400` naming it. While
//! `proxy.diagnostics_retained` is 0 the page is `404` saying so.

use std::sync::Arc;

use http::StatusCode;
use serde::Serialize;

use crate::observe::diagnostics::{Entry, Filter};
use crate::proxy::Proxy;

/// The outcomes the ring keeps.
const OUTCOMES: [&str; 3] = ["recovered", "exhausted", "skipped"];

/// The page's body.
#[derive(Serialize)]
struct Page<'a> {
    requests: Vec<&'a Entry>,
}

/// The status, content type and body of `GET /diagnostics?{query}`.
pub(super) fn page(proxy: &Proxy, query: Option<&str>) -> (StatusCode, &'static str, String) {
    let filter = match filter(query.unwrap_or("")) {
        Ok(f) => f,
        Err(e) => return (StatusCode::BAD_REQUEST, "text/plain", format!("{e}\n")),
    };
    let Some(entries) = proxy.diagnostics().entries(&filter) else {
        return (
            StatusCode::NOT_FOUND,
            "text/plain",
            "diagnostics are off: proxy.diagnostics_retained is 0 (in Kubernetes, the reprise.dev/diagnostics-retained annotation or the chart's sidecar.diagnosticsRetained)\n"
                .to_string(),
        );
    };
    let page = Page {
        requests: entries.iter().map(Arc::as_ref).collect(),
    };
    match serde_json::to_string_pretty(&page) {
        Ok(json) => (StatusCode::OK, "application/json", json + "\n"),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("{e}\n"),
        ),
    }
}

/// The filter a query string asks for, or why it is refused.
fn filter(query: &str) -> Result<Filter, String> {
    let mut filter = Filter::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "upstream" if !value.is_empty() => filter.upstream = Some(value.to_string()),
            "outcome" if OUTCOMES.contains(&value) => filter.outcome = Some(value.to_string()),
            "outcome" => {
                return Err(format!(
                    "outcome={value:?}: must be one of {}",
                    OUTCOMES.join(", ")
                ))
            }
            "limit" => match value.parse::<usize>() {
                Ok(n) if n > 0 => filter.limit = Some(n),
                _ => return Err(format!("limit={value:?}: must be a whole number from 1")),
            },
            "upstream" => return Err("upstream: must name an upstream".to_string()),
            _ => {
                return Err(format!(
                    "unknown parameter {name:?}: try upstream, outcome, limit"
                ))
            }
        }
    }
    Ok(filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_names_upstream_outcome_and_limit_and_nothing_else() {
        assert_eq!(filter(""), Ok(Filter::default()));
        assert_eq!(
            filter("upstream=api&outcome=exhausted&limit=5"),
            Ok(Filter {
                upstream: Some("api".into()),
                outcome: Some("exhausted".into()),
                limit: Some(5),
            })
        );
        for (query, words) in [
            ("outcome=ok", "must be one of recovered, exhausted, skipped"),
            ("limit=0", "limit=\"0\": must be a whole number from 1"),
            ("limit=ten", "whole number"),
            ("upstream=", "must name an upstream"),
            ("upstrem=api", "unknown parameter \"upstrem\""),
        ] {
            let e = filter(query).expect_err(query);
            assert!(e.contains(words), "{query}: {e}");
        }
    }
}
