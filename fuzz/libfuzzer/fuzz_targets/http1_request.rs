//! libFuzzer's entry for [`reprise_fuzz_checks::http1_request`], which documents the
//! input and the invariants (`cargo test -p reprise-fuzz-checks` replays the
//! committed corpus through the same function).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| reprise_fuzz_checks::http1_request::check(data));
