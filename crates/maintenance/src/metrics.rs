//! The maintenance metrics, named in their final Prometheus form. Label values come from small
//! closed sets (queue names, item states, step names), never an item or instance id. The host
//! calls [`describe`] right after installing its exporter.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// Sweeps by result; label [`RESULT`]: [`OK`] or [`FAILED`] (at least one step failed; the
/// other steps of that sweep still ran).
pub const SWEEPS_TOTAL: &str = "workpump_maintenance_sweeps_total";

/// Failed steps; label [`STEP`]: the SQL function that failed or did not answer in time
/// (`cleanup_stale_instances`, `dead_letter_expired`, `promote_scheduled`, `prune_finished`,
/// `prune_evicted_instances`, `queue_depth`).
pub const STEP_FAILURES_TOTAL: &str = "workpump_maintenance_step_failures_total";

/// How long one store call of a sweep took, in seconds, until its answer or until it was
/// abandoned; label [`STEP`]: the SQL function (`maintenance_due`, `cleanup_stale_instances`,
/// `dead_letter_expired`, `promote_scheduled`, `prune_finished`, `prune_evicted_instances`,
/// `server_status`, `queue_depth`). A step run in batches records each batch.
pub const STEP_DURATION_SECONDS: &str = "workpump_maintenance_step_duration_seconds";

/// How long one sweep took, in seconds, all its steps and batches included.
pub const SWEEP_DURATION_SECONDS: &str = "workpump_maintenance_sweep_duration_seconds";

/// Stale instances this worker's sweeps reaped (deleted and tombstoned).
pub const REAPED_INSTANCES_TOTAL: &str = "workpump_maintenance_reaped_instances_total";

/// Leases those reaped instances held, released at once for peers to reclaim.
pub const RELEASED_LEASES_TOTAL: &str = "workpump_maintenance_released_leases_total";

/// Leases that lapsed while their owner was still registered (a stalled process, renewals
/// that never arrived), released for peers to reclaim; label [`QUEUE`]. Stays 0 in a healthy
/// fleet.
pub const LAPSED_LEASES_TOTAL: &str = "workpump_maintenance_lapsed_leases_total";

/// Due scheduled items (delays and retries) made available; label [`QUEUE`].
pub const PROMOTED_ITEMS_TOTAL: &str = "workpump_maintenance_promoted_items_total";

/// Orphans with no attempts left made dead letters; label [`QUEUE`].
pub const DEAD_LETTERED_ITEMS_TOTAL: &str = "workpump_maintenance_dead_lettered_items_total";

/// Orphans whose cancel was requested, ended cancelled; label [`QUEUE`].
pub const CANCELLED_ITEMS_TOTAL: &str = "workpump_maintenance_cancelled_items_total";

/// Finished items deleted past their retention; label [`STATE`]: `completed`, `dead` or
/// `cancelled`.
pub const PRUNED_ITEMS_TOTAL: &str = "workpump_maintenance_pruned_items_total";

/// The completed items' history rotated by partition (docs/store.md, "Retention of completed
/// items"); label [`ACTION`]: `created` (a partition attached ahead of now), `dropped` (one
/// dropped whole, its window past the retention: its items are not counted in
/// [`PRUNED_ITEMS_TOTAL`]) or `busy` (a rotation that did not get a lock in time and goes on
/// at the next sweep; a steady rise means something holds the history for long).
pub const HISTORY_PARTITIONS_TOTAL: &str = "workpump_maintenance_history_partitions_total";

/// Label of [`HISTORY_PARTITIONS_TOTAL`]: `created`, `dropped` or `busy`.
pub const ACTION: &str = "action";

/// `VACUUM`s of the work table the sweep ran (`vacuum_work`: its dead rows passed
/// autovacuum's threshold for it, and the role may vacuum it; docs/store.md, "Vacuuming the
/// work table"). One that found the table held by another vacuum, and skipped it, counts too.
pub const WORK_VACUUMS_TOTAL: &str = "workpump_maintenance_work_vacuums_total";

/// Eviction tombstones deleted past their retention.
pub const PRUNED_TOMBSTONES_TOTAL: &str = "workpump_maintenance_pruned_tombstones_total";

/// Ordering keys found with blocked items but no head, and given their next item
/// (`ordering_repair`). **Must stay 0**: every transition that ends a key's head promotes the
/// next in its own transaction; a repair means a write outside the store's functions, or a
/// head ended in a REPEATABLE READ transaction (docs/ordering.md).
pub const ORDERING_REPAIRS_TOTAL: &str = "workpump_ordering_repairs_total";

/// Items per queue and state as last sampled; labels [`QUEUE`] and [`STATE`] (`available`,
/// `scheduled`, `running`, `blocked`). Every instance samples the same store, so aggregate with `max`
/// (not `sum`) across instances.
pub const QUEUE_DEPTH: &str = "workpump_queue_depth";

/// Per queue, as last sampled: how long the oldest due item that waits to be claimed
/// (available, or scheduled and not yet promoted) has waited since it became due, in seconds,
/// on the database clock; 0 when none waits. Label [`QUEUE`]. The store-wide view of pickup
/// lag: it grows while nobody claims (every instance down, a queue paused, all slots busy),
/// when no claim is there to record `workpump_pickup_lag_seconds`. Aggregate with `max`.
pub const QUEUE_PICKUP_LAG_SECONDS: &str = "workpump_queue_pickup_lag_seconds";

/// The server's NOTIFY queue usage, 0 to 1, as last sampled (`pg_notification_queue_usage()`).
/// One LISTEN session anywhere on the server that stops reading pins the queue; at 1 every
/// transaction that notifies — every enqueue — fails at commit. Alert from 0.5 (PostgreSQL's
/// own log warning starts there). Server-wide: aggregate with `max`.
pub const NOTIFICATION_QUEUE_USAGE: &str = "workpump_notification_queue_usage_ratio";

/// The label of [`SWEEPS_TOTAL`].
pub const RESULT: &str = "result";
/// [`RESULT`]: every step succeeded.
pub const OK: &str = "ok";
/// [`RESULT`]: at least one step failed.
pub const FAILED: &str = "failed";
/// The label of [`STEP_FAILURES_TOTAL`]: the step's SQL function.
pub const STEP: &str = "step";
/// The queue label.
pub const QUEUE: &str = "queue";
/// The item-state label.
pub const STATE: &str = "state";

/// Describes every metric of this crate to the installed recorder.
pub fn describe() {
    describe_counter!(
        SWEEPS_TOTAL,
        Unit::Count,
        "Maintenance sweeps by result (ok, failed)"
    );
    describe_counter!(
        STEP_FAILURES_TOTAL,
        Unit::Count,
        "Maintenance steps that failed or timed out, by step"
    );
    describe_histogram!(
        STEP_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of one maintenance store call, by step"
    );
    describe_histogram!(
        SWEEP_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of one maintenance sweep"
    );
    describe_counter!(
        ORDERING_REPAIRS_TOTAL,
        Unit::Count,
        "Ordering keys found without a head and repaired (must stay 0)"
    );
    describe_counter!(
        REAPED_INSTANCES_TOTAL,
        Unit::Count,
        "Stale instances reaped by the maintenance backstop"
    );
    describe_counter!(
        RELEASED_LEASES_TOTAL,
        Unit::Count,
        "Leases of reaped instances released by the maintenance backstop"
    );
    describe_counter!(
        PROMOTED_ITEMS_TOTAL,
        Unit::Count,
        "Due scheduled items made available, by queue"
    );
    describe_counter!(
        LAPSED_LEASES_TOTAL,
        Unit::Count,
        "Leases that lapsed while their owner was still registered, released for peers to reclaim, by queue"
    );
    describe_counter!(
        DEAD_LETTERED_ITEMS_TOTAL,
        Unit::Count,
        "Expired leases with no attempts left made dead letters, by queue"
    );
    describe_counter!(
        CANCELLED_ITEMS_TOTAL,
        Unit::Count,
        "Expired leases of cancel-requested items ended cancelled, by queue"
    );
    describe_counter!(
        PRUNED_ITEMS_TOTAL,
        Unit::Count,
        "Finished items deleted past their retention, by state"
    );
    describe_counter!(
        HISTORY_PARTITIONS_TOTAL,
        Unit::Count,
        "Partitions of the completed items' history created ahead, dropped past the retention, or busy (a lock not had in time)"
    );
    describe_counter!(
        WORK_VACUUMS_TOTAL,
        Unit::Count,
        "VACUUMs of the work table run by the maintenance sweep (its dead rows past autovacuum's threshold for it)"
    );
    describe_counter!(
        PRUNED_TOMBSTONES_TOTAL,
        Unit::Count,
        "Eviction tombstones deleted past their retention"
    );
    describe_gauge!(
        NOTIFICATION_QUEUE_USAGE,
        "Share of the server's NOTIFY queue in use (0 to 1), as last sampled; enqueues fail at 1"
    );
    describe_gauge!(
        QUEUE_PICKUP_LAG_SECONDS,
        Unit::Seconds,
        "Age of the oldest due item waiting to be claimed, by queue, as last sampled; 0 when none waits"
    );
    describe_gauge!(
        QUEUE_DEPTH,
        Unit::Count,
        "Work items per queue and state (available, scheduled, running), as last sampled"
    );
}
