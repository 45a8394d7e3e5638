//! The heartbeat metrics, named in their final Prometheus form. Label values come from small
//! closed sets (a beat's result), never an instance id. The host calls [`describe`] right
//! after installing its exporter.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// Heartbeats by result; label [`RESULT`]: [`OK`], [`FAILED`] (the call failed or was
/// abandoned), [`EVICTED`] (the store had reaped the instance; a beat under a fresh id
/// follows at once and is counted on its own).
pub const HEARTBEATS_TOTAL: &str = "workpump_heartbeats_total";

/// 1 while this instance's alive-lock is held by its dedicated session, else 0 (also 0 in
/// heartbeat-table-only mode, with the killswitch off, and after the worker stopped).
pub const ALIVE_LOCK_HELD: &str = "workpump_heartbeat_alive_lock_held";

/// Times the alive-lock went from not held to held: the first take, and every re-take after
/// a lost session, a contended lock or an eviction.
pub const ALIVE_LOCK_ACQUISITIONS_TOTAL: &str = "workpump_heartbeat_alive_lock_acquisitions_total";

/// Alive-lock sessions that failed: a check on a session that turned out to be gone, a
/// session that could not be opened, or a call abandoned after the timeout.
pub const ALIVE_LOCK_ERRORS_TOTAL: &str = "workpump_heartbeat_alive_lock_errors_total";

/// Times `record_heartbeat` answered that this instance had been reaped (a fresh id was
/// minted and registered).
pub const EVICTIONS_TOTAL: &str = "workpump_heartbeat_evictions_total";

/// Stale peers that this instance's heartbeats reaped (the opportunistic sweep inside
/// `record_heartbeat`).
pub const REAPED_INSTANCES_TOTAL: &str = "workpump_heartbeat_reaped_instances_total";

/// Leases of reaped peers that those sweeps released.
pub const RELEASED_LEASES_TOTAL: &str = "workpump_heartbeat_released_leases_total";

/// How long a `record_heartbeat` call took until its answer, or until it was abandoned after
/// the call timeout, in seconds.
pub const CALL_DURATION_SECONDS: &str = "workpump_heartbeat_call_duration_seconds";

/// The wait before the next heartbeat, in seconds (the fast or the slow interval).
pub const CADENCE_SECONDS: &str = "workpump_heartbeat_cadence_seconds";

/// The label of [`HEARTBEATS_TOTAL`].
pub const RESULT: &str = "result";
/// [`RESULT`]: the heartbeat was recorded.
pub const OK: &str = "ok";
/// [`RESULT`]: the call failed or did not answer in time.
pub const FAILED: &str = "failed";
/// [`RESULT`]: the instance had been reaped.
pub const EVICTED: &str = "evicted";

/// Describes every metric of this crate to the installed recorder.
pub fn describe() {
    describe_counter!(
        HEARTBEATS_TOTAL,
        Unit::Count,
        "Heartbeats by result (ok, failed, evicted)"
    );
    describe_gauge!(
        ALIVE_LOCK_HELD,
        Unit::Count,
        "1 while the instance's alive-lock is held by its dedicated session, else 0"
    );
    describe_counter!(
        ALIVE_LOCK_ACQUISITIONS_TOTAL,
        Unit::Count,
        "Times the alive-lock went from not held to held"
    );
    describe_counter!(
        ALIVE_LOCK_ERRORS_TOTAL,
        Unit::Count,
        "Alive-lock sessions found gone, not opened, or abandoned after the timeout"
    );
    describe_counter!(
        EVICTIONS_TOTAL,
        Unit::Count,
        "Heartbeats that found the instance reaped; a fresh instance id was registered"
    );
    describe_counter!(
        REAPED_INSTANCES_TOTAL,
        Unit::Count,
        "Stale peers reaped by the sweep inside record_heartbeat"
    );
    describe_counter!(
        RELEASED_LEASES_TOTAL,
        Unit::Count,
        "Leases of reaped peers released by the sweep inside record_heartbeat"
    );
    describe_histogram!(
        CALL_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of a record_heartbeat call until its answer or its abandonment"
    );
    describe_gauge!(
        CADENCE_SECONDS,
        Unit::Seconds,
        "The wait before the next heartbeat (fast or slow interval)"
    );
}
