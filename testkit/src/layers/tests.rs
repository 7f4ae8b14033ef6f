use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// A crate's `src` in a fresh temporary folder, from `(path, text)` pairs.
fn crate_src(files: &[(&str, &str)]) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "reprise-layers-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let file = dir.join(path);
        std::fs::create_dir_all(file.parent().expect("a parent")).expect("a folder");
        std::fs::write(file, text).expect("a file");
    }
    dir
}

fn pairs(src: &Path) -> Vec<(String, String, String, usize)> {
    let (_, edges) = edges(src).expect("readable");
    edges
        .into_iter()
        .map(|e| (e.from, e.to, e.file, e.line))
        .collect()
}

const LIB: &str = "//! A crate.\nmod top;\nmod mid;\nmod low;\npub use top::Thing;\n";

#[test]
fn paths_grouped_imports_and_nested_files_are_edges() {
    let src = crate_src(&[
        ("lib.rs", LIB),
        (
            "top.rs",
            "mod inner;\nuse crate::{mid::{self, A}, low};\nfn f() { crate::low::g(); }\n",
        ),
        ("top/inner.rs", "\n\nuse crate::low::B;\n"),
        ("mid.rs", "pub struct A;\n"),
        ("low.rs", "pub struct B;\n"),
    ]);
    assert_eq!(
        pairs(&src),
        vec![
            ("top".into(), "low".into(), "top/inner.rs".into(), 3),
            ("top".into(), "mid".into(), "top.rs".into(), 2),
            ("top".into(), "low".into(), "top.rs".into(), 2),
            ("top".into(), "low".into(), "top.rs".into(), 3),
        ]
    );
    assert!(check(&src, &[&["top"], &["mid"], &["low"]]).is_empty());
}

#[test]
fn an_upward_use_is_named_with_its_file_and_line() {
    let src = crate_src(&[
        ("lib.rs", LIB),
        ("top.rs", "use crate::mid::A;\n"),
        ("mid.rs", "mod deep;\npub struct A;\n"),
        ("mid/deep.rs", "// why\nuse crate::top::Thing;\n"),
        ("low.rs", ""),
    ]);
    let violations = check(&src, &[&["top"], &["mid"], &["low"]]);
    assert_eq!(
        violations,
        vec![Violation::Upward(Edge {
            from: "mid".into(),
            to: "top".into(),
            file: "mid/deep.rs".into(),
            line: 2,
        })]
    );
    assert_eq!(
        violations[0].to_string(),
        "mid/deep.rs:2: `mid` -> `top` goes up a floor"
    );
}

#[test]
fn modules_on_one_floor_may_not_name_each_other() {
    let src = crate_src(&[
        ("lib.rs", LIB),
        ("top.rs", ""),
        ("mid.rs", "use crate::low::B;\n"),
        ("low.rs", "pub struct B;\n"),
    ]);
    assert!(matches!(
        check(&src, &[&["top"], &["mid", "low"]]).as_slice(),
        [Violation::Sideways(e)] if e.from == "mid" && e.to == "low"
    ));
}

#[test]
fn super_paths_count_only_where_they_reach_the_root() {
    let src = crate_src(&[
        ("lib.rs", LIB),
        ("top.rs", "mod a;\nuse super::mid::A;\n"),
        (
            "top/a.rs",
            "use super::sibling;\nuse super::super::low::B;\nmod inline {\n    use super::super::super::mid::A;\n}\n",
        ),
        ("mid.rs", ""),
        ("low.rs", ""),
    ]);
    assert_eq!(
        pairs(&src),
        vec![
            ("top".into(), "low".into(), "top/a.rs".into(), 2),
            ("top".into(), "mid".into(), "top/a.rs".into(), 4),
            ("top".into(), "mid".into(), "top.rs".into(), 2),
        ]
    );
}

#[test]
fn test_code_comments_doc_links_and_literals_are_not_edges() {
    let src = crate_src(&[
        ("lib.rs", LIB),
        ("top.rs", ""),
        ("mid.rs", ""),
        (
            "low.rs",
            concat!(
                "//! See [`crate::top`].\n",
                "/// Like [`crate::mid::A`].\n",
                "pub fn g() { let _ = \"crate::top\"; let _ = r#\"crate::mid\"#; let _ = 'c'; }\n",
                "/* crate::top /* nested */ crate::mid */\n",
                "#[cfg(test)]\nuse crate::top::Thing;\n",
                "#[cfg(test)]\n#[allow(dead_code)]\nfn fixture<'a>() { crate::top::f(); }\n",
                "#[cfg(test)]\nmod tests;\n",
                "#[cfg(test)]\nmod testing {\n    use crate::mid::A;\n}\n",
                "fn after() {}\n",
            ),
        ),
        // Declared only under cfg(test): never read.
        ("low/tests.rs", "use crate::top::Thing;\n"),
    ]);
    assert_eq!(pairs(&src), Vec::new());
}

#[test]
fn the_table_must_place_every_module_once_and_only_real_ones() {
    let src = crate_src(&[
        ("lib.rs", LIB),
        ("top.rs", ""),
        ("mid.rs", ""),
        ("low.rs", ""),
    ]);
    let violations = check(&src, &[&["top", "ghost"], &["top"]]);
    assert_eq!(
        violations,
        vec![
            Violation::Unknown("ghost".into()),
            Violation::Duplicate("top".into()),
            Violation::Unplaced("mid".into()),
            Violation::Unplaced("low".into()),
        ]
    );
}

#[test]
fn a_missing_module_file_is_reported() {
    let src = crate_src(&[("lib.rs", "mod gone;\n")]);
    assert_eq!(
        check(&src, &[&["gone"]]),
        vec![Violation::Unreadable("gone/mod.rs".into())]
    );
}
