//! gRPC status codes as retry conditions: their names (lower case with
//! dashes, as in gRPC's retry policy documentation: `unavailable`,
//! `resource-exhausted`, ...), numbers 1-16 (0, OK, is never a failure), and
//! the set a policy retries.

use serde::{Deserialize, Serialize};

use crate::validation::ValidationErrors;

/// gRPC's status codes, by number (`grpc-status`), with their names.
pub const CODES: [&str; 17] = [
    "ok",
    "cancelled",
    "unknown",
    "invalid-argument",
    "deadline-exceeded",
    "not-found",
    "already-exists",
    "permission-denied",
    "resource-exhausted",
    "failed-precondition",
    "aborted",
    "out-of-range",
    "unimplemented",
    "internal",
    "unavailable",
    "data-loss",
    "unauthenticated",
];

/// UNAVAILABLE: the default the upstream's `retries` block retries (gRPC's
/// counterpart of the gateway statuses 502, 503, 504).
pub const UNAVAILABLE: u8 = 14;
/// DEADLINE_EXCEEDED.
pub const DEADLINE_EXCEEDED: u8 = 4;
/// INTERNAL.
pub const INTERNAL: u8 = 13;
/// UNIMPLEMENTED.
pub const UNIMPLEMENTED: u8 = 12;

/// A gRPC status as written: a number or a name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GrpcStatusEntry {
    /// A number, 1-16.
    Code(i64),
    /// A name, e.g. `unavailable`.
    Name(String),
}

/// A set of gRPC status codes 1-16, as a bit set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GrpcStatusSet(u32);

impl GrpcStatusSet {
    /// No gRPC status is retried.
    pub const NONE: GrpcStatusSet = GrpcStatusSet(0);

    /// Only `code`.
    pub const fn only(code: u8) -> GrpcStatusSet {
        GrpcStatusSet(1 << code)
    }

    /// True when `code` is in the set.
    pub fn contains(self, code: u8) -> bool {
        code < 32 && self.0 & (1 << code) != 0
    }

    /// True when no code is in the set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The codes in ascending order.
    pub fn codes(self) -> Vec<u8> {
        (1..=16).filter(|c| self.contains(*c)).collect()
    }

    /// Resolves a written list, reporting each bad entry at `field[i]`.
    pub fn parse(errs: &mut ValidationErrors, field: &str, entries: &[GrpcStatusEntry]) -> Self {
        let mut set = GrpcStatusSet::NONE;
        for (i, e) in entries.iter().enumerate() {
            let code = match e {
                GrpcStatusEntry::Code(c) => u8::try_from(*c).ok().filter(|c| (1..=16).contains(c)),
                GrpcStatusEntry::Name(n) => code_of(n),
            };
            match code {
                Some(c) => set.0 |= 1 << c,
                None => errs.push(
                    format!("{field}[{i}]"),
                    format!(
                        "must be a gRPC status name ({}) or a number in 1..=16 (got {})",
                        CODES[1..].join(", "),
                        match e {
                            GrpcStatusEntry::Code(c) => c.to_string(),
                            GrpcStatusEntry::Name(n) => format!("\"{n}\""),
                        }
                    ),
                ),
            }
        }
        set
    }
}

/// The code a name (or a number written as text) stands for, 1-16.
pub fn code_of(name: &str) -> Option<u8> {
    if let Ok(n) = name.parse::<u8>() {
        return (1..=16).contains(&n).then_some(n);
    }
    CODES
        .iter()
        .position(|c| {
            c.eq_ignore_ascii_case(name) || c.replace('-', "_").eq_ignore_ascii_case(name)
        })
        .and_then(|i| u8::try_from(i).ok())
        .filter(|c| *c != 0)
}

/// The name of `code` (`unavailable`), or `code-N` beyond the known ones.
pub fn name_of(code: u8) -> std::borrow::Cow<'static, str> {
    match CODES.get(usize::from(code)) {
        Some(n) => std::borrow::Cow::Borrowed(n),
        None => std::borrow::Cow::Owned(format!("code-{code}")),
    }
}

impl Serialize for GrpcStatusSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.codes().into_iter().map(name_of))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_resolve_and_bad_ones_are_named() {
        let mut errs = ValidationErrors::default();
        let set = GrpcStatusSet::parse(
            &mut errs,
            "f",
            &[
                GrpcStatusEntry::Name("unavailable".into()),
                GrpcStatusEntry::Name("resource-exhausted".into()),
                GrpcStatusEntry::Code(10),
                GrpcStatusEntry::Name("DEADLINE_EXCEEDED".into()),
            ],
        );
        assert!(errs.is_empty(), "{errs}");
        assert_eq!(set.codes(), vec![4, 8, 10, 14]);
        assert!(!set.contains(0) && !set.contains(13));
        let bad = GrpcStatusSet::parse(
            &mut errs,
            "f",
            &[
                GrpcStatusEntry::Code(0),
                GrpcStatusEntry::Name("busy".into()),
            ],
        );
        assert!(bad.is_empty());
        let msg = errs.to_string();
        assert!(
            msg.contains("f[0]: must be a gRPC status name (cancelled, unknown,"),
            "{msg}"
        );
        assert!(msg.contains("or a number in 1..=16 (got 0)"), "{msg}");
        assert!(
            msg.contains("f[1]: ") && msg.contains("(got \"busy\")"),
            "{msg}"
        );
        assert_eq!(name_of(14), "unavailable");
        assert_eq!(name_of(99), "code-99");
        assert_eq!(code_of("ok"), None, "OK is never a failure");
    }
}
