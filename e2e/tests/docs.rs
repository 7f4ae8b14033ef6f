//! Checks that keep the user guide (docs/src) and the README true without a
//! cluster: every YAML block is an example the cluster test can apply or is
//! marked as an excerpt; every flag, environment variable and metric the
//! guide names exists in the code, and every variable the binaries read is
//! named in the guide; every repository path it cites exists; every local
//! link in the README leads to a file, and every `#anchor` a page links to
//! is a heading of its page (the book's links to pages are checked by
//! mdbook-linkcheck in `docs/build.sh`, which does not check anchors).
//!
//! The other directions live with the code: the flags pages are generated
//! from clap (`reprise-sidecar`'s and `reprise-controller`'s `reference`
//! tests), the metric families are checked against the metrics page by
//! `sidecar/src/observe/metrics/families.rs` and `controller/src/metrics.rs`,
//! and the access log's fields both ways by `sidecar/src/observe/access_log.rs`.

use std::collections::BTreeSet;
use std::path::Path;

use reprise_e2e::docs::{self, Example};

/// A finding: where, and what is wrong.
fn report(what: &str, findings: &[String]) {
    assert!(findings.is_empty(), "{what}:\n  {}", findings.join("\n  "));
}

/// Tokens of `text` that start with `prefix` and go on with characters
/// `more` accepts, not preceded by a word character.
fn tokens<'a>(
    text: &'a str,
    prefix: &str,
    more: impl Fn(char) -> bool + Copy,
) -> Vec<(usize, &'a str)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut from = 0;
        while let Some(i) = line[from..].find(prefix) {
            let start = from + i;
            let before = line[..start].chars().next_back();
            let end = line[start + prefix.len()..]
                .find(|c: char| !more(c))
                .map_or(line.len(), |e| start + prefix.len() + e);
            from = end.max(start + prefix.len());
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                continue;
            }
            out.push((n + 1, &line[start..end]));
        }
    }
    out
}

/// The source files whose text "the code" means: every Rust file, shell
/// script, Python script and chart template, outside the guide and the
/// benchmark results.
fn source_text() -> String {
    fn walk(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if ![
                    "target",
                    ".git",
                    "docs",
                    "results",
                    "corpus",
                    "node_modules",
                ]
                .contains(&name.as_str())
                {
                    walk(&path, out);
                }
            } else if path.ends_with("e2e/tests/docs.rs") || path.ends_with("e2e/src/docs.rs") {
                // The checks themselves name variables in their lists.
                continue;
            } else if ["rs", "sh", "py", "yaml", "tpl", "json"]
                .iter()
                .any(|e| path.extension().is_some_and(|x| x == *e))
            {
                out.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
                out.push('\n');
            }
        }
    }
    let mut out = String::new();
    walk(&docs::root(), &mut out);
    out
}

#[test]
fn every_yaml_block_is_an_example_that_can_be_applied_or_is_marked() {
    let mut findings = Vec::new();
    let mut applied = 0;
    for page in docs::pages() {
        for block in docs::blocks(&page) {
            if !matches!(block.lang.as_str(), "yaml" | "yml") {
                continue;
            }
            match (&block.not_applied, docs::example(&block.text)) {
                (Some(reason), _) if reason.is_empty() => findings.push(format!(
                    "{}:{}: a `not applied` marker needs its reason",
                    block.page, block.line
                )),
                (Some(_), _) => {}
                (None, Example::Other) => findings.push(format!(
                    "{}:{}: neither Kubernetes objects nor a configuration file; mark an excerpt with {} REASON -->",
                    block.page,
                    block.line,
                    docs::NOT_APPLIED
                )),
                (None, _) => applied += 1,
            }
        }
    }
    report("YAML blocks", &findings);
    // The guide's examples are the point: a parser that found none is broken.
    assert!(applied >= 8, "only {applied} YAML examples found");
}

/// Flags of other programs the guide shows in commands (kubectl, helm,
/// cargo, the repository's scripts): anything else named `--flag` must be a
/// flag of a Reprise binary.
const FOREIGN_FLAGS: &[&str] = &[
    // kubectl
    "as",
    "server-side",
    "ignore-not-found",
    "type",
    "replicas",
    "context",
    "kubeconfig",
    "namespace",
    "all-namespaces",
    "manifest",
    // helm
    "create-namespace",
    "set",
    "set-string",
    "wait",
    "kube-version",
    // cargo, cargo-fuzz and the test harness
    "fuzz-dir",
    "bin",
    "example",
    "locked",
    "path",
    "release",
    "test",
    "lib",
    "nocapture",
    // unshare
    "net",
    // iptables, in the transparent capture's rules
    "to-ports",
    "uid-owner",
    // the repository's scripts (e2e/cluster.sh, e2e/demo.sh, e2e/deny.sh)
    "api-only",
    "fresh",
    "standalone",
    "advisories",
    "docs-only",
];

#[test]
fn every_flag_the_guide_names_exists() {
    // The generated pages are the binaries' flags (their tests compare them
    // with clap), so a flag named elsewhere must be on one of them.
    let mut ours = BTreeSet::new();
    for page in [
        "docs/src/reference/cli-sidecar.md",
        "docs/src/reference/cli-controller.md",
    ] {
        let text = std::fs::read_to_string(docs::root().join(page)).expect(page);
        for (_, t) in tokens(&text, "`--", |c| c.is_ascii_alphanumeric() || c == '-') {
            ours.insert(t.trim_start_matches("`--").to_string());
        }
    }
    // A parse that found few flags is broken, not a guide without flags.
    assert!(ours.len() > 20, "flags pages not parsed: {ours:?}");
    let mut findings = Vec::new();
    for page in docs::pages() {
        if page.path.contains("reference/cli-") {
            continue;
        }
        for (line, t) in tokens(&page.text, "--", |c| c.is_ascii_alphanumeric() || c == '-') {
            let flag = &t[2..];
            if flag.is_empty() || !flag.starts_with(|c: char| c.is_ascii_lowercase()) {
                continue;
            }
            // `--flag` is how the checks page names a flag in general.
            if flag == "flag" {
                continue;
            }
            if !ours.contains(flag) && !FOREIGN_FLAGS.contains(&flag) {
                findings.push(format!("{}:{line}: --{flag} is no flag of reprise-sidecar, reprise-controller or kubectl-reprise", page.path));
            }
        }
    }
    report("flags", &findings);
}

/// Variables the code names that are not for users: the transparent
/// capture's iptables chain, and the API-only e2e tests' address mapping.
const NOT_USER_FACING: &[&str] = &["REPRISE_OUTPUT", "REPRISE_ENDPOINT_ADDRESS_MAP"];

/// Variables the guide names that a dependency reads rather than Reprise's
/// own code: opentelemetry-otlp's exporter builders read the headers.
const READ_BY_DEPENDENCY: &[&str] = &[
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
];

fn is_var_char(c: char) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'
}

#[test]
fn every_variable_is_named_in_the_guide_and_every_named_one_is_read() {
    let pages = docs::pages();
    // `OTEL_EXPORTER_OTLP_PROTOCOL` / `…_TRACES_PROTOCOL` names two variables.
    let guide: String = pages
        .iter()
        .map(|p| p.text.replace("`…_TRACES_", "`OTEL_EXPORTER_OTLP_TRACES_"))
        .collect::<Vec<_>>()
        .join("\n");
    let source = source_text();
    let mut findings = Vec::new();
    // Named in the guide: read somewhere (the binaries, or for development
    // pages the scripts and tests).
    for page in &pages {
        // The flags pages are generated from clap: their variables are its
        // `env` attributes, and their value names are no variables.
        if page.path.contains("reference/cli-") {
            continue;
        }
        let text = page
            .text
            .replace("`…_TRACES_", "`OTEL_EXPORTER_OTLP_TRACES_");
        for prefix in ["REPRISE_", "OTEL_"] {
            for (line, var) in tokens(&text, prefix, is_var_char) {
                let var = var.trim_end_matches('_');
                if var.len() <= prefix.len() || var.ends_with("_TRACES") {
                    continue;
                }
                if !source.contains(var) && !READ_BY_DEPENDENCY.contains(&var) {
                    findings.push(format!(
                        "{}:{line}: {var} is read nowhere in the code",
                        page.path
                    ));
                }
            }
        }
    }
    // Read by the binaries: named in the guide.
    let mut binaries = String::new();
    for dir in ["sidecar/src", "controller/src", "telemetry/src", "crds/src"] {
        for path in rust_files(&docs::root().join(dir)) {
            binaries.push_str(&std::fs::read_to_string(path).unwrap_or_default());
        }
    }
    let mut read = BTreeSet::new();
    for prefix in ["\"REPRISE_", "\"OTEL_"] {
        for (_, t) in tokens(&binaries, prefix, is_var_char) {
            read.insert(t.trim_start_matches('"').to_string());
        }
    }
    read.insert("TOKIO_WORKER_THREADS".into());
    assert!(read.len() > 20, "variables not found in the code: {read:?}");
    for var in read {
        if !NOT_USER_FACING.contains(&var.as_str()) && !guide.contains(&format!("`{var}`")) {
            findings.push(format!("{var} is read by the code and named nowhere in the guide (reference/environment.md)"));
        }
    }
    report("environment variables", &findings);
}

fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// Names that start like a metric but are crates or modules.
const CRATES: &[&str] = &[
    "reprise_crds",
    "reprise_sidecar",
    "reprise_controller",
    "reprise_telemetry",
    "reprise_testkit",
    "reprise_e2e",
];

#[test]
fn every_metric_the_guide_names_exists() {
    let mut exposed = String::new();
    for dir in ["sidecar/src", "controller/src", "telemetry/src"] {
        for path in rust_files(&docs::root().join(dir)) {
            exposed.push_str(&std::fs::read_to_string(path).unwrap_or_default());
        }
    }
    let mut findings = Vec::new();
    let mut seen = 0;
    for page in docs::pages() {
        for (line, name) in tokens(&page.text, "reprise_", |c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'
        }) {
            let rest = &page.text.lines().nth(line - 1).unwrap_or_default();
            if CRATES.contains(&name) || rest.contains(&format!("{name}::")) {
                continue;
            }
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            seen += 1;
            if !exposed.contains(&format!("\"{family}\"")) {
                findings.push(format!(
                    "{}:{line}: {name} is no metric the sidecar or the controller exposes",
                    page.path
                ));
            }
        }
    }
    assert!(seen > 30, "only {seen} metric names found");
    report("metrics", &findings);
}

/// Folders the guide names that builds and runs create: not in the tree.
const OUTPUTS: &[&str] = &["docs/book", "fuzz/work", "fuzz/libfuzzer/artifacts"];

/// Top-level folders of the repository: a code span starting with one of
/// them is a path the guide cites.
const FOLDERS: &[&str] = &[
    "crds/",
    "sidecar/",
    "controller/",
    "telemetry/",
    "testkit/",
    "e2e/",
    "charts/",
    "docs/",
    "fuzz/",
    "plugins/",
    "examples/",
];

#[test]
fn every_repository_path_the_guide_cites_exists() {
    let root = docs::root();
    let mut findings = Vec::new();
    for page in docs::pages() {
        for (line, span) in docs::code_spans(&page) {
            let path = span.split_whitespace().next().unwrap_or_default();
            if !FOLDERS.iter().any(|f| path.starts_with(f))
                || path.contains(['<', '*', '{', '$'])
                || path.contains("...")
                || OUTPUTS.iter().any(|o| path.starts_with(o))
            {
                continue;
            }
            // `file.rs:123`, a trailing comma or period.
            let path = path
                .split(':')
                .next()
                .unwrap_or(path)
                .trim_end_matches([',', '.', ')']);
            if !root.join(path).exists() {
                findings.push(format!("{}:{line}: {path} does not exist", page.path));
            }
        }
    }
    report("repository paths", &findings);
}

#[test]
fn every_local_link_of_the_readme_leads_to_a_file() {
    let root = docs::root();
    let readme = docs::pages()
        .into_iter()
        .find(|p| p.path == "README.md")
        .expect("README.md");
    let mut findings = Vec::new();
    let links = docs::local_links(&readme);
    for (line, target) in &links {
        let file = target.split('#').next().unwrap_or_default();
        if !file.is_empty() && !root.join(file).exists() {
            findings.push(format!("README.md:{line}: {target} leads nowhere"));
        }
    }
    assert!(
        !links.is_empty(),
        "the README links to no page of the guide"
    );
    report("README links", &findings);
}

/// The id mdBook (0.4) gives a heading: its text without markup, lower
/// case, spaces as `-`, anything but letters, digits, `_` and `-` dropped.
fn heading_id(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // `[text](url)` reads as its text.
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match (after.find("]("), after.find(')')) {
            (Some(close), Some(end)) if close < end => {
                text.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            _ => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// mdbook-linkcheck checks that every linked page exists, not that the
/// `#anchor` after it names a heading: this does, for the guide's pages and
/// the README.
#[test]
fn every_anchor_a_page_links_to_is_a_heading_of_its_page() {
    let root = docs::root();
    let pages = docs::pages();
    let ids_of = |path: &Path| -> BTreeSet<String> {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut fenced = false;
        let mut ids = BTreeSet::new();
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            }
            if !fenced && line.starts_with('#') {
                let id = heading_id(line.trim_start_matches('#'));
                // A repeated heading gets `-1`, `-2`, ... after the first.
                let mut unique = id.clone();
                let mut n = 1;
                while ids.contains(&unique) {
                    unique = format!("{id}-{n}");
                    n += 1;
                }
                ids.insert(unique);
            }
        }
        ids
    };
    let mut findings = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let dir = root.join(&page.path);
        let dir = dir.parent().expect("a page's folder");
        for (line, target) in docs::local_links(page) {
            let Some((file, anchor)) = target.split_once('#') else {
                continue;
            };
            let file = if file.is_empty() {
                root.join(&page.path)
            } else {
                dir.join(file)
            };
            checked += 1;
            if !ids_of(&file).contains(anchor) {
                findings.push(format!(
                    "{}:{line}: {target}: no heading with that id",
                    page.path
                ));
            }
        }
    }
    assert!(checked > 10, "only {checked} anchors found");
    report("anchors", &findings);
}
