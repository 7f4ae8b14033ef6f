//! A parser for the Prometheus text exposition format.
//!
//! Contract: [`Metrics::parse`] reads every sample line, `name{labels} value
//! [timestamp]`, into a [`Sample`]. `#` lines (HELP, TYPE, comments) and blank
//! lines are skipped; label values are unescaped (`\\`, `\"`, `\n`); a value
//! may be `+Inf`, `-Inf` or `NaN`; a timestamp is read and dropped. A
//! malformed sample line is an error that names its line. Lookups:
//! [`Metrics::get`] matches one series exactly (its name and its whole label
//! set, in any order); [`Metrics::sum`] adds every series of a name whose
//! labels include the given ones.

use std::fmt;

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Metric name (for histograms, with its `_bucket`/`_sum`/`_count` suffix).
    pub name: String,
    /// Labels in the order written.
    pub labels: Labels,
    /// Value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// True when every `(name, value)` in `want` is one of its labels.
    pub fn has_labels(&self, want: &[(&str, &str)]) -> bool {
        want.iter().all(|(k, v)| self.label(k) == Some(v))
    }

    /// The series as written: `name{a="1",b="2"}` (labels in their order,
    /// values escaped), or the bare name without labels.
    pub fn series(&self) -> String {
        if self.labels.is_empty() {
            return self.name.clone();
        }
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| {
                let v = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                format!("{k}=\"{v}\"")
            })
            .collect();
        format!("{}{{{}}}", self.name, labels.join(","))
    }

    /// True when its labels are exactly `want` (any order).
    pub fn has_exactly(&self, want: &[(&str, &str)]) -> bool {
        self.labels.len() == want.len() && self.has_labels(want)
    }
}

/// A malformed sample line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// Line number, from 1.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

impl std::error::Error for ParseError {}

/// Every sample of one scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    samples: Vec<Sample>,
}

impl Metrics {
    /// Parses a scrape.
    pub fn parse(text: &str) -> Result<Metrics, ParseError> {
        let mut samples = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            samples.push(sample(line).map_err(|reason| ParseError {
                line: i + 1,
                reason,
            })?);
        }
        Ok(Metrics { samples })
    }

    /// Every sample, in order.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// The samples named `name`.
    pub fn family<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// True when at least one sample is named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.family(name).next().is_some()
    }

    /// The value of series `name` with exactly the labels `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.family(name)
            .find(|s| s.has_exactly(labels))
            .map(|s| s.value)
    }

    /// The sum of every series `name` whose labels include `labels` (0 when
    /// there is none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        // An empty f64 sum is -0.0, which prints as "-0".
        self.family(name)
            .filter(|s| s.has_labels(labels))
            .map(|s| s.value)
            .sum::<f64>()
            + 0.0
    }
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    is_name_start(c) || c.is_ascii_digit()
}

/// Splits a name off the front of `s`.
fn name(s: &str) -> Result<(&str, &str), String> {
    if !s.starts_with(is_name_start) {
        return Err(format!("expected a name at {s:?}"));
    }
    let end = s.find(|c| !is_name_char(c)).unwrap_or(s.len());
    Ok(s.split_at(end))
}

/// Reads a quoted label value at the front of `s` (after its opening quote):
/// the unescaped value and the rest after the closing quote.
fn quoted(s: &str) -> Result<(String, &str), String> {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((value, &s[i + 1..])),
            '\\' => match chars.next() {
                Some((_, 'n')) => value.push('\n'),
                Some((_, c @ ('\\' | '"'))) => value.push(c),
                other => return Err(format!("bad escape {other:?} in a label value")),
            },
            c => value.push(c),
        }
    }
    Err("unterminated label value".into())
}

/// Labels as written, in order.
type Labels = Vec<(String, String)>;

fn labels(mut s: &str) -> Result<(Labels, &str), String> {
    let mut out = Vec::new();
    // Each round consumes one label (at least `a=""`) or ends.
    for _ in 0..=s.len() {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            return Ok((out, rest));
        }
        let (key, rest) = name(s)?;
        let rest = rest.trim_start();
        let rest = rest
            .strip_prefix('=')
            .ok_or_else(|| format!("expected '=' after label {key}"))?;
        let rest = rest
            .trim_start()
            .strip_prefix('"')
            .ok_or_else(|| format!("expected a quoted value for label {key}"))?;
        let (value, rest) = quoted(rest)?;
        out.push((key.to_string(), value));
        let rest = rest.trim_start();
        s = match rest.strip_prefix(',') {
            Some(after) => after,
            None if rest.starts_with('}') => rest,
            None => return Err(format!("expected ',' or '}}' after label {key}")),
        };
    }
    Err("unterminated label set".into())
}

fn value(token: &str) -> Result<f64, String> {
    match token {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        t => t.parse().map_err(|_| format!("bad value {t:?}")),
    }
}

fn sample(line: &str) -> Result<Sample, String> {
    let (metric, rest) = name(line)?;
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inside) => labels(inside)?,
        None => (Vec::new(), rest),
    };
    if !rest.starts_with(char::is_whitespace) {
        return Err(format!("expected a space before the value of {metric}"));
    }
    let mut tokens = rest.split_whitespace();
    let v = value(tokens.next().ok_or("missing value")?)?;
    if let Some(ts) = tokens.next() {
        ts.parse::<i64>()
            .map_err(|_| format!("bad timestamp {ts:?}"))?;
    }
    if tokens.next().is_some() {
        return Err("text after the timestamp".into());
    }
    Ok(Sample {
        name: metric.to_string(),
        labels,
        value: v,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = r#"# HELP reprise_requests_total Logical requests by outcome.
# TYPE reprise_requests_total counter
reprise_requests_total{upstream="api",outcome="ok",reason=""} 7
reprise_requests_total{upstream="api",outcome="exhausted",reason="budget"} 2
reprise_requests_total{upstream="web",outcome="ok",reason=""} 1e3

reprise_trace_spans_dropped_total 0
reprise_attempt_seconds_bucket{le="+Inf" , upstream = "api",} 12 1700000000000
odd{path="a \"quoted\" \\ back\nslash"} -Inf
nan_gauge NaN
"#;

    #[test]
    fn samples_labels_and_values_are_read() {
        let m = Metrics::parse(SCRAPE).expect("parses");
        assert_eq!(m.samples().len(), 7);
        assert_eq!(
            m.get(
                "reprise_requests_total",
                &[("outcome", "ok"), ("upstream", "api"), ("reason", "")]
            ),
            Some(7.0),
            "labels in any order"
        );
        assert_eq!(
            m.get("reprise_requests_total", &[("upstream", "api")]),
            None,
            "get wants the whole label set"
        );
        assert_eq!(m.sum("reprise_requests_total", &[("upstream", "api")]), 9.0);
        assert_eq!(m.sum("reprise_requests_total", &[]), 1009.0);
        assert_eq!(m.sum("absent", &[]).to_string(), "0", "not -0");
        assert_eq!(m.get("reprise_trace_spans_dropped_total", &[]), Some(0.0));
        let bucket = m
            .family("reprise_attempt_seconds_bucket")
            .next()
            .expect("bucket");
        assert_eq!(bucket.label("le"), Some("+Inf"));
        assert_eq!(bucket.value, 12.0, "the timestamp is not the value");
        let odd = m.family("odd").next().expect("odd");
        assert_eq!(odd.label("path"), Some("a \"quoted\" \\ back\nslash"));
        assert_eq!(odd.value, f64::NEG_INFINITY);
        assert!(m.get("nan_gauge", &[]).is_some_and(f64::is_nan));
        assert!(m.has("reprise_requests_total") && !m.has("reprise_requests"));
        assert_eq!(
            m.samples()[0].series(),
            r#"reprise_requests_total{upstream="api",outcome="ok",reason=""}"#
        );
        assert_eq!(odd.series(), r#"odd{path="a \"quoted\" \\ back\nslash"}"#);
        assert_eq!(m.samples()[3].series(), "reprise_trace_spans_dropped_total");
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        for (bad, line) in [
            ("ok 1\nbroken{a=\"1\" 2\n", 2),
            ("x{a=1} 2", 1),
            ("x{a=\"1\"}2", 1),
            ("x two", 1),
            ("x 1 2 3", 1),
            ("1x 1", 1),
            ("x{a=\"\\t\"} 1", 1),
            ("x{a=\"open} 1", 1),
            ("x", 1),
        ] {
            let err = Metrics::parse(bad).expect_err(bad);
            assert_eq!(err.line, line, "{bad:?}: {err}");
        }
    }
}
