//! A controller snapshot as the sidecar receives it: any bytes, as JSON.
//!
//! Invariants: decoding and resolving never panic; a snapshot that resolves is
//! within every documented bound; and re-hashing is stable (a snapshot whose
//! version is recomputed from its content resolves exactly as well as before,
//! apart from the version check itself).

use reprise_crds::snapshot::Snapshot;

/// Replays one input; panics when an invariant above breaks.
pub fn check(data: &[u8]) {
    let Ok(snapshot) = serde_json::from_slice::<Snapshot>(data) else {
        return;
    };
    let resolved = snapshot.resolve();
    if let Ok(cfg) = &resolved {
        crate::check_config(cfg);
    }

    // The version is a pure function of the content: recomputing it on an
    // unchanged snapshot gives the same string, and a snapshot carrying its
    // own content hash never fails on the version alone.
    assert_eq!(snapshot.content_hash(), snapshot.content_hash());
    let mut rehashed = snapshot.clone();
    rehashed.version = rehashed.content_hash();
    match (resolved, rehashed.resolve()) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the version changed the resolved config"),
        (Ok(_), Err(e)) => panic!("a valid snapshot failed after re-hashing: {e}"),
        (Err(before), Err(after)) => {
            let not_version = |e: &reprise_crds::ValidationError| e.field != "version";
            assert!(
                before
                    .0
                    .iter()
                    .filter(|e| not_version(e))
                    .eq(after.0.iter()),
                "re-hashing changed errors other than the version: {before} / {after}"
            );
        }
        (Err(before), Ok(_)) => assert!(
            before.0.iter().all(|e| e.field == "version"),
            "re-hashing fixed more than the version: {before}"
        ),
    }
}
