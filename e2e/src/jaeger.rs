//! Reads traces back from Jaeger's query API (`/api/traces`) and draws one as
//! a waterfall of attempts in the terminal.

use std::collections::BTreeMap;
use std::fmt::Write;

use anyhow::{bail, Context};
use http_body_util::{BodyExt, Empty};

/// One span of a trace, as Jaeger returns it.
#[derive(Clone, Debug)]
pub struct Span {
    /// Span id (hex).
    pub id: String,
    /// Parent span id, when the parent is in the trace.
    pub parent: Option<String>,
    /// Operation name.
    pub name: String,
    /// Start, microseconds since the epoch.
    pub start_us: u64,
    /// Duration, microseconds.
    pub duration_us: u64,
    /// Attributes, stringified, with the process's (resource) attributes
    /// added where the span has no attribute of that name.
    pub tags: BTreeMap<String, String>,
    /// Events: offset from the trace start (µs), name, attributes.
    pub events: Vec<(u64, String, BTreeMap<String, String>)>,
}

/// A trace: its id and spans.
#[derive(Clone, Debug)]
pub struct Trace {
    /// Trace id (hex).
    pub id: String,
    /// Its spans, in start order.
    pub spans: Vec<Span>,
}

impl Span {
    /// An attribute's value, if set.
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags.get(key).map(String::as_str)
    }
}

/// Traces of `service` whose spans carry all `tags`, newest first.
pub async fn find(
    query_base: &str,
    service: &str,
    tags: &[(&str, &str)],
    limit: usize,
) -> anyhow::Result<Vec<Trace>> {
    let tags_json = serde_json::to_string(
        &tags
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect::<BTreeMap<_, _>>(),
    )?;
    let url = format!(
        "{query_base}/api/traces?service={service}&limit={limit}&lookback=1h&tags={}",
        percent_encode(&tags_json)
    );
    let body = get(&url).await?;
    let json: serde_json::Value = serde_json::from_slice(&body).context("Jaeger's answer")?;
    let Some(data) = json["data"].as_array() else {
        bail!("Jaeger answered without data: {json}");
    };
    Ok(data.iter().map(parse_trace).collect())
}

async fn get(url: &str) -> anyhow::Result<bytes::Bytes> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let resp = client
        .get(url.parse().context("Jaeger URL")?)
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        bail!("GET {url}: {status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(body)
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn tag_map(list: &serde_json::Value) -> BTreeMap<String, String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let key = t["key"].as_str()?.to_string();
            let value = match &t["value"] {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            Some((key, value))
        })
        .collect()
}

fn parse_trace(t: &serde_json::Value) -> Trace {
    let mut spans: Vec<Span> = t["spans"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            (
                s,
                tag_map(&t["processes"][s["processID"].as_str().unwrap_or_default()]["tags"]),
            )
        })
        .map(|(s, process)| Span {
            id: s["spanID"].as_str().unwrap_or_default().to_string(),
            parent: s["references"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["refType"] == "CHILD_OF")
                .and_then(|r| r["spanID"].as_str())
                .map(String::from),
            name: s["operationName"].as_str().unwrap_or_default().to_string(),
            start_us: s["startTime"].as_u64().unwrap_or(0),
            duration_us: s["duration"].as_u64().unwrap_or(0),
            // The span's own tags, then its process's (the OTel resource:
            // service.name aside, e.g. k8s.pod.name) where the span has none.
            tags: {
                let mut tags = tag_map(&s["tags"]);
                for (k, v) in process {
                    tags.entry(k).or_insert(v);
                }
                tags
            },
            events: s["logs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|l| {
                    let fields = tag_map(&l["fields"]);
                    let name = fields.get("event").cloned().unwrap_or_default();
                    (l["timestamp"].as_u64().unwrap_or(0), name, fields)
                })
                .collect(),
        })
        .collect();
    spans.sort_by_key(|s| s.start_us);
    Trace {
        id: t["traceID"].as_str().unwrap_or_default().to_string(),
        spans,
    }
}

/// The trace as a terminal waterfall: one line per span (indented under its
/// parent) with a bar placed on a common time axis, and its events below it.
pub fn waterfall(trace: &Trace, width: usize) -> String {
    let mut out = String::new();
    let Some(t0) = trace.spans.iter().map(|s| s.start_us).min() else {
        return "(empty trace)\n".into();
    };
    let t1 = trace
        .spans
        .iter()
        .map(|s| s.start_us + s.duration_us)
        .max()
        .unwrap_or(t0)
        .max(t0 + 1);
    let total = (t1 - t0) as f64;
    let col = |us: u64| ((us.saturating_sub(t0)) as f64 / total * width as f64).round() as usize;
    let _ = writeln!(out, "trace {}  ({:.1} ms)", trace.id, total / 1000.0);
    let depth = |s: &Span| {
        let mut d = 0;
        let mut parent = s.parent.clone();
        while let Some(p) = parent {
            match trace.spans.iter().find(|x| x.id == p) {
                Some(x) => {
                    d += 1;
                    parent = x.parent.clone();
                }
                None => break,
            }
        }
        d
    };
    for s in &trace.spans {
        let (from, to) = (
            col(s.start_us),
            col(s.start_us + s.duration_us).max(col(s.start_us) + 1),
        );
        let bar: String = (0..width)
            .map(|i| if i >= from && i < to { '█' } else { '·' })
            .collect();
        let label = format!("{}{}", "  ".repeat(depth(s)), describe(s));
        let _ = writeln!(
            out,
            "{label:<58} {bar} {:>7.1} ms",
            s.duration_us as f64 / 1000.0
        );
        for (ts, name, fields) in &s.events {
            let detail: Vec<String> = fields
                .iter()
                .filter(|(k, _)| k.as_str() != "event")
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let _ = writeln!(
                out,
                "{:<58} {}↑ {name} {}",
                "",
                " ".repeat(col(*ts).min(width)),
                detail.join(" ")
            );
        }
    }
    out
}

/// A span's one-line summary from its semantic-convention attributes.
fn describe(s: &Span) -> String {
    let mut parts = vec![s.name.clone()];
    if let Some(pod) = s.tag("reprise.endpoint.pod") {
        parts.push(format!("→ {pod}"));
    }
    if let (Some(addr), Some(port)) = (s.tag("server.address"), s.tag("server.port")) {
        if s.tag("reprise.endpoint.pod").is_none() {
            parts.push(format!("→ {addr}:{port}"));
        }
    }
    if let Some(n) = s.tag("http.request.resend_count") {
        parts.push(format!("resend {n}"));
    }
    if let Some(status) = s.tag("http.response.status_code") {
        parts.push(status.to_string());
    }
    if let Some(err) = s.tag("error.type") {
        parts.push(err.to_string());
    }
    if let Some(outcome) = s.tag("reprise.outcome") {
        parts.push(format!("[{outcome}]"));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_jaeger_json_and_draws_children_under_their_parent() {
        let json = serde_json::json!({
            "traceID": "abc",
            "spans": [
                {"spanID": "2", "operationName": "attempt", "startTime": 1_000_100u64, "duration": 300u64,
                 "references": [{"refType": "CHILD_OF", "spanID": "1"}],
                 "tags": [{"key": "http.response.status_code", "type": "int64", "value": 503},
                          {"key": "error.type", "type": "string", "value": "upstream_status_503"}],
                 "logs": []},
                {"spanID": "1", "operationName": "GET", "startTime": 1_000_000u64, "duration": 1000u64,
                 "references": [], "tags": [{"key": "reprise.outcome", "type": "string", "value": "recovered"}],
                 "logs": [{"timestamp": 1_000_450u64, "fields": [{"key": "event", "value": "backoff"}, {"key": "reprise.backoff_ms", "value": 5}]}]}
            ]
        });
        let trace = parse_trace(&json);
        assert_eq!(trace.spans[0].id, "1", "sorted by start");
        assert_eq!(trace.spans[1].parent.as_deref(), Some("1"));
        let drawn = waterfall(&trace, 20);
        let lines: Vec<&str> = drawn.lines().collect();
        assert!(lines[1].starts_with("GET [recovered]"), "{drawn}");
        assert!(lines[2].contains("backoff reprise.backoff_ms=5"), "{drawn}");
        assert!(
            lines[3].starts_with("  attempt 503 upstream_status_503"),
            "{drawn}"
        );
        // The attempt's bar starts a tenth of the way in and lasts 30%.
        let bar: String = lines[3].chars().skip(59).take(20).collect();
        assert_eq!(bar, "··██████············", "{drawn}");
    }
}
