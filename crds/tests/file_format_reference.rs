//! The configuration file's reference (docs/src/reference/file-format.md)
//! against the types that parse the file, both ways: each table names every
//! field its section accepts, and no field it does not. The accepted fields
//! come from the parser itself (serde refuses an unknown field listing the
//! ones it expects), so a field added, renamed or removed in `reprise-crds`
//! fails here until the table says so.

use std::collections::BTreeSet;

use reprise_crds::file::parse;

const PAGE: &str = include_str!("../../docs/src/reference/file-format.md");

const UPSTREAM: &str =
    "upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 8080 }]\n";

/// The fields the parser accepts where `yaml` puts the field `bogus`.
fn accepted(yaml: &str) -> BTreeSet<String> {
    let err = parse(yaml, "t.yaml")
        .expect_err("an unknown field is refused")
        .to_string();
    // serde says `expected one of `a`, `b``, `expected `a` or `b``, or
    // `expected `a``.
    let list = err
        .split("unknown field `bogus`, expected ")
        .nth(1)
        .unwrap_or_else(|| panic!("no field list in: {err}"));
    let list = list.split(" at line").next().unwrap_or(list);
    list.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The field names a section's table documents: the backticked names of
/// each row's first cell, `[]` dropped, with the part before a `.` when
/// `nested` is `None`, else only the part after `nested.`.
fn documented(section: &str, nested: Option<&str>) -> BTreeSet<String> {
    let heading = format!("\n## `{section}`");
    let start = PAGE
        .find(&heading)
        .unwrap_or_else(|| panic!("no section {section} in file-format.md"));
    let body = &PAGE[start + heading.len()..];
    let body = body.split("\n## ").next().unwrap_or(body);
    let mut out = BTreeSet::new();
    for row in body.lines().filter(|l| l.starts_with("| `")) {
        let first = row.split(" | ").next().unwrap_or_default();
        for name in first.split('`').skip(1).step_by(2) {
            let name = name.replace("[]", "");
            match (nested, name.split_once('.')) {
                (None, Some((top, _))) => {
                    out.insert(top.to_string());
                }
                (None, None) => {
                    out.insert(name);
                }
                (Some(n), Some((top, field))) if top == n => {
                    out.insert(field.to_string());
                }
                _ => {}
            }
        }
    }
    out
}

fn same(section: &str, accepted: BTreeSet<String>, documented: BTreeSet<String>) {
    let undocumented: Vec<_> = accepted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "file-format.md, {section}: fields the parser accepts and the table leaves out: {undocumented:?}; fields the table names and the parser refuses: {unknown:?}"
    );
}

#[test]
fn every_section_names_exactly_the_fields_the_parser_accepts() {
    let upstream_with = |field: &str| format!("{UPSTREAM}    {field}\n");
    same(
        "upstreams[]",
        accepted(&upstream_with("bogus: 1")),
        documented("upstreams[]", None),
    );
    for nested in ["timeouts", "passive_health"] {
        same(
            &format!("upstreams[].{nested}"),
            accepted(&upstream_with(&format!("{nested}: {{ bogus: 1 }}"))),
            documented("upstreams[]", Some(nested)),
        );
    }
    same(
        "upstreams[].tls",
        accepted(&upstream_with("tls: { bogus: 1 }")),
        documented("upstreams[].tls", None),
    );
    same(
        "upstreams[].retries",
        accepted(&upstream_with("retries: { bogus: 1 }")),
        documented("upstreams[].retries", None),
    );
    let rule_with = |field: &str| format!("{UPSTREAM}rules:\n  - {{ id: r, {field} }}\n");
    same(
        "rules[]",
        accepted(&rule_with("bogus: 1")),
        documented("rules[]", None),
    );
    same(
        "rules[].match",
        accepted(&rule_with("match: { bogus: 1 }")),
        documented("rules[]", Some("match")),
    );
    same(
        "proxy",
        accepted(&format!("{UPSTREAM}proxy: {{ bogus: 1 }}\n")),
        documented("proxy", None),
    );
    for (section, yaml) in [
        (
            "upstreams[].retries",
            upstream_with("retries: { deadlines: { bogus: 1 } }"),
        ),
        ("rules[]", rule_with("deadlines: { bogus: 1 }")),
        (
            "proxy",
            format!("{UPSTREAM}proxy: {{ deadlines: {{ bogus: 1 }} }}\n"),
        ),
    ] {
        same(
            &format!("{section}.deadlines"),
            accepted(&yaml),
            documented(section, Some("deadlines")),
        );
    }
}
