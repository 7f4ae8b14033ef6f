//! The sidecar's transparent listener behind the rules (written once the
//! listener lands).
