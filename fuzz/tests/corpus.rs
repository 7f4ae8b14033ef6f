//! Every committed seed of every fuzz target, replayed through the target's
//! invariants (`fuzz/corpus/<target>/*`): what libFuzzer checks on the
//! inputs it generates, `cargo test` checks on the inputs it keeps, without
//! nightly or the sanitizer build. A new target without seeds fails here.

use std::path::PathBuf;

use reprise_fuzz_checks as checks;

type Check = fn(&[u8]);

const TARGETS: &[(&str, Check)] = &[
    ("classifier", checks::classifier::check),
    ("config_file", checks::config_file::check),
    ("http1_request", checks::http1_request::check),
    ("http1_response", checks::http1_response::check),
    ("retry_after", checks::retry_after::check),
    ("snapshot", checks::snapshot::check),
];

fn seeds(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("a corpus entry").path();
            let bytes = std::fs::read(&path).expect("a seed");
            (path, bytes)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn every_seed_keeps_every_invariant() {
    for (target, check) in TARGETS {
        let seeds = seeds(target);
        assert!(!seeds.is_empty(), "fuzz/corpus/{target} has no seeds");
        for (path, bytes) in seeds {
            // A panic names the seed: the invariant's message alone does not.
            eprintln!("{target}: {}", path.display());
            check(&bytes);
        }
    }
}

/// The fuzz workspace's targets are exactly the ones replayed here.
#[test]
fn every_libfuzzer_target_is_replayed() {
    let manifest = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("libfuzzer/Cargo.toml"),
    )
    .expect("fuzz/libfuzzer/Cargo.toml");
    let mut bins: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .filter(|name| *name != "reprise-fuzz")
        .collect();
    bins.sort_unstable();
    let replayed: Vec<&str> = TARGETS.iter().map(|(t, _)| *t).collect();
    assert_eq!(bins, replayed);
}
