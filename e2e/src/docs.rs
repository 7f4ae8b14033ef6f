//! The user guide (`docs/src/`) and the README as data, for the checks that
//! keep them true: the YAML examples (applied against the e2e API server or
//! checked by `reprise-sidecar --check`, `tests/cluster/docs.rs`), and the
//! flags, variables, metrics, paths and links they name (`tests/docs.rs`).

use std::path::{Path, PathBuf};

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// A page of the guide, or the README.
#[derive(Clone, Debug)]
pub struct Page {
    /// Relative to the workspace root, e.g. `docs/src/tasks/grpc.md`.
    pub path: String,
    pub text: String,
}

/// README.md and every page under docs/src, sorted by path.
pub fn pages() -> Vec<Page> {
    let root = root();
    let mut paths = vec![root.join("README.md")];
    collect(&root.join("docs/src"), &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|p| Page {
            path: p
                .strip_prefix(&root)
                .unwrap_or(&p)
                .to_string_lossy()
                .into_owned(),
            text: std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
        })
        .collect()
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// The marker that exempts the fenced block right after it from being
/// applied, with the reason: `<!-- not applied: REASON -->`.
pub const NOT_APPLIED: &str = "<!-- not applied:";

/// A fenced code block.
#[derive(Clone, Debug)]
pub struct Block {
    /// The page it is on.
    pub page: String,
    /// The line of its opening fence, from 1.
    pub line: usize,
    /// The fence's info string (`yaml`, `sh`, ...).
    pub lang: String,
    /// Its text, without the fences.
    pub text: String,
    /// The reason of a `<!-- not applied: ... -->` marker on the line
    /// before the fence (blank lines between allowed).
    pub not_applied: Option<String>,
}

/// Every fenced block of `page`, in order.
pub fn blocks(page: &Page) -> Vec<Block> {
    let lines: Vec<&str> = page.text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            body.push(lines[i]);
            i += 1;
        }
        let not_applied = lines[..start]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| l.trim().strip_prefix(NOT_APPLIED))
            .map(|r| r.trim_end_matches("-->").trim().to_string());
        out.push(Block {
            page: page.path.clone(),
            line: start + 1,
            lang: info.trim().to_string(),
            text: body.join("\n") + "\n",
            not_applied,
        });
        i += 1;
    }
    out
}

/// What a YAML example is, by its top-level keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Example {
    /// Kubernetes objects (`apiVersion` and `kind`): applied with a
    /// server-side dry run.
    Kubernetes,
    /// A sidecar configuration file (`upstreams`, `rules`, `proxy`):
    /// checked with `reprise-sidecar --check`.
    ConfigFile,
    /// Neither: it must carry a `not applied` marker.
    Other,
}

/// Classifies a YAML block by the keys at its first column.
pub fn example(text: &str) -> Example {
    let top: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with([' ', '#', '-']) && !l.trim().is_empty())
        .filter_map(|l| l.split(':').next())
        .collect();
    if top.contains(&"apiVersion") && top.contains(&"kind") {
        Example::Kubernetes
    } else if !top.is_empty()
        && top
            .iter()
            .all(|k| ["upstreams", "rules", "proxy"].contains(k))
    {
        Example::ConfigFile
    } else {
        Example::Other
    }
}

/// The namespaces a Kubernetes example's objects name (`namespace: NAME`,
/// block or flow style), which must exist for a dry run to be admitted.
pub fn namespaces(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (i, _) in text.match_indices("namespace: ") {
        let name: String = text[i + "namespace: ".len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if !name.is_empty() && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// Every inline code span of `page` (text between single backticks, outside
/// fenced blocks), with its line.
pub fn code_spans(page: &Page) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in page.text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut parts = line.split('`');
        parts.next();
        while let (Some(span), Some(_)) = (parts.next(), parts.next()) {
            out.push((n + 1, span.to_string()));
        }
    }
    out
}

/// Every `](target)` link of `page` that is not a web or mail link, with its
/// line.
pub fn local_links(page: &Page) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in page.text.lines().enumerate() {
        for (i, _) in line.match_indices("](") {
            let rest = &line[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if !target.contains("://") && !target.starts_with("mailto:") {
                out.push((n + 1, target.to_string()));
            }
        }
    }
    out
}
