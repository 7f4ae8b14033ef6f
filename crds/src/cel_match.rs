//! A rule's request-only CEL condition (`match.cel`): an expression over the
//! request alone (`request.method`, `request.path`, `request.host`,
//! `request.headers` with lower-case names, several values of one header
//! joined with `,`), e.g.
//! `request.headers['x-tenant'] == 'a' && request.path.startsWith('/v1/')`.
//!
//! Compiled once when a configuration is validated, by the maintained `cel`
//! crate (the one kube-rs validates CRD rules with); a broken expression is
//! refused with its position. At request time the expression runs only for a
//! rule whose other conditions already hold; it matches when it yields `true`.
//! Anything else, an error included, is no match (the caller counts errors).

use std::collections::HashMap;
use std::sync::Arc;

use cel::{Context, Program, Value};
use serde::{Serialize, Serializer};

/// Longest expression accepted, in bytes.
pub const MAX_CEL_BYTES: usize = 4096;

/// A compiled `match.cel`.
#[derive(Clone)]
pub struct CelMatch {
    source: String,
    program: Arc<Program>,
    /// The built-in functions, registered once: building them for every
    /// request cost more than running the expression.
    functions: Arc<Context<'static>>,
    /// False when the expression never names `headers` (then no header map
    /// is built for it).
    uses_headers: bool,
}

/// What the expression needs of a request.
#[derive(Debug)]
pub struct CelRequest<'a> {
    /// The method, e.g. `GET`.
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The host the request addressed, without a port.
    pub host: &'a str,
    /// Every header as (lower-case name, value).
    pub headers: &'a [(&'a str, &'a str)],
}

/// Why an expression did not yield a boolean.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CelError(pub String);

impl CelMatch {
    /// Compiles `source`; the error names the position of each problem.
    pub fn compile(source: &str) -> Result<CelMatch, String> {
        if source.trim().is_empty() {
            return Err("must not be empty".into());
        }
        if source.len() > MAX_CEL_BYTES {
            return Err(format!(
                "must be at most {MAX_CEL_BYTES} bytes (got {})",
                source.len()
            ));
        }
        let program = Program::compile(source).map_err(|errors| {
            errors
                .errors
                .iter()
                .map(|e| format!("line {}, column {}: {}", e.pos.0, e.pos.1, e.msg))
                .collect::<Vec<_>>()
                .join("; ")
        })?;
        // Only `request` exists: a typo in a variable name is refused now,
        // not found at the first request.
        let references = program.references();
        if let Some(unknown) = references.variables().into_iter().find(|v| *v != "request") {
            return Err(format!(
                "unknown variable `{unknown}`: only `request` (method, path, host, headers) is defined"
            ));
        }
        Ok(CelMatch {
            source: source.to_string(),
            program: Arc::new(program),
            functions: Arc::new(Context::default()),
            uses_headers: source.contains("headers"),
        })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Runs the expression for `request`: `Ok(true)` when it holds.
    pub fn evaluate(&self, request: &CelRequest<'_>) -> Result<bool, CelError> {
        let mut headers: HashMap<String, String> = HashMap::new();
        for (name, value) in request.headers.iter().filter(|_| self.uses_headers) {
            headers
                .entry((*name).to_string())
                .and_modify(|v| {
                    v.push(',');
                    v.push_str(value);
                })
                .or_insert_with(|| (*value).to_string());
        }
        let mut fields: HashMap<&str, Value> = HashMap::with_capacity(4);
        fields.insert("method", request.method.into());
        fields.insert("path", request.path.into());
        fields.insert("host", request.host.into());
        fields.insert("headers", headers.into());
        let mut context = self.functions.new_inner_scope();
        context.add_variable_from_value("request", fields);
        match self.program.execute(&context) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(CelError(format!(
                "yielded {:?}, not a boolean",
                other.type_of()
            ))),
            Err(e) => Err(CelError(e.to_string())),
        }
    }
}

impl std::fmt::Debug for CelMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CelMatch").field(&self.source).finish()
    }
}

impl PartialEq for CelMatch {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Serialize for CelMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(expr: &str) -> Result<bool, CelError> {
        let headers = [
            ("x-tenant", "a"),
            ("accept", "text/html"),
            ("accept", "application/json"),
        ];
        let request = CelRequest {
            method: "GET",
            path: "/v1/items",
            host: "api",
            headers: &headers,
        };
        CelMatch::compile(expr)
            .unwrap_or_else(|e| panic!("{expr}: {e}"))
            .evaluate(&request)
    }

    #[test]
    fn expressions_and_their_results() {
        for (expr, want) in [
            (
                "request.headers['x-tenant'] == 'a' && request.path.startsWith('/v1/')",
                true,
            ),
            ("request.headers['x-tenant'] == 'b'", false),
            ("request.method in ['GET', 'HEAD']", true),
            ("request.method == 'POST'", false),
            ("request.host == 'api'", true),
            ("'x-tenant' in request.headers", true),
            ("!('x-missing' in request.headers)", true),
            (
                "request.headers['accept'] == 'text/html,application/json'",
                true,
            ),
            ("request.path.matches('^/v[0-9]+/')", true),
            (
                "request.path.endsWith('/items') || request.path == '/'",
                true,
            ),
            ("size(request.headers) == 2", true),
        ] {
            assert_eq!(run(expr), Ok(want), "{expr}");
        }
    }

    #[test]
    fn an_evaluation_error_is_an_error_not_a_match() {
        // A missing key is an error at run time, not false.
        assert!(run("request.headers['x-missing'] == 'a'").is_err());
        assert_eq!(
            run("request.path"),
            Err(CelError("yielded String, not a boolean".into()))
        );
        assert!(run("request.method + 1 == 2").is_err());
    }

    #[test]
    fn broken_expressions_are_refused_with_their_position() {
        for (expr, want) in [
            ("request.path ==", "line 1, column 16:"),
            ("request.path.startsWith('/v1/'", "line 1, column"),
            ("", "must not be empty"),
            (
                "req.path == '/'",
                "unknown variable `req`: only `request` (method, path, host, headers) is defined",
            ),
        ] {
            let e = CelMatch::compile(expr).expect_err(expr);
            assert!(e.contains(want), "{expr}: {e}");
        }
        let long = format!("request.path == '{}'", "a".repeat(MAX_CEL_BYTES));
        assert!(CelMatch::compile(&long)
            .expect_err("too long")
            .starts_with("must be at most 4096 bytes"));
    }
}
