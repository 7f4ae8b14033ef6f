//! The Prometheus text exposition format (version 0.0.4), and the metric
//! primitives behind it.
//!
//! [`Exposition`] groups samples by family, so each family's lines stay
//! together with one `# HELP` and `# TYPE` as the format requires, in the order
//! the caller's [`Family`] table gives. [`Histogram`] is a fixed-bucket
//! histogram of durations; [`Gauge`] hands out a guard per unit it counts, so a
//! dropped future can never leave a count behind.

use std::fmt::{Display, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One metric family: its name, type and help text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    /// The family name, e.g. `reprise_requests_total`.
    pub name: &'static str,
    /// `counter`, `gauge` or `histogram`.
    pub kind: Kind,
    /// One line of help.
    pub help: &'static str,
}

/// A family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Buckets, sum and count.
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Samples being rendered, grouped by family.
#[derive(Debug)]
pub struct Exposition {
    families: &'static [Family],
    bodies: Vec<String>,
}

impl Exposition {
    /// An empty exposition of `families`; every family is written, with its
    /// HELP and TYPE, even when it has no samples.
    pub fn new(families: &'static [Family]) -> Self {
        Self {
            families,
            bodies: vec![String::new(); families.len()],
        }
    }

    /// The sample lines of family `name`, to append to.
    ///
    /// # Panics
    /// When `name` is not in the family table: a metric without HELP and TYPE
    /// is a programming error the first test that renders it catches.
    pub fn family(&mut self, name: &str) -> &mut String {
        let i = self
            .families
            .iter()
            .position(|f| f.name == name)
            .unwrap_or_else(|| panic!("metric family {name} is not in the table"));
        &mut self.bodies[i]
    }

    /// Adds `name{labels} value`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        let line = self.family(name);
        line.push_str(name);
        write_labels(line, labels);
        let _ = writeln!(line, " {value}");
    }

    /// The exposition text.
    pub fn finish(self) -> String {
        let mut out = String::with_capacity(4096);
        for (family, body) in self.families.iter().zip(self.bodies) {
            let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
            let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind.name());
            out.push_str(&body);
        }
        out
    }
}

/// Appends `{a="x",b="y"}` (nothing for no labels), values escaped as the
/// format requires.
pub fn write_labels(out: &mut String, labels: &[(&str, &str)]) {
    if labels.is_empty() {
        return;
    }
    out.push('{');
    for (i, (name, value)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(name);
        out.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
}

/// A fixed-bucket histogram of durations, in seconds. Lock-free: each
/// observation is three relaxed atomic adds.
#[derive(Debug)]
pub struct Histogram<const N: usize> {
    bounds: [f64; N],
    buckets: [AtomicU64; N],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl<const N: usize> Histogram<N> {
    /// An empty histogram with these upper bounds (ascending, in seconds).
    pub const fn new(bounds: [f64; N]) -> Self {
        Self {
            bounds,
            buckets: [const { AtomicU64::new(0) }; N],
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Writes the `_bucket`, `_sum` and `_count` series of family `name`,
    /// each with `labels` (plus `le` on the buckets).
    pub fn render(&self, out: &mut Exposition, name: &str, labels: &[(&str, &str)]) {
        let body = out.family(name);
        let count = self.count();
        let mut cumulative = 0;
        let mut bucket = |le: &str, n: u64| {
            let mut with_le = labels.to_vec();
            with_le.push(("le", le));
            let _ = write!(body, "{name}_bucket");
            write_labels(body, &with_le);
            let _ = writeln!(body, " {n}");
        };
        for (bound, n) in self.bounds.iter().zip(&self.buckets) {
            cumulative += n.load(Ordering::Relaxed);
            bucket(&bound.to_string(), cumulative);
        }
        bucket("+Inf", count);
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = write!(body, "{name}_sum");
        write_labels(body, labels);
        let _ = writeln!(body, " {sum}");
        let _ = write!(body, "{name}_count");
        write_labels(body, labels);
        let _ = writeln!(body, " {count}");
    }
}

/// A gauge counted by guards: [`Gauge::enter`] adds one and the guard it
/// returns takes it away when dropped, however the holder ends (finished,
/// failed, or its future dropped mid-way).
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

/// Holds one unit of a [`Gauge`].
#[derive(Debug)]
#[must_use = "the gauge goes back down as soon as the guard is dropped"]
pub struct GaugeGuard<'a>(&'a Gauge);

impl Gauge {
    /// Adds one until the guard is dropped.
    pub fn enter(&self) -> GaugeGuard<'_> {
        self.0.fetch_add(1, Ordering::Relaxed);
        GaugeGuard(self)
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;

    const FAMILIES: &[Family] = &[
        Family {
            name: "a_total",
            kind: Kind::Counter,
            help: "As.",
        },
        Family {
            name: "lat_seconds",
            kind: Kind::Histogram,
            help: "Latency.",
        },
    ];

    #[test]
    fn families_keep_their_lines_together_in_table_order() {
        let mut e = Exposition::new(FAMILIES);
        let h = Histogram::new([0.1, 1.0]);
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(5));
        h.render(&mut e, "lat_seconds", &[("upstream", "api")]);
        e.sample("a_total", &[("upstream", "api")], 1);
        e.sample("a_total", &[("upstream", "b\"c\\d\ne")], 2);
        assert_eq!(
            e.finish(),
            "# HELP a_total As.\n# TYPE a_total counter\n\
             a_total{upstream=\"api\"} 1\n\
             a_total{upstream=\"b\\\"c\\\\d\\ne\"} 2\n\
             # HELP lat_seconds Latency.\n# TYPE lat_seconds histogram\n\
             lat_seconds_bucket{upstream=\"api\",le=\"0.1\"} 1\n\
             lat_seconds_bucket{upstream=\"api\",le=\"1\"} 2\n\
             lat_seconds_bucket{upstream=\"api\",le=\"+Inf\"} 3\n\
             lat_seconds_sum{upstream=\"api\"} 5.55\n\
             lat_seconds_count{upstream=\"api\"} 3\n"
        );
    }

    #[test]
    fn a_histogram_without_labels_has_only_le() {
        let mut e = Exposition::new(FAMILIES);
        Histogram::new([0.5]).render(&mut e, "lat_seconds", &[]);
        let text = e.finish();
        assert!(
            text.contains("lat_seconds_bucket{le=\"0.5\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("lat_seconds_sum 0\nlat_seconds_count 0\n"),
            "{text}"
        );
    }

    #[test]
    fn a_gauge_guard_gives_its_unit_back_however_it_is_dropped() {
        let g = Gauge::default();
        let a = g.enter();
        let b = g.enter();
        assert_eq!(g.get(), 2);
        drop(a);
        assert_eq!(g.get(), 1);
        let fut = async {
            let _held = g.enter();
            std::future::pending::<()>().await;
        };
        let mut fut = Box::pin(fut);
        let waker = std::task::Waker::noop();
        let _ = fut
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker));
        assert_eq!(g.get(), 2, "held inside the pending future");
        drop(fut);
        drop(b);
        assert_eq!(g.get(), 0, "a dropped future leaves nothing behind");
    }
}
