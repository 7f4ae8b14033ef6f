//! The module layering of a crate, read from its sources and held against
//! a table of floors.
//!
//! A crate's top-level modules are arranged on floors, top to bottom; a
//! module may name modules on floors below its own and nothing else: not a
//! module above (an arrow up), not one beside it on the same floor. So the
//! arrows run one way and no cycle can form. The edges are derived from the
//! code, as text: `crate::a` paths, grouped imports (`crate::{a, b::c}`) and
//! `super::` paths that climb to the crate root, in non-test code (items
//! under `#[cfg(test)]` and the files they declare are left out), with
//! comments (doc links among them) and literals skipped.
//!
//! The modules are found from the crate root (`lib.rs`) through its `mod`
//! declarations, so a file that no `mod` names is not read. `#[path]`
//! attributes are not followed; no crate of the project uses them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// One reference from a module to another top-level module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edge {
    /// The top-level module the reference is in.
    pub from: String,
    /// The top-level module it names.
    pub to: String,
    /// The file, relative to the crate's `src`.
    pub file: String,
    /// The line, from 1.
    pub line: usize,
}

/// What breaks a crate's table of floors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// A reference from a module to one on a floor above it.
    Upward(Edge),
    /// A reference between two modules on the same floor.
    Sideways(Edge),
    /// A top-level module the table does not place.
    Unplaced(String),
    /// A module the table places that the crate does not have.
    Unknown(String),
    /// A module that two floors (or one floor twice) name.
    Duplicate(String),
    /// A file the crate's `mod` declarations name could not be read.
    Unreadable(String),
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Upward(e) => write!(
                f,
                "{}:{}: `{}` -> `{}` goes up a floor",
                e.file, e.line, e.from, e.to
            ),
            Violation::Sideways(e) => write!(
                f,
                "{}:{}: `{}` -> `{}` joins two modules of one floor (a cycle waiting to happen: move the shared part down)",
                e.file, e.line, e.from, e.to
            ),
            Violation::Unplaced(m) => write!(f, "module `{m}` is on no floor: place it"),
            Violation::Unknown(m) => write!(f, "floor names `{m}`, which the crate does not have"),
            Violation::Duplicate(m) => write!(f, "module `{m}` is on more than one floor"),
            Violation::Unreadable(p) => write!(f, "{p}: cannot be read"),
        }
    }
}

/// The references between top-level modules of the crate whose sources are
/// in `src` (its `lib.rs` is the root), in file order.
pub fn edges(src: &Path) -> Result<(Vec<String>, Vec<Edge>), Violation> {
    let root = read(src, &src.join("lib.rs"))?;
    let mut modules = Vec::new();
    let mut edges = Vec::new();
    for decl in scan(&root, 0).mods {
        modules.push(decl.name.clone());
        let mut files = Vec::new();
        collect(src, std::slice::from_ref(&decl.name), &mut files)?;
        for (file, depth) in files {
            let text = read(src, &file)?;
            let rel = file
                .strip_prefix(src)
                .unwrap_or(&file)
                .display()
                .to_string();
            for r in scan(&text, depth).refs {
                if r.module != decl.name {
                    edges.push(Edge {
                        from: decl.name.clone(),
                        to: r.module,
                        file: rel.clone(),
                        line: r.line,
                    });
                }
            }
        }
    }
    // Only names of top-level modules are edges (`crate::Error` is the root's).
    edges.retain(|e| modules.contains(&e.to));
    Ok((modules, edges))
}

/// Checks the crate in `src` against `floors`, top to bottom: every
/// violation, empty when the layering holds.
pub fn check(src: &Path, floors: &[&[&str]]) -> Vec<Violation> {
    let (modules, edges) = match edges(src) {
        Ok(found) => found,
        Err(v) => return vec![v],
    };
    let mut floor_of: BTreeMap<&str, usize> = BTreeMap::new();
    let mut violations = Vec::new();
    for (i, floor) in floors.iter().enumerate() {
        for &m in *floor {
            if floor_of.insert(m, i).is_some() {
                violations.push(Violation::Duplicate(m.to_string()));
            }
            if !modules.iter().any(|x| x == m) {
                violations.push(Violation::Unknown(m.to_string()));
            }
        }
    }
    for m in &modules {
        if !floor_of.contains_key(m.as_str()) {
            violations.push(Violation::Unplaced(m.clone()));
        }
    }
    for e in edges {
        let (Some(&from), Some(&to)) = (floor_of.get(e.from.as_str()), floor_of.get(e.to.as_str()))
        else {
            continue;
        };
        if from > to {
            violations.push(Violation::Upward(e));
        } else if from == to {
            violations.push(Violation::Sideways(e));
        }
    }
    violations
}

fn read(src: &Path, file: &Path) -> Result<String, Violation> {
    std::fs::read_to_string(file).map_err(|_| {
        Violation::Unreadable(file.strip_prefix(src).unwrap_or(file).display().to_string())
    })
}

/// The files of module `path` (its `foo.rs` and, through its non-test `mod`
/// declarations, its children's), each with its depth below the root.
fn collect(src: &Path, path: &[String], out: &mut Vec<(PathBuf, usize)>) -> Result<(), Violation> {
    let Some((name, parents)) = path.split_last() else {
        return Ok(());
    };
    let dir: PathBuf = parents.iter().collect();
    let flat = src.join(&dir).join(format!("{name}.rs"));
    let file = if flat.exists() {
        flat
    } else {
        src.join(&dir).join(name).join("mod.rs")
    };
    let text = read(src, &file)?;
    for decl in scan(&text, path.len()).mods {
        let mut child = path.to_vec();
        child.extend(decl.inline.iter().cloned());
        child.push(decl.name.clone());
        collect(src, &child, out)?;
    }
    out.push((file, path.len()));
    Ok(())
}

/// A `mod NAME;` declaration outside test code.
#[derive(Debug)]
struct ModDecl {
    name: String,
    /// The inline modules it is declared in, outermost first.
    inline: Vec<String>,
}

/// A reference to a top-level module.
#[derive(Debug)]
struct Ref {
    module: String,
    line: usize,
}

#[derive(Debug, Default)]
struct Scan {
    mods: Vec<ModDecl>,
    refs: Vec<Ref>,
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// Rust source as tokens with their lines, without comments and literals.
fn lex(text: &str) -> Vec<(Tok, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut toks = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(chars[i] == '\n');
                    i += 1;
                }
            }
        } else if c == 'r'
            && (at(i + 1) == '"' || (at(i + 1) == '#' && matches!(at(i + 2), '"' | '#')))
            || (c == 'b' && at(i + 1) == 'r' && matches!(at(i + 2), '"' | '#'))
        {
            // A raw string: r"..", r#".."#, br#".."#.
            i += if c == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while at(i) == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            while i < chars.len() {
                if chars[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                    i += 1 + hashes;
                    break;
                }
                line += usize::from(chars[i] == '\n');
                i += 1;
            }
        } else if c == '"' || (c == 'b' && at(i + 1) == '"') {
            i += if c == 'b' { 2 } else { 1 };
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                line += usize::from(at(i) == '\n');
                i += 1;
            }
            i += 1;
        } else if c == '\'' {
            // A char literal ('a', '\n', '\u{..}') or a lifetime ('a).
            if at(i + 1) == '\\' {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
                while at(i).is_alphanumeric() || at(i) == '_' {
                    i += 1;
                }
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while at(i).is_alphanumeric() || at(i) == '_' {
                i += 1;
            }
            toks.push((Tok::Ident(chars[start..i].iter().collect()), line));
        } else if c.is_ascii_digit() {
            while at(i).is_alphanumeric()
                || at(i) == '_'
                || at(i) == '.' && at(i + 1).is_ascii_digit()
            {
                i += 1;
            }
        } else if c == ':' && at(i + 1) == ':' {
            toks.push((Tok::Path, line));
            i += 2;
        } else {
            toks.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    toks
}

fn ident(t: Option<&(Tok, usize)>) -> Option<&str> {
    match t {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

fn is(t: Option<&(Tok, usize)>, c: char) -> bool {
    matches!(t, Some((Tok::Punct(p), _)) if *p == c)
}

/// The `mod` declarations and top-level references of a file `depth`
/// modules below the crate root.
fn scan(text: &str, depth: usize) -> Scan {
    let toks = lex(text);
    let mut out = Scan::default();
    // Inner `#![cfg(test)]`: the whole file is test code.
    if is(toks.first(), '#') && is(toks.get(1), '!') && cfg_test(&toks, 2).is_some() {
        return out;
    }
    // Open inline modules: (name, the brace depth inside them).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut braces = 0usize;
    let mut i = 0;
    while i < toks.len() {
        if is(toks.get(i), '#') {
            if let Some(end) = cfg_test(&toks, i + 1) {
                // Skip the attribute, any others after it, then the item.
                let mut j = end;
                while is(toks.get(j), '#') {
                    j = attribute_end(&toks, j + 1);
                }
                i = item_end(&toks, j);
                continue;
            }
        }
        match &toks[i].0 {
            Tok::Punct('{') => braces += 1,
            Tok::Punct('}') => {
                braces = braces.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d > braces) {
                    inline.pop();
                }
            }
            Tok::Ident(k)
                if k == "mod" && toks.get(i.wrapping_sub(1)).is_none_or(|t| t.0 != Tok::Path) =>
            {
                if let Some(name) = ident(toks.get(i + 1)) {
                    if is(toks.get(i + 2), ';') {
                        out.mods.push(ModDecl {
                            name: name.to_string(),
                            inline: inline.iter().map(|(n, _)| n.clone()).collect(),
                        });
                    } else if is(toks.get(i + 2), '{') {
                        inline.push((name.to_string(), braces + 1));
                    }
                }
            }
            Tok::Ident(k)
                if k == "crate"
                    && !is(toks.get(i.wrapping_sub(1)), '$')
                    && toks.get(i + 1).is_some_and(|t| t.0 == Tok::Path) =>
            {
                for (module, line) in heads(&toks, i + 2) {
                    out.refs.push(Ref { module, line });
                }
            }
            Tok::Ident(k)
                if k == "super" && toks.get(i.wrapping_sub(1)).is_none_or(|t| t.0 != Tok::Path) =>
            {
                let mut n = 0;
                let mut j = i;
                while ident(toks.get(j)) == Some("super")
                    && toks.get(j + 1).is_some_and(|t| t.0 == Tok::Path)
                {
                    n += 1;
                    j += 2;
                }
                if n == depth + inline.len() {
                    for (module, line) in heads(&toks, j) {
                        out.refs.push(Ref { module, line });
                    }
                }
                i = j.max(i + 1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The first segments of the path or group that starts at `i` (after
/// `crate::`): `a` for `a::b`, `a` and `b` for `{a::x, b}`.
fn heads(toks: &[(Tok, usize)], i: usize) -> Vec<(String, usize)> {
    match toks.get(i) {
        Some((Tok::Ident(name), line)) => vec![(name.clone(), *line)],
        Some((Tok::Punct('{'), _)) => {
            let mut found = Vec::new();
            let mut depth = 0;
            let mut expect_head = true;
            for (t, line) in &toks[i..] {
                match t {
                    Tok::Punct('{') => {
                        depth += 1;
                        expect_head = depth == 1;
                    }
                    Tok::Punct('}') => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    Tok::Punct(',') if depth == 1 => expect_head = true,
                    Tok::Ident(name) if expect_head && depth == 1 => {
                        if name != "self" {
                            found.push((name.clone(), *line));
                        }
                        expect_head = false;
                    }
                    _ => expect_head = false,
                }
            }
            found
        }
        _ => Vec::new(),
    }
}

/// When the attribute whose `[` is at `i` is `cfg(test)`, the index after its `]`.
fn cfg_test(toks: &[(Tok, usize)], i: usize) -> Option<usize> {
    let want = [
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    let got = toks.get(i..i + want.len())?;
    got.iter()
        .map(|(t, _)| t)
        .eq(want.iter())
        .then_some(i + want.len())
}

/// The index after the attribute whose `#` is just before `i`.
fn attribute_end(toks: &[(Tok, usize)], mut i: usize) -> usize {
    let mut depth = 0;
    while i < toks.len() {
        match toks[i].0 {
            Tok::Punct('[') => depth += 1,
            Tok::Punct(']') => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// The index after the item that starts at `i`: its `;` outside brackets, or
/// its closing brace (and a `;` right after it).
fn item_end(toks: &[(Tok, usize)], mut i: usize) -> usize {
    let mut depth = 0i32;
    while i < toks.len() {
        match toks[i].0 {
            Tok::Punct('{' | '(' | '[') => depth += 1,
            Tok::Punct(')' | ']') => depth -= 1,
            Tok::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    return if is(toks.get(i + 1), ';') {
                        i + 2
                    } else {
                        i + 1
                    };
                }
            }
            Tok::Punct(';') if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests;
