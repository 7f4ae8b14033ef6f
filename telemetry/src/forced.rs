//! Spans recorded whatever the head sampler decided: a second tracer
//! provider on the same export pipeline, whose sampler records and samples
//! every span, and whose ids can be chosen. A caller that kept an
//! unsampled span's ids (they went out in `traceparent` already) can record
//! that span after the fact under the same ids, so the trace it exports is
//! the one the upstream was told about.
//!
//! The contract: [`ForcedTracer::start_with_ids`] starts one span with the
//! given trace and span ids (the trace id is used only when `parent` has no
//! valid span: a child keeps its parent's); [`ForcedTracer::tracer`] starts
//! spans with fresh random ids. Both record and sample every span. The
//! pipeline offers none while `OTEL_TRACES_SAMPLER=always_off`.

use std::cell::Cell;

use opentelemetry::trace::{SpanBuilder, SpanId, TraceId, Tracer as _, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SdkTracer, SdkTracerProvider, Span, SpanProcessor,
};
use opentelemetry_sdk::Resource;

thread_local! {
    /// The ids the next span started on this thread takes, set and cleared
    /// around one synchronous start by [`ForcedTracer::start_with_ids`].
    static CHOSEN: Cell<(Option<TraceId>, Option<SpanId>)> = const { Cell::new((None, None)) };
}

/// Random ids, unless [`CHOSEN`] holds the next ones.
#[derive(Debug, Default)]
struct ChosenIds(RandomIdGenerator);

impl IdGenerator for ChosenIds {
    fn new_trace_id(&self) -> TraceId {
        CHOSEN
            .with(|c| {
                let (trace, span) = c.get();
                c.set((None, span));
                trace
            })
            .unwrap_or_else(|| self.0.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        CHOSEN
            .with(|c| {
                let (trace, span) = c.get();
                c.set((trace, None));
                span
            })
            .unwrap_or_else(|| self.0.new_span_id())
    }
}

/// Starts spans that are recorded and sampled whatever the head sampler
/// says. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ForcedTracer(SdkTracer);

impl ForcedTracer {
    /// A tracer named `scope` whose spans go to `processor` with `resource`,
    /// and the provider that owns it (shut down with the pipeline).
    pub(crate) fn new(
        processor: impl SpanProcessor + 'static,
        resource: Resource,
        scope: &'static str,
    ) -> (ForcedTracer, SdkTracerProvider) {
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .with_sampler(Sampler::AlwaysOn)
            .with_id_generator(ChosenIds::default())
            .build();
        (ForcedTracer(provider.tracer(scope)), provider)
    }

    /// Starts spans with fresh ids (children of a forced span).
    pub fn tracer(&self) -> &SdkTracer {
        &self.0
    }

    /// Starts `builder` under `parent` with `span_id`, and with `trace_id`
    /// when `parent` holds no valid span (a root); under a valid parent the
    /// span is in the parent's trace, as every child is.
    pub fn start_with_ids(
        &self,
        builder: SpanBuilder,
        parent: &Context,
        trace_id: TraceId,
        span_id: SpanId,
    ) -> Span {
        CHOSEN.with(|c| c.set((Some(trace_id), Some(span_id))));
        let span = self.0.build_with_context(builder, parent);
        // A start the SDK refused early (after shutdown) took neither id.
        CHOSEN.with(|c| c.set((None, None)));
        span
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::{
        Span as _, SpanContext, TraceContextExt, TraceFlags, TraceState, Tracer as _,
    };
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::SpanData;

    use super::*;

    /// Keeps every finished span.
    #[derive(Clone, Debug, Default)]
    struct Kept(Arc<Mutex<Vec<SpanData>>>);

    impl SpanProcessor for Kept {
        fn on_start(&self, _span: &mut Span, _cx: &Context) {}
        fn on_end(&self, span: SpanData) {
            self.0.lock().expect("spans").push(span);
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _timeout: std::time::Duration) -> OTelSdkResult {
            Ok(())
        }
    }

    fn forced() -> (ForcedTracer, Kept, SdkTracerProvider) {
        let kept = Kept::default();
        let (tracer, provider) =
            ForcedTracer::new(kept.clone(), Resource::builder_empty().build(), "test");
        (tracer, kept, provider)
    }

    #[test]
    fn a_root_takes_both_chosen_ids_once_and_is_sampled() {
        let (tracer, kept, _provider) = forced();
        let trace = TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736_u128);
        let span = SpanId::from(0x00f0_67aa_0ba9_02b7_u64);
        let mut s =
            tracer.start_with_ids(SpanBuilder::from_name("root"), &Context::new(), trace, span);
        assert!(s.span_context().is_sampled());
        s.end();
        let mut next = tracer.tracer().start_with_context("next", &Context::new());
        assert_ne!(next.span_context().trace_id(), trace, "fresh ids next");
        assert_ne!(next.span_context().span_id(), span);
        next.end();
        let spans = kept.0.lock().expect("spans");
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].span_context.trace_id(), trace);
        assert_eq!(spans[0].span_context.span_id(), span);
        assert_eq!(spans[0].parent_span_id, SpanId::INVALID);
    }

    #[test]
    fn under_an_unsampled_parent_the_span_keeps_the_parents_trace_and_is_sampled() {
        let (tracer, kept, _provider) = forced();
        let parent = SpanContext::new(
            TraceId::from(7),
            SpanId::from(8),
            TraceFlags::NOT_SAMPLED,
            true,
            TraceState::default(),
        );
        let cx = Context::new().with_remote_span_context(parent);
        let mut s = tracer.start_with_ids(
            SpanBuilder::from_name("child"),
            &cx,
            TraceId::from(99),
            SpanId::from(5),
        );
        s.end();
        let spans = kept.0.lock().expect("spans");
        assert_eq!(spans[0].span_context.trace_id(), TraceId::from(7));
        assert_eq!(spans[0].span_context.span_id(), SpanId::from(5));
        assert!(spans[0].span_context.is_sampled());
        assert_eq!(spans[0].parent_span_id, SpanId::from(8));
        assert!(spans[0].parent_span_is_remote);
    }
}
