//! W3C trace context on HTTP headers, through the SDK's `TraceContextPropagator`:
//! the application's `traceparent`/`tracestate` in, each attempt's own out.

use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;

struct Extract<'a>(&'a HeaderMap);

impl Extractor for Extract<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let value = self.0.get(key).and_then(|v| v.to_str().ok())?;
        // The SDK parses ids as numbers and so accepts a short one ("0" padded);
        // W3C wants exactly 2-32-16-2 hex digits, else a new trace.
        if key == "traceparent" && !well_formed(value.trim()) {
            return None;
        }
        Some(value)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// True when the first four fields have W3C's lengths (their content is the SDK's to check).
fn well_formed(traceparent: &str) -> bool {
    let mut fields = traceparent.split('-');
    [2, 32, 16, 2]
        .iter()
        .all(|len| fields.next().is_some_and(|f| f.len() == *len))
}

/// The remote parent the application sent, or an empty context when its
/// `traceparent` is missing or invalid (the request then starts a new trace).
pub fn extract(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&Extract(headers))
}

/// One attempt's trace context as header values: `traceparent`, and
/// `tracestate` when the span carries one.
#[derive(Debug, Clone)]
pub struct TraceFields {
    /// `traceparent`.
    pub traceparent: HeaderValue,
    /// `tracestate`; `None` when empty (none is sent then).
    pub tracestate: Option<HeaderValue>,
}

/// The SDK's propagator writes into this: the values kept as they are made,
/// so an HTTP/1 attempt can encode them without a header map.
#[derive(Default)]
struct Collect {
    traceparent: Option<HeaderValue>,
    tracestate: Option<HeaderValue>,
}

impl Injector for Collect {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes an empty `tracestate` when there is none; send none.
        let value = Some(value)
            .filter(|v| !v.is_empty())
            .and_then(|v| HeaderValue::try_from(v).ok());
        match key {
            "traceparent" => self.traceparent = value,
            "tracestate" => self.tracestate = value,
            _ => {}
        }
    }
}

/// `span`'s context as the fields an outgoing request carries; `None` for
/// an invalid span context (nothing is injected then).
pub fn trace_fields(span: &SpanContext) -> Option<TraceFields> {
    let cx = Context::new().with_remote_span_context(span.clone());
    let mut out = Collect::default();
    TraceContextPropagator::new().inject_context(&cx, &mut out);
    Some(TraceFields {
        traceparent: out.traceparent?,
        tracestate: out.tracestate,
    })
}

/// Writes `span`'s `traceparent` (and `tracestate`) into `headers`, replacing
/// whatever the application sent.
pub fn inject(span: &SpanContext, headers: &mut HeaderMap) {
    let Some(fields) = trace_fields(span) else {
        return;
    };
    // `insert` replaces: the upstream sees this attempt's context only.
    headers.insert(TRACEPARENT, fields.traceparent);
    match fields.tracestate {
        Some(v) => {
            headers.insert(TRACESTATE, v);
        }
        None => {
            headers.remove(TRACESTATE);
        }
    }
}

/// W3C's request header names.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// See [`TRACEPARENT`].
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};

    use super::*;

    fn parent(traceparent: &str) -> Option<SpanContext> {
        let mut h = HeaderMap::new();
        h.insert("traceparent", traceparent.parse().expect("header"));
        h.insert("tracestate", "vendor=abc".parse().expect("header"));
        let cx = extract(&h);
        let sc = cx.span().span_context().clone();
        sc.is_valid().then_some(sc)
    }

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    #[test]
    fn a_valid_traceparent_is_the_remote_parent() {
        let sc = parent(&format!("00-{TRACE}-{SPAN}-01")).expect("valid");
        assert_eq!(sc.trace_id(), TraceId::from_hex(TRACE).expect("hex"));
        assert_eq!(sc.span_id(), SpanId::from_hex(SPAN).expect("hex"));
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(sc.trace_state().get("vendor"), Some("abc"));
        let unsampled = parent(&format!("00-{TRACE}-{SPAN}-00")).expect("valid");
        assert!(!unsampled.is_sampled());
        // A future version may append fields; its first four still count.
        assert!(parent(&format!("01-{TRACE}-{SPAN}-01-extra")).is_some());
    }

    #[test]
    fn an_invalid_traceparent_starts_a_new_trace() {
        for bad in [
            format!("ff-{TRACE}-{SPAN}-01"),
            format!("00-{}-{SPAN}-01", "0".repeat(32)),
            format!("00-{TRACE}-{}-01", "0".repeat(16)),
            format!("00-{}-{SPAN}-01", TRACE.to_uppercase()),
            format!("00-{TRACE}-{SPAN}-01-extra"),
            format!("00-{TRACE}-{SPAN}"),
            format!("00-{}-{SPAN}-01", &TRACE[1..]),
            format!("00-{TRACE}-{}-01", &SPAN[1..]),
            format!("0-{TRACE}-{SPAN}-01"),
            format!("00-{TRACE}-{SPAN}-1"),
            "garbage".to_string(),
            String::new(),
        ] {
            assert!(parent(&bad).is_none(), "{bad:?} accepted");
        }
    }

    #[test]
    fn an_invalid_span_context_has_no_fields_and_injects_nothing() {
        assert!(trace_fields(&SpanContext::empty_context()).is_none());
        let mut h = HeaderMap::new();
        h.insert("traceparent", "00-app".parse().expect("header"));
        inject(&SpanContext::empty_context(), &mut h);
        assert_eq!(
            h.get("traceparent").map(|v| v.as_bytes()),
            Some(&b"00-app"[..])
        );
    }

    #[test]
    fn inject_replaces_the_incoming_context() {
        let mut h = HeaderMap::new();
        h.append("traceparent", "00-aaaa-bbbb-01".parse().expect("header"));
        h.append("traceparent", "00-cccc-dddd-01".parse().expect("header"));
        h.insert("tracestate", "old=1".parse().expect("header"));
        let sc = SpanContext::new(
            TraceId::from_hex(TRACE).expect("hex"),
            SpanId::from_hex(SPAN).expect("hex"),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        inject(&sc, &mut h);
        let all: Vec<_> = h.get_all("traceparent").iter().collect();
        assert_eq!(all, [&format!("00-{TRACE}-{SPAN}-01")]);
        assert!(h.get("tracestate").is_none(), "no empty tracestate is sent");
        let with_state = SpanContext::new(
            sc.trace_id(),
            sc.span_id(),
            TraceFlags::default(),
            false,
            TraceState::from_key_value([("vendor", "abc")]).expect("state"),
        );
        inject(&with_state, &mut h);
        assert_eq!(
            h.get("traceparent").map(|v| v.as_bytes()),
            Some(format!("00-{TRACE}-{SPAN}-00").as_bytes())
        );
        assert_eq!(
            h.get("tracestate").map(|v| v.as_bytes()),
            Some(&b"vendor=abc"[..])
        );
    }
}
