//! The standalone configuration file: any UTF-8 text.
//!
//! Invariants: parsing never panics; a configuration that is accepted is
//! within every documented bound (`crate::check_config`), and it
//! round-trips: written back out as YAML from its parsed form and parsed
//! again, it resolves to exactly the same configuration (so what `--check`
//! or the admin endpoint shows is what the sidecar runs).

use reprise_crds::file::{self, ConfigFile};

/// Replays one input; panics when an invariant above breaks.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = file::parse(text, "fuzz") else {
        return;
    };
    crate::check_config(&cfg);

    let spec: ConfigFile = serde_yaml::from_str(text).expect("parse accepted this text");
    let written = serde_yaml::to_string(&spec).expect("a parsed file serializes");
    let again = file::parse(&written, "fuzz-roundtrip")
        .unwrap_or_else(|e| panic!("re-parsing the written file failed: {e}\n{written}"));
    assert_eq!(cfg, again, "round trip changed the config\n{written}");
}
