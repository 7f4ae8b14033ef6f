//! Where log lines go: appended to a shared buffer that one thread writes out
//! in batches, so logging a request costs a copy into memory, not a wake-up of
//! another thread and a `write(2)` per line. With one line per request (the
//! access log) on one CPU, this proxies more requests per second than
//! `tracing-appender`'s writer, which is woken for every line.
//!
//! The writer runs on a timer only while lines come: it writes out what came
//! within [`FLUSH_INTERVAL`], and after an interval with nothing to write it
//! sleeps with no timer until a line wakes it. Waking every interval
//! regardless made the log thread wake an idle sidecar more often than
//! everything else in it together; waking it for the first line of every
//! batch would put a `futex` call in one request's path per interval under
//! steady traffic.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a line waits for others to share its write.
pub(crate) const FLUSH_INTERVAL: Duration = Duration::from_millis(50);

/// Most bytes held between two flushes. Lines past it are dropped and counted:
/// a stalled stdout must neither grow the sidecar's memory nor block requests.
pub(crate) const MAX_BUFFERED_BYTES: usize = 8 << 20;

/// Buffers log lines for the writer thread; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct BatchedWriter {
    shared: Arc<Shared>,
}

/// Writes out what is left and stops the writer thread when dropped.
#[derive(Debug)]
pub(crate) struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    dropped: AtomicU64,
    limit: usize,
    /// Times the writer thread has woken (read by tests).
    wakes: AtomicU64,
    /// Times a line woke the writer (read by tests).
    notified: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    lines: Vec<u8>,
    closed: bool,
    /// The writer sleeps until a line comes (the buffer was empty).
    idle: bool,
}

impl BatchedWriter {
    /// Starts the writer thread for `sink` with the default interval and limit.
    pub(crate) fn spawn(sink: impl Write + Send + 'static) -> io::Result<(Self, FlushGuard)> {
        Self::with_limits(sink, FLUSH_INTERVAL, MAX_BUFFERED_BYTES)
    }

    /// Starts the writer thread: it writes out the lines buffered within
    /// `interval` of the first one; at most `limit` bytes wait between two
    /// writes.
    pub(crate) fn with_limits(
        mut sink: impl Write + Send + 'static,
        interval: Duration,
        limit: usize,
    ) -> io::Result<(Self, FlushGuard)> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            dropped: AtomicU64::new(0),
            limit,
            wakes: AtomicU64::new(0),
            notified: AtomicU64::new(0),
        });
        let writer = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || {
                let mut batch = Vec::new();
                // The last turn wrote lines: keep the timer one more interval,
                // so lines that keep coming never wake this thread themselves.
                let mut busy = false;
                loop {
                    let closed = {
                        let mut state = writer.lock();
                        if !busy {
                            while state.lines.is_empty() && !state.closed {
                                state.idle = true;
                                state = writer
                                    .wake
                                    .wait(state)
                                    .unwrap_or_else(PoisonError::into_inner);
                                writer.wakes.fetch_add(1, Ordering::Relaxed);
                            }
                            state.idle = false;
                        }
                        // Only the close wakes this early: lines that come
                        // meanwhile join the batch.
                        if !state.closed {
                            state = writer
                                .wake
                                .wait_timeout(state, interval)
                                .unwrap_or_else(PoisonError::into_inner)
                                .0;
                            writer.wakes.fetch_add(1, Ordering::Relaxed);
                        }
                        std::mem::swap(&mut state.lines, &mut batch);
                        state.closed
                    };
                    busy = !batch.is_empty();
                    if !batch.is_empty() {
                        // Nowhere to report a failed log write but the log itself.
                        let _ = sink.write_all(&batch).and_then(|()| sink.flush());
                        batch.clear();
                    }
                    let dropped = writer.dropped.swap(0, Ordering::Relaxed);
                    if dropped > 0 {
                        eprintln!(
                            "reprise-sidecar: {dropped} log line(s) dropped: output too slow"
                        );
                    }
                    if closed {
                        return;
                    }
                }
            })?;
        Ok((
            Self {
                shared: Arc::clone(&shared),
            },
            FlushGuard {
                shared,
                thread: Some(thread),
            },
        ))
    }

    /// Lines dropped since the last write out (the buffer was full).
    #[cfg(test)]
    fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Buffers one whole line, or drops and counts it when the buffer is full.
    pub(crate) fn append(&self, line: &[u8]) {
        let mut state = self.shared.lock();
        if state.lines.len() + line.len() > self.shared.limit {
            drop(state);
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            state.lines.extend_from_slice(line);
            // Only a line that comes after a quiet interval wakes the
            // writer: otherwise it is on its timer.
            let wake = std::mem::replace(&mut state.idle, false);
            drop(state);
            if wake {
                self.shared.notified.fetch_add(1, Ordering::Relaxed);
                self.shared.wake.notify_one();
            }
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Write for BatchedWriter {
    /// Takes a whole line (tracing's formatter writes each event at once).
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        self.append(line);
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchedWriter {
    type Writer = BatchedWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink the test can read while the writer thread owns a handle to it.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Sink {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            let mut s = self.0.lock().expect("sink");
            s.0.extend_from_slice(data);
            s.1 += 1;
            Ok(data.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().expect("sink").0).into_owned()
        }
        fn writes(&self) -> usize {
            self.0.lock().expect("sink").1
        }
    }

    /// A writer into a fresh sink, writing out every `interval` and
    /// keeping at most `limit` bytes buffered.
    fn writer(interval: Duration, limit: usize) -> (Sink, BatchedWriter, FlushGuard) {
        let sink = Sink::default();
        let (w, guard) = BatchedWriter::with_limits(sink.clone(), interval, limit).expect("spawn");
        (sink, w, guard)
    }

    /// Waits up to 5 s for `done`.
    fn eventually(done: impl Fn() -> bool) -> bool {
        let start = std::time::Instant::now();
        while !done() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(2));
        }
        done()
    }

    #[test]
    fn lines_are_written_in_batches_in_order_and_flushed_on_drop() {
        // An interval far longer than the test: only the drop can flush.
        let (sink, mut w, guard) = writer(Duration::from_secs(3600), 1 << 20);
        for i in 0..100 {
            w.write_all(format!("line {i}\n").as_bytes())
                .expect("write");
        }
        assert_eq!(sink.writes(), 0, "nothing written before a flush");
        drop(guard);
        let expected: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(sink.text(), expected);
        assert_eq!(sink.writes(), 1, "one write for the whole batch");
    }

    #[test]
    fn the_writer_thread_writes_out_every_interval() {
        let (sink, mut w, _guard) = writer(Duration::from_millis(10), 1 << 20);
        w.write_all(b"hello\n").expect("write");
        eventually(|| !sink.text().is_empty());
        assert_eq!(sink.text(), "hello\n");
    }

    #[test]
    fn an_idle_writer_sleeps_until_a_line_comes() {
        let (sink, mut w, _guard) = writer(Duration::from_millis(5), 1 << 20);
        let shared = Arc::clone(&w.shared);
        let wakes = || shared.wakes.load(Ordering::Relaxed);
        // Forty intervals with nothing to write: a timer would have woken
        // the thread about forty times.
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(wakes(), 0, "woke with nothing to write");
        w.write_all(b"one\n").expect("write");
        assert!(eventually(|| sink.text() == "one\n"), "{:?}", sink.text());
        // The line, its interval, and one quiet interval after the write.
        assert!(eventually(|| wakes() >= 3), "{} wake-ups", wakes());
        let after_one = wakes();
        assert_eq!(after_one, 3, "wake-ups for one line");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(wakes(), after_one, "woke again with nothing to write");
        // And it still wakes for the next line.
        w.write_all(b"two\n").expect("write");
        assert!(
            eventually(|| sink.text() == "one\ntwo\n"),
            "{:?}",
            sink.text()
        );
    }

    #[test]
    fn lines_that_keep_coming_do_not_wake_the_writer() {
        let (sink, mut w, _guard) = writer(Duration::from_millis(20), 1 << 20);
        // A line a millisecond for 300 ms: 15 intervals, each with lines.
        let start = std::time::Instant::now();
        let mut sent = 0;
        while start.elapsed() < Duration::from_millis(300) {
            w.write_all(b"x\n").expect("write");
            sent += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(eventually(|| sink.text().len() == 2 * sent));
        let notified = w.shared.notified.load(Ordering::Relaxed);
        // The first line wakes it; this thread stalled for a whole interval
        // on a loaded machine may let it fall idle once or twice more, not
        // once per interval.
        assert!(notified <= 3, "{notified} wake-ups from {sent} lines");
    }

    #[test]
    fn lines_past_the_limit_are_dropped_whole_and_counted() {
        let (sink, mut w, guard) = writer(Duration::from_secs(3600), 16);
        w.write_all(b"0123456789\n").expect("write"); // 11 bytes: kept
        w.write_all(b"abcdefghij\n").expect("write"); // would make 22: dropped
        w.write_all(b"xyz\n").expect("write"); // 15: kept
        assert_eq!(w.dropped(), 1);
        drop(guard);
        assert_eq!(sink.text(), "0123456789\nxyz\n");
    }
}
