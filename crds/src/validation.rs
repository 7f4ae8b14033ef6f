//! Validation errors that name the field and the rule it broke.

use std::fmt;

/// One broken rule: the field's path (as written in the file, e.g.
/// `upstreams[0].retries.attempts`) and the rule in plain words.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ValidationError {
    /// Dotted path of the offending field.
    pub field: String,
    /// The rule the field broke, e.g. `must be at most 10 (got 11)`.
    pub rule: String,
}

/// Every rule a configuration broke, in the order they were found.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ValidationErrors(pub Vec<ValidationError>);

impl ValidationError {
    /// A new error for `field` breaking `rule`.
    pub fn new(field: impl Into<String>, rule: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            rule: rule.into(),
        }
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}

impl std::error::Error for ValidationError {}

impl ValidationErrors {
    /// Records that `field` broke `rule`.
    pub fn push(&mut self, field: impl Into<String>, rule: impl Into<String>) {
        self.0.push(ValidationError::new(field, rule));
    }

    /// True when no rule was broken.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `Ok(value)` when nothing was broken, else these errors.
    pub fn into_result<T>(self, value: T) -> Result<T, Self> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(self)
        }
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationErrors {}
