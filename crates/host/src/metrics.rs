//! The host's own metrics, the Prometheus exporter that serves every crate's, the histogram
//! buckets it renders them with, and the [`catalog`] of every workpump metric
//! (`docs/metrics.md` lists the same, and a test keeps the two equal).

use std::net::SocketAddr;
use std::sync::Mutex;

use metrics::{
    describe_counter, describe_gauge, Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};

use crate::HostError;

/// Worker restarts by supervision, by `worker`. Every worker's series starts at 0 when it
/// first runs, so the first restart shows in `increase()`.
pub const WORKER_RESTARTS: &str = "workpump_worker_restarts_total";

/// Hosts running in this process (from `start` until their run ends): 1 while the host runs,
/// 0 once it stopped. Summed across instances, the live ones.
pub const HOST_UP: &str = "workpump_host_up";

/// Buckets for a call to the store: sub-millisecond to half a minute (every store call has a
/// timeout well inside that).
const STORE_CALL: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Buckets for a handler's run: a millisecond to an hour (the default max duration is 30 min).
const HANDLER_RUN: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];
/// Buckets for pickup lag: a claim within milliseconds of being due, up to an hour behind.
const PICKUP: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];
/// Buckets for the wait between polls: the poll base (250 ms) to past the relaxed base (5 s)
/// and the max (10 s).
const POLL_WAIT: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];
/// Buckets for a maintenance sweep: several store calls, each in batches.
const SWEEP: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Buckets for a batch size: one item up to a claim's maximum (10 000).
const BATCH: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

/// The buckets every workpump histogram is rendered with, by metric name. With explicit
/// buckets the exporter renders a Prometheus `histogram` (`_bucket{le=...}`, `_sum`,
/// `_count`), which aggregates across instances; without, it would render a summary, whose
/// quantiles do not. Every histogram in the [`catalog`] has an entry (a test checks it).
pub const HISTOGRAM_BUCKETS: &[(&str, &[f64])] = {
    use workpump_claim_worker::metrics as claim;
    use workpump_heartbeat_worker::metrics as heartbeat;
    use workpump_lease_renewal::metrics as lease;
    use workpump_maintenance::metrics as maintenance;
    use workpump_scheduler::metrics as scheduler;
    &[
        (claim::CLAIM_DURATION, STORE_CALL),
        (claim::PICKUP_LAG, PICKUP),
        (claim::BATCH_SIZE, BATCH),
        (claim::POLL_WAIT, POLL_WAIT),
        (claim::HANDLER_DURATION, HANDLER_RUN),
        (claim::OUTCOME_WRITE_DURATION, STORE_CALL),
        (claim::OUTCOME_BATCH, BATCH),
        (lease::RENEWAL_CALL_DURATION_SECONDS, STORE_CALL),
        (lease::RENEWAL_BATCH_SIZE, BATCH),
        (heartbeat::CALL_DURATION_SECONDS, STORE_CALL),
        (maintenance::STEP_DURATION_SECONDS, STORE_CALL),
        (maintenance::SWEEP_DURATION_SECONDS, SWEEP),
        (scheduler::FIRE_LAG_SECONDS, PICKUP),
    ]
};

/// Installs the process-wide Prometheus recorder with an HTTP listener on `listen` and
/// describes every workpump metric. One per process: a second host in the same process
/// reports an error naming the address.
pub(crate) fn install(listen: SocketAddr) -> Result<(), HostError> {
    prometheus_builder()
        .map_err(|e| HostError::Metrics {
            context: "configuring histogram buckets".to_owned(),
            source: Box::new(e),
        })?
        .with_http_listener(listen)
        .install()
        .map_err(|e| HostError::Metrics {
            context: format!("serving metrics on {listen}"),
            source: Box::new(e),
        })?;
    describe();
    tracing::info!("serving Prometheus metrics on http://{listen}/metrics");
    Ok(())
}

/// A Prometheus exporter builder with workpump's [`HISTOGRAM_BUCKETS`]: what the host
/// installs, without the listener. Use it when you install the exporter yourself (then call
/// [`describe`]).
pub fn prometheus_builder() -> Result<PrometheusBuilder, BuildError> {
    HISTOGRAM_BUCKETS
        .iter()
        .try_fold(PrometheusBuilder::new(), |builder, (name, buckets)| {
            builder.set_buckets_for_metric(Matcher::Full((*name).to_owned()), buckets)
        })
}

/// Describes every workpump metric (every worker crate's and the host's). Call it after
/// installing your own `metrics` recorder if you don't let the host install one.
pub fn describe() {
    workpump_claim_worker::metrics::describe();
    workpump_lease_renewal::metrics::describe();
    workpump_heartbeat_worker::metrics::describe();
    workpump_maintenance::metrics::describe();
    workpump_scheduler::metrics::describe();
    describe_own();
}

/// The host's own descriptions.
fn describe_own() {
    describe_counter!(
        WORKER_RESTARTS,
        Unit::Count,
        "worker restarts by supervision"
    );
    describe_gauge!(
        HOST_UP,
        Unit::Count,
        "hosts running in this process: 1 while the host runs, 0 once it stopped"
    );
}

/// A metric's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum MetricKind {
    /// Only goes up (`_total`).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// A distribution, rendered with the buckets in [`HISTOGRAM_BUCKETS`].
    Histogram,
}

impl MetricKind {
    /// Its Prometheus type word.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

/// One workpump metric as its crate describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricDescription {
    /// Its name, in its final Prometheus form.
    pub name: String,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// Its unit (`Unit::as_str`: `count`, `seconds`), when described with one.
    pub unit: Option<&'static str>,
    /// Its help text.
    pub help: String,
    /// The package that describes and records it (`workpump-claim-worker`, ...).
    pub package: &'static str,
}

/// Every workpump metric, as each crate's `describe` states it: by package, in the order
/// described. `docs/metrics.md` lists the same metrics (a test keeps them equal).
pub fn catalog() -> Vec<MetricDescription> {
    let crates: [(&'static str, fn()); 6] = [
        (
            "workpump-claim-worker",
            workpump_claim_worker::metrics::describe,
        ),
        (
            "workpump-lease-renewal",
            workpump_lease_renewal::metrics::describe,
        ),
        (
            "workpump-heartbeat-worker",
            workpump_heartbeat_worker::metrics::describe,
        ),
        (
            "workpump-maintenance",
            workpump_maintenance::metrics::describe,
        ),
        ("workpump-scheduler", workpump_scheduler::metrics::describe),
        ("workpump-host", describe_own),
    ];
    let mut all = Vec::new();
    for (package, describe) in crates {
        let collector = Descriptions {
            package,
            described: Mutex::default(),
        };
        metrics::with_local_recorder(&collector, describe);
        all.extend(
            collector
                .described
                .into_inner()
                .unwrap_or_else(|p| p.into_inner()),
        );
    }
    all
}

/// A recorder that keeps the descriptions one package gives it and records nothing.
struct Descriptions {
    package: &'static str,
    described: Mutex<Vec<MetricDescription>>,
}

impl Descriptions {
    fn push(&self, key: KeyName, kind: MetricKind, unit: Option<Unit>, help: SharedString) {
        self.described
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(MetricDescription {
                name: key.as_str().to_owned(),
                kind,
                unit: unit.map(|u| u.as_str()),
                help: help.into_owned(),
                package: self.package,
            });
    }
}

impl Recorder for Descriptions {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.push(key, MetricKind::Counter, unit, help);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.push(key, MetricKind::Gauge, unit, help);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.push(key, MetricKind::Histogram, unit, help);
    }
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_histogram_has_buckets_and_every_bucket_list_names_a_histogram() {
        let histograms: BTreeSet<String> = catalog()
            .into_iter()
            .filter(|m| m.kind == MetricKind::Histogram)
            .map(|m| m.name)
            .collect();
        let bucketed: BTreeSet<String> = HISTOGRAM_BUCKETS
            .iter()
            .map(|(name, _)| (*name).to_owned())
            .collect();
        assert!(histograms.len() >= 12, "{histograms:?}");
        let missing: Vec<_> = histograms.difference(&bucketed).collect();
        assert!(
            missing.is_empty(),
            "histograms without buckets: {missing:?}"
        );
        let stale: Vec<_> = bucketed.difference(&histograms).collect();
        assert!(stale.is_empty(), "buckets for no histogram: {stale:?}");
        for (name, buckets) in HISTOGRAM_BUCKETS {
            assert!(
                buckets.windows(2).all(|w| w[0] < w[1]) && buckets[0] > 0.0,
                "{name}: buckets must rise from above 0: {buckets:?}"
            );
        }
    }

    #[test]
    fn every_histogram_renders_as_a_prometheus_histogram_with_buckets() {
        let recorder = prometheus_builder().expect("buckets").build_recorder();
        let handle = recorder.handle();
        let histograms: Vec<MetricDescription> = catalog()
            .into_iter()
            .filter(|m| m.kind == MetricKind::Histogram)
            .collect();
        metrics::with_local_recorder(&recorder, || {
            describe();
            for m in &histograms {
                metrics::histogram!(m.name.clone(), "queue" => "q").record(0.003);
            }
        });
        let text = handle.render();
        assert!(
            !text.contains(" summary"),
            "no summary is rendered:\n{text}"
        );
        for m in &histograms {
            let name = &m.name;
            assert!(
                text.contains(&format!("# TYPE {name} histogram\n")),
                "{name} renders as a histogram:\n{text}"
            );
            let buckets = HISTOGRAM_BUCKETS
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, b)| *b)
                .expect("buckets");
            let bucket_lines: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("{name}_bucket{{")))
                .collect();
            assert_eq!(
                bucket_lines.len(),
                buckets.len() + 1,
                "{name}: one line per bucket and +Inf:\n{text}"
            );
            assert!(
                bucket_lines
                    .iter()
                    .any(|l| l.contains("le=\"+Inf\"") && l.ends_with(" 1")),
                "{name}: the sample is counted in +Inf:\n{text}"
            );
            assert!(
                text.contains(&format!("{name}_count{{queue=\"q\"}} 1\n")),
                "{name}_count:\n{text}"
            );
        }
    }
}
