//! What the worker tests read their metrics from: metrics-util's [`DebuggingRecorder`],
//! installed as the thread's recorder, and read by name and labels.

use metrics::{Key, Label, LocalRecorderGuard, Metadata, Recorder};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Every metric a test's code records, by name and labels.
///
/// A [`Snapshotter`] consumes what it reads (counters and gauges go back to 0, histograms
/// empty); each read here puts the values back, so a metric reads the same until the code
/// changes it, as on a Prometheus endpoint.
pub struct RecordedMetrics {
    recorder: DebuggingRecorder,
    snapshotter: Snapshotter,
}

impl Default for RecordedMetrics {
    fn default() -> Self {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        RecordedMetrics {
            recorder,
            snapshotter,
        }
    }
}

impl RecordedMetrics {
    /// Records the metrics of this thread (a `start_paused` test runs its worker tasks on it)
    /// until the guard is dropped.
    pub fn set_local(&self) -> LocalRecorderGuard<'_> {
        metrics::set_default_local_recorder(&self.recorder)
    }

    /// The counter `name` with exactly `labels` (`("queue", "q")`, any order); 0 when it was
    /// never registered.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.value(name, labels) {
            Some(DebugValue::Counter(n)) => n,
            _ => 0,
        }
    }

    /// The gauge `name` with exactly `labels`; `None` when it was never registered.
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        match self.value(name, labels) {
            Some(DebugValue::Gauge(v)) => Some(v.0),
            _ => None,
        }
    }

    /// The values the histogram `name` with exactly `labels` recorded (empty when none).
    pub fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        match self.value(name, labels) {
            Some(DebugValue::Histogram(values)) => values.into_iter().map(|v| v.0).collect(),
            _ => Vec::new(),
        }
    }

    /// One snapshot, put back at once, and the value of `name{labels}` in it.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<DebugValue> {
        let wanted = Key::from_parts(
            name.to_owned(),
            labels
                .iter()
                .map(|(k, v)| Label::new((*k).to_owned(), (*v).to_owned()))
                .collect::<Vec<_>>(),
        );
        let metadata = Metadata::new(module_path!(), metrics::Level::INFO, None);
        let mut found = None;
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            match &value {
                DebugValue::Counter(n) => {
                    self.recorder.register_counter(key, &metadata).increment(*n)
                }
                DebugValue::Gauge(v) => self.recorder.register_gauge(key, &metadata).set(v.0),
                DebugValue::Histogram(values) => {
                    let histogram = self.recorder.register_histogram(key, &metadata);
                    values.iter().for_each(|v| histogram.record(v.0));
                }
            }
            if same_key(key, &wanted) {
                found = Some(value);
            }
        }
        found
    }
}

/// The same name and the same labels, in any order.
fn same_key(a: &Key, b: &Key) -> bool {
    let sorted = |k: &Key| {
        let mut labels: Vec<(String, String)> = k
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        labels
    };
    a.name() == b.name() && sorted(a) == sorted(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_reads_the_same_until_the_code_changes_it() {
        let recorded = RecordedMetrics::default();
        let _guard = recorded.set_local();
        metrics::counter!("c_total", "queue" => "q", "kind" => "k").increment(3);
        metrics::gauge!("g").set(2.5);
        metrics::histogram!("h_seconds").record(0.5);
        for _ in 0..2 {
            assert_eq!(
                recorded.counter("c_total", &[("kind", "k"), ("queue", "q")]),
                3
            );
            assert_eq!(recorded.gauge("g", &[]), Some(2.5));
            assert_eq!(recorded.histogram("h_seconds", &[]), [0.5]);
        }
        metrics::counter!("c_total", "queue" => "q", "kind" => "k").increment(1);
        metrics::gauge!("g").set(0.0);
        assert_eq!(
            recorded.counter("c_total", &[("queue", "q"), ("kind", "k")]),
            4
        );
        assert_eq!(recorded.gauge("g", &[]), Some(0.0));
    }

    #[test]
    fn a_metric_never_recorded_reads_as_absent() {
        let recorded = RecordedMetrics::default();
        let _guard = recorded.set_local();
        metrics::counter!("c_total", "queue" => "q").increment(1);
        assert_eq!(recorded.counter("c_total", &[]), 0, "other labels");
        assert_eq!(recorded.counter("c_total", &[("queue", "other")]), 0);
        assert_eq!(
            recorded.gauge("c_total", &[("queue", "q")]),
            None,
            "not a gauge"
        );
        assert!(recorded.histogram("h", &[]).is_empty());
    }
}
