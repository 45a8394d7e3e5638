//! The host's own metrics, and the Prometheus exporter that serves every crate's.

use std::net::SocketAddr;

use metrics::{describe_counter, describe_gauge, Unit};
use metrics_exporter_prometheus::PrometheusBuilder;

use crate::HostError;

/// Worker restarts by supervision, by `worker`.
pub const WORKER_RESTARTS: &str = "workpump_worker_restarts_total";

/// Installs the process-wide Prometheus recorder with an HTTP listener on `listen` and
/// describes every workpump metric. One per process: a second host in the same process
/// reports an error naming the address.
pub(crate) fn install(listen: SocketAddr) -> Result<(), HostError> {
    PrometheusBuilder::new()
        .with_http_listener(listen)
        .install()
        .map_err(|e| HostError::Metrics(format!("serving metrics on {listen}: {e}")))?;
    describe();
    tracing::info!("serving Prometheus metrics on http://{listen}/metrics");
    Ok(())
}

/// Describes every workpump metric (every worker crate's and the host's). Call it after
/// installing your own `metrics` recorder if you don't let the host install one.
pub fn describe() {
    workpump_claim_worker::metrics::describe();
    workpump_lease_renewal::metrics::describe();
    workpump_heartbeat_worker::metrics::describe();
    workpump_maintenance::metrics::describe();
    describe_counter!(
        WORKER_RESTARTS,
        Unit::Count,
        "worker restarts by supervision"
    );
    describe_gauge!(
        "workpump_host_up",
        Unit::Count,
        "1 while a host runs in this process"
    );
}
