//! The scheduler's metrics, named in their final Prometheus form. The `schedule` label is a
//! periodic job's name: a small set declared in code or configuration, never an item id. The
//! host calls [`describe`] right after installing its exporter.

use metrics::{describe_counter, describe_histogram, Unit};

/// Fire times this instance asked for, by result; labels [`SCHEDULE`] and [`RESULT`]:
/// [`ENQUEUED`] (this instance claimed it and enqueued the item, a misfire run once
/// included) or [`ALREADY_FIRED`] (a peer had). Summed across instances, `enqueued` is the
/// number of items the schedule produced: one per fire time.
pub const FIRES_TOTAL: &str = "workpump_periodic_fires_total";

/// Times this instance found missed fire times of a schedule (however many at once) and
/// applied its misfire policy; labels [`SCHEDULE`] and [`POLICY`] (`skip`, `run_once`).
pub const MISFIRES_TOTAL: &str = "workpump_periodic_misfires_total";

/// Store calls of the scheduler (`fire_periodic`) that failed or timed out; label
/// [`SCHEDULE`]. Retried after `scheduler.retry_ms`.
pub const CALL_FAILURES_TOTAL: &str = "workpump_periodic_call_failures_total";

/// How late an enqueued fire time was, in seconds: the database's now when it was claimed
/// minus the fire time. Label [`SCHEDULE`]. Milliseconds when on time; up to a period for a
/// misfire run once.
pub const FIRE_LAG_SECONDS: &str = "workpump_periodic_fire_lag_seconds";

/// The periodic job's name.
pub const SCHEDULE: &str = "schedule";
/// The label of [`FIRES_TOTAL`].
pub const RESULT: &str = "result";
/// [`RESULT`]: this instance enqueued the fire time.
pub const ENQUEUED: &str = "enqueued";
/// [`RESULT`]: a peer had already claimed the fire time.
pub const ALREADY_FIRED: &str = "already_fired";
/// The label of [`MISFIRES_TOTAL`]: the misfire policy applied.
pub const POLICY: &str = "policy";

/// Describes every metric of this crate to the installed recorder.
pub fn describe() {
    describe_counter!(
        FIRES_TOTAL,
        Unit::Count,
        "Periodic fire times this instance asked for, by schedule and result (enqueued, already_fired)"
    );
    describe_counter!(
        MISFIRES_TOTAL,
        Unit::Count,
        "Times missed fire times were found, by schedule and misfire policy (skip, run_once)"
    );
    describe_counter!(
        CALL_FAILURES_TOTAL,
        Unit::Count,
        "Scheduler store calls (fire_periodic) that failed or timed out, by schedule"
    );
    describe_histogram!(
        FIRE_LAG_SECONDS,
        Unit::Seconds,
        "Delay from a periodic fire time to its enqueue, on the database clock, by schedule"
    );
}
