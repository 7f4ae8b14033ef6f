//! A batch span processor that exports from a Tokio task.
//!
//! The SDK's own `BatchSpanProcessor` runs the exporter on a dedicated thread
//! under `block_on`, where the hyper (OTLP/HTTP) client has no Tokio reactor,
//! and it does not tell how many spans it dropped. This one queues finished
//! spans in a bounded channel (a full queue drops the span, never waits),
//! exports from a task on the proxy's runtime, and counts what it exported and
//! what it dropped, for `/metrics`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::{mpsc, oneshot};
use tokio::time::MissedTickBehavior;

use crate::settings::BatchSettings;

/// Spans exported and dropped since start.
#[derive(Debug, Default)]
pub struct SpanCounters {
    exported: AtomicU64,
    dropped: AtomicU64,
    /// Set while exports fail, so a down collector logs once, not per batch.
    failing: AtomicBool,
}

impl SpanCounters {
    /// Spans the collector accepted.
    pub fn exported(&self) -> u64 {
        self.exported.load(Ordering::Relaxed)
    }

    /// Spans dropped: queue full, export failed or timed out, or after shutdown.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn drop_spans(&self, n: usize) {
        self.dropped.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// What the worker is asked to do besides batching.
#[derive(Debug)]
enum Control {
    /// Export everything queued now; answer when done.
    Flush(Option<oneshot::Sender<()>>),
    /// Export everything queued, then stop; answer when done.
    Shutdown(Option<oneshot::Sender<()>>),
}

/// The span processor the SDK calls when a span ends.
#[derive(Debug)]
pub(crate) struct BatchProcessor {
    spans: mpsc::Sender<SpanData>,
    control: mpsc::Sender<Control>,
    counters: Arc<SpanCounters>,
    /// False on a [`BatchProcessor::shared`] copy: its provider's shutdown
    /// (or drop) must not stop the worker the other one still feeds.
    owns_worker: bool,
}

/// Lets the owner flush and stop the worker and wait for it, with a bound.
#[derive(Clone, Debug)]
pub(crate) struct Stopper(mpsc::Sender<Control>);

impl BatchProcessor {
    /// Starts the export task on the current Tokio runtime.
    pub(crate) fn start<E>(
        exporter: E,
        settings: BatchSettings,
        counters: Arc<SpanCounters>,
    ) -> (BatchProcessor, Stopper)
    where
        E: SpanExporter + 'static,
    {
        let (spans, span_rx) = mpsc::channel(settings.max_queue_size);
        let (control, control_rx) = mpsc::channel(8);
        tokio::spawn(work(
            exporter,
            span_rx,
            control_rx,
            settings,
            Arc::clone(&counters),
        ));
        let stopper = Stopper(control.clone());
        (
            BatchProcessor {
                spans,
                control,
                counters,
                owns_worker: true,
            },
            stopper,
        )
    }

    /// Another processor feeding the same queue and worker (for a second
    /// tracer provider); shutting it down leaves the worker running.
    pub(crate) fn shared(&self) -> BatchProcessor {
        BatchProcessor {
            spans: self.spans.clone(),
            control: self.control.clone(),
            counters: Arc::clone(&self.counters),
            owns_worker: false,
        }
    }
}

impl Stopper {
    /// Exports what is queued and stops the worker, waiting at most `timeout`.
    /// Returns false when the time ran out (what was left is lost).
    pub(crate) async fn stop(&self, timeout: Duration) -> bool {
        let (done, wait) = oneshot::channel();
        if self.0.try_send(Control::Shutdown(Some(done))).is_err() {
            return true;
        }
        matches!(tokio::time::timeout(timeout, wait).await, Ok(Ok(())))
    }

    /// Exports what is queued now, waiting at most `timeout`.
    pub(crate) async fn flush(&self, timeout: Duration) -> bool {
        let (done, wait) = oneshot::channel();
        if self.0.try_send(Control::Flush(Some(done))).is_err() {
            return false;
        }
        matches!(tokio::time::timeout(timeout, wait).await, Ok(Ok(())))
    }
}

impl SpanProcessor for BatchProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        // Never wait on the proxy path: a full queue (or a stopped worker) drops the span.
        if self.spans.try_send(span).is_err() {
            self.counters.drop_spans(1);
        }
    }

    /// Asks for an export and returns at once: the SDK calls this
    /// synchronously, possibly on a runtime thread the worker needs.
    /// [`Stopper::flush`] waits.
    fn force_flush(&self) -> OTelSdkResult {
        self.control
            .try_send(Control::Flush(None))
            .map_err(|_| OTelSdkError::AlreadyShutdown)
    }

    /// Asks the worker to stop without waiting, for the same reason as
    /// `force_flush`; [`Stopper::stop`] waits with a bound.
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        if self.owns_worker {
            let _ = self.control.try_send(Control::Shutdown(None));
        }
        Ok(())
    }
}

async fn work<E: SpanExporter>(
    exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    mut control: mpsc::Receiver<Control>,
    settings: BatchSettings,
    counters: Arc<SpanCounters>,
) {
    let mut batch = Vec::with_capacity(settings.max_export_batch_size);
    let mut tick = tokio::time::interval(settings.schedule_delay);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            span = spans.recv() => {
                let Some(span) = span else { break };
                batch.push(span);
                if batch.len() >= settings.max_export_batch_size {
                    export(&exporter, &mut batch, &settings, &counters).await;
                }
            }
            _ = tick.tick() => export(&exporter, &mut batch, &settings, &counters).await,
            msg = control.recv() => {
                let (reply, stop) = match msg {
                    Some(Control::Flush(reply)) => (reply, false),
                    Some(Control::Shutdown(reply)) => (reply, true),
                    None => (None, true),
                };
                if stop && counters.failing.load(Ordering::Relaxed) {
                    // The collector is down: exporting what is left (with the
                    // exporter's own retries) would only hold up the exit.
                    let mut left = batch.len();
                    batch.clear();
                    while spans.try_recv().is_ok() {
                        left += 1;
                    }
                    counters.drop_spans(left);
                }
                while let Ok(span) = spans.try_recv() {
                    batch.push(span);
                    if batch.len() >= settings.max_export_batch_size {
                        export(&exporter, &mut batch, &settings, &counters).await;
                    }
                }
                export(&exporter, &mut batch, &settings, &counters).await;
                if let Some(reply) = reply {
                    let _ = reply.send(());
                }
                if stop {
                    break;
                }
            }
        }
    }
    // Spans that end after this are dropped (and counted) by `on_end`.
    spans.close();
    let _ = exporter.shutdown();
}

async fn export<E: SpanExporter>(
    exporter: &E,
    batch: &mut Vec<SpanData>,
    settings: &BatchSettings,
    counters: &SpanCounters,
) {
    if batch.is_empty() {
        return;
    }
    let n = batch.len();
    let spans = std::mem::replace(batch, Vec::with_capacity(settings.max_export_batch_size));
    let error = match tokio::time::timeout(settings.export_timeout, exporter.export(spans)).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!("timed out after {:?}", settings.export_timeout)),
    };
    match error {
        None => {
            counters.exported.fetch_add(n as u64, Ordering::Relaxed);
            if counters.failing.swap(false, Ordering::Relaxed) {
                tracing::info!("trace export works again");
            }
        }
        Some(error) => {
            counters.drop_spans(n);
            if !counters.failing.swap(true, Ordering::Relaxed) {
                tracing::warn!(%error, "trace export failed; spans are dropped until the collector answers (see the *_trace_spans_dropped_total metric)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId};
    use opentelemetry::InstrumentationScope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};

    use super::*;

    /// Records batches; fails while `fail` is set.
    #[derive(Debug, Default)]
    struct Recorder {
        batches: Mutex<Vec<usize>>,
        fail: AtomicBool,
    }

    #[derive(Debug)]
    struct Shared(Arc<Recorder>);

    impl SpanExporter for Shared {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            if self.0.fail.load(Ordering::Relaxed) {
                return Err(OTelSdkError::InternalFailure("collector down".into()));
            }
            self.0.batches.lock().expect("lock").push(batch.len());
            Ok(())
        }
    }

    fn span() -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(1),
                SpanId::from(1),
                TraceFlags::SAMPLED,
                false,
                Default::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Client,
            name: "s".into(),
            start_time: std::time::SystemTime::UNIX_EPOCH,
            end_time: std::time::SystemTime::UNIX_EPOCH,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::builder("t").build(),
        }
    }

    fn settings(queue: usize, batch: usize) -> BatchSettings {
        BatchSettings {
            schedule_delay: Duration::from_secs(3600),
            export_timeout: Duration::from_secs(1),
            max_queue_size: queue,
            max_export_batch_size: batch,
        }
    }

    #[tokio::test]
    async fn full_batches_export_and_stop_flushes_the_rest() {
        let rec = Arc::new(Recorder::default());
        let counters = Arc::new(SpanCounters::default());
        let (p, stopper) = BatchProcessor::start(
            Shared(Arc::clone(&rec)),
            settings(100, 4),
            Arc::clone(&counters),
        );
        (0..10).for_each(|_| p.on_end(span()));
        assert!(stopper.stop(Duration::from_secs(5)).await);
        assert_eq!(rec.batches.lock().expect("lock").iter().sum::<usize>(), 10);
        assert!(rec.batches.lock().expect("lock").iter().all(|n| *n <= 4));
        assert_eq!((counters.exported(), counters.dropped()), (10, 0));
        p.on_end(span());
        assert_eq!(counters.dropped(), 1, "after shutdown a span is dropped");
    }

    #[tokio::test]
    async fn a_full_queue_and_a_failed_export_drop_and_count() {
        let rec = Arc::new(Recorder::default());
        rec.fail.store(true, Ordering::Relaxed);
        let counters = Arc::new(SpanCounters::default());
        let (p, stopper) = BatchProcessor::start(
            Shared(Arc::clone(&rec)),
            settings(2, 100),
            Arc::clone(&counters),
        );
        // The worker has not run yet (this test's runtime is single-threaded):
        // two spans fit the queue, the third is dropped at once.
        (0..3).for_each(|_| p.on_end(span()));
        assert_eq!(counters.dropped(), 1);
        assert!(stopper.flush(Duration::from_secs(5)).await);
        assert_eq!(
            (counters.exported(), counters.dropped()),
            (0, 3),
            "the failed batch is dropped too"
        );
        rec.fail.store(false, Ordering::Relaxed);
        p.on_end(span());
        assert!(stopper.flush(Duration::from_secs(5)).await);
        assert_eq!((counters.exported(), counters.dropped()), (1, 3));
        rec.fail.store(true, Ordering::Relaxed);
        p.on_end(span());
        assert!(stopper.flush(Duration::from_secs(5)).await);
        // While the collector is down, stopping drops what is queued at once.
        rec.fail.store(false, Ordering::Relaxed);
        p.on_end(span());
        assert!(stopper.stop(Duration::from_secs(5)).await);
        assert_eq!((counters.exported(), counters.dropped()), (1, 5));
    }
}
