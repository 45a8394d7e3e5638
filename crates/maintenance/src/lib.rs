//! workpump's backstop: [`MaintenanceWorker`] keeps the store tidy and moving when nobody
//! else does. Its one job is a periodic sweep (every 2 s) of SQL functions that each do one
//! bounded thing across every queue: `cleanup_stale_instances` (reap dead peers, release their
//! leases), `dead_letter_expired` (leases that lapsed under a live owner are released for the
//! next claim; orphans with no attempts left become dead letters; cancel-requested orphans end
//! cancelled), `promote_scheduled` (due delays and retries become
//! available, and their claimers are woken), `prune_finished` and `prune_evicted_instances`
//! (retention), `vacuum_work` (the work table, when its dead rows call for it), at most every
//! 15 s, `queue_depth` for the `workpump_queue_depth` gauge, and at
//! most every 60 s `ordering_repair` (ordering keys left without a head; must find none).
//!
//! It deliberately does not claim, renew, complete or cancel anything, and it is not the
//! primary path for any of this: `claim_work` promotes and ends orphans in the queues it
//! claims from, and `record_heartbeat` reaps stale peers when it sees one. The sweep covers
//! what they miss (a queue nobody polls right now, an instance that died holding an item's
//! last attempt, a fleet whose heartbeats are all slow) and is the only thing that deletes
//! old rows and that releases a lease which lapsed while its owner stayed registered (a
//! stalled process): claims do not look for those, so that a renewal stays a HOT update
//! (the SQL function `release_lapsed_leases`). A fleet where every instance disables
//! maintenance leaves such a lease with its owner until the owner is reaped. The operator calls (`cancel_work`, `retry_dead_work`, `discard_work`) live on the
//! coordinator, not here. Arrows: coordinator ← maintenance ← host; it depends on
//! `workpump-coordinator` only.
//!
//! # Safe on every instance at once
//!
//! There is no leader. Every statement takes its rows `FOR UPDATE SKIP LOCKED`, so sweeps
//! running at the same time on several instances (and claimers) split the rows between them:
//! each row is promoted, ended or deleted exactly once, and nobody waits on anybody. Every
//! statement has a `LIMIT` (`batch_limit`, 1 000), so none holds many row locks or runs long;
//! a kind of statement is repeated while it comes back full, at most `max_batches_per_sweep`
//! (10) times per sweep, and what is left waits for the next sweep. All cutoffs are computed
//! by the database from its own `now()`; the worker only passes durations.
//!
//! # A sweep
//!
//! The first sweep runs when `run` starts, then one every `interval_ms`, start to start
//! (tokio `interval`, [`MissedTickBehavior::Delay`](tokio::time::MissedTickBehavior): an
//! overrun delays the next sweep instead of bunching them). Steps run in this order, and a
//! failed step (an error, or no answer within `call_timeout_ms`) is logged and counted while
//! the remaining steps still run; [`MaintenanceWorker::run_once`] returns a [`SweepReport`],
//! or a [`SweepError`] that carries the report and the failed steps.
//!
//! With `skip_idle_steps` (the default) a sweep first asks `maintenance_due` — one cheap
//! statement of index probes — which steps have work, and runs only those: every instance
//! sweeps every few seconds, and an idle sweep then costs one round trip instead of five.
//! When a sweep finds a lock-proven peer without its lock whose grace has not passed yet, the
//! worker sweeps again right after the grace instead of waiting for the next interval, so a
//! crashed peer's work is released about `lock_grace` after a sweep first saw it gone.
//!
//! 1. `cleanup_stale_instances(judge, stale_after, dead_after, lock_grace)` with the cutoffs
//!    of the [`Liveness`](workpump_coordinator::Liveness) the worker was built with: the
//!    backstop for the heartbeat's opportunistic sweep, and what makes failover fast: a
//!    lock-relying instance whose alive-lock stays gone past `lock_grace` is reaped here
//!    (alive-lock guard and definitive-dead bypass included). The worker sweeps as its host's
//!    instance ([`MaintenanceWorker::with_judge`]): that instance is never reaped by its own
//!    sweep, and the sweep judges only on what it could see while its sessions stayed
//!    connected (the SQL function `cleanup_stale_instances`), so a restarted or failed-over server,
//!    or an outage, evicts nobody;
//! 2. `dead_letter_expired`: after 1, so leases it released are seen at once. It first
//!    releases leases that lapsed under a still-registered owner (counted in
//!    `workpump_maintenance_lapsed_leases_total{queue}` and logged as a warning: in a healthy
//!    fleet there are none), waking their claimers, then ends the orphans that must not run
//!    again;
//! 3. `promote_scheduled`, which NOTIFYs each queue it made work available in;
//! 4. `prune_finished(completed_retention_ms, dead_retention_ms)`: deletes finished items
//!    one by one (completed ones that no partition covered, dead letters and cancelled
//!    items), then rotates the completed items' history, which is partitioned by finish time
//!    (docs/store.md, "Retention of completed items"): drops each partition whose window
//!    ended a retention ago, whole, and attaches the next ones ahead (counted in
//!    `workpump_maintenance_history_partitions_total{action}`);
//! 5. `prune_evicted_instances(evicted_retention_ms)`;
//! 6. `vacuum_work`, when `maintenance_due` says the work table is due a vacuum (or, without
//!    the probe, every sweep, the store deciding): its dead row versions passed autovacuum's
//!    own threshold for it, no vacuum of it runs, and the role may vacuum it (its owner's,
//!    the database owner's or a superuser's privileges; `MAINTAIN` on PostgreSQL 17+). Then
//!    `VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON)` of the table, counted in
//!    `workpump_maintenance_work_vacuums_total`. Every claim scans the claim index past the
//!    rows claimed since the last vacuum, and autovacuum looks once a minute: without this,
//!    small claims over a deep backlog slow down as it drains (docs/store.md, "Vacuuming the
//!    work table"). A store without the call (`Error::Unsupported`) is skipped;
//! 7. `server_status` and `queue_depth`, when the last sample is at least
//!    `depth_sample_interval_ms` old. The server's NOTIFY queue usage goes to the gauge
//!    `workpump_notification_queue_usage_ratio` and [`MaintenanceStatus`] (a warning is
//!    logged from [`NOTIFICATION_QUEUE_WARN`], 50 %). A count of the depth costs as much as
//!    the available, scheduled and running items it counts (about 4 ms per 10 000 on
//!    PostgreSQL 15; see the SQL function `queue_depth`), so the fleet counts in turns: a
//!    sample reads the fleet's last count while it is younger than half the interval, and
//!    counts (and stores the count) only otherwise. So a fleet counts at most twice an
//!    interval whatever its size, and a published value is at most 1.5 intervals old; 0
//!    turns sampling off. A (queue, state) that disappears from the result is set back to 0;
//! 8. `ordering_repair`, when the last check is at least `ordering_repair_interval_ms` old:
//!    ordering keys with blocked items but no head get their next item, counted in
//!    `workpump_ordering_repairs_total` and logged as a warning. It must find none (every
//!    transition that ends a head promotes the next in its own transaction; docs/ordering.md).
//!    The check reads every blocked item, so the fleet takes it in turns: a call checks only
//!    when no check within half the interval, a peer's included, found every headless key.
//!    A store without the call (`Error::Unsupported`) is skipped.
//!
//! # Settings (`[maintenance]`, [`MaintenanceConfig`])
//!
//! | setting | default | meaning |
//! | --- | --- | --- |
//! | `enabled` | `true` | the killswitch |
//! | `interval_ms` | 2 000 | sweep start to sweep start |
//! | `completed_retention_ms` | 86 400 000 (24 h) | completed items are deleted after this, and at most one partition window later (an eighth of it or less: 1 h for 24 h) |
//! | `dead_retention_ms` | 604 800 000 (7 days) | dead letters and cancelled items are deleted after this |
//! | `evicted_retention_ms` | 604 800 000 (7 days) | eviction tombstones are deleted after this; at least `liveness.dead_after_ms` |
//! | `batch_limit` | 1 000 | rows per statement |
//! | `max_batches_per_sweep` | 10 | statements of one kind per sweep |
//! | `depth_sample_interval_ms` | 15 000 | shortest time between queue-depth samples; 0 = off |
//! | `ordering_repair_interval_ms` | 60 000 | shortest time between ordering-key repair checks; 0 = off |
//! | `call_timeout_ms` | 30 000 | a store call is abandoned after this |
//! | `vacuum_work` | `true` | vacuum the work table when its dead rows pass autovacuum's threshold for it (step 6); `false` leaves it to autovacuum |
//! | `skip_idle_steps` | `true` | probe first (`maintenance_due`) and run only the steps with work |
//!
//! The cutoffs the sweep judges by are not `[maintenance]` settings: they are the host's
//! `[liveness]` section (`stale_after_ms`, `dead_after_ms`, `lock_grace_ms`; 30 s, 5 min,
//! 3 s), one [`Liveness`](workpump_coordinator::Liveness) that the heartbeat's beats declare
//! too, handed to [`MaintenanceWorker::new`].
//!
//! # Metrics
//!
//! See [`metrics`]: sweeps by result, failed steps, sweep duration, instances reaped and
//! leases released, items promoted / dead-lettered / cancelled per queue, items pruned per
//! state, tombstones pruned, vacuums of the work table, the `workpump_queue_depth{queue,state}`
//! gauge and the server's NOTIFY queue usage.

mod worker;

pub mod metrics;

#[cfg(test)]
mod tests;

pub use worker::{
    MaintenanceConfig, MaintenanceStatus, MaintenanceWorker, Step, StepFailure, SweepError,
    SweepReport, DEFAULT_BATCH_LIMIT, DEFAULT_CALL_TIMEOUT_MS, DEFAULT_COMPLETED_RETENTION_MS,
    DEFAULT_DEAD_RETENTION_MS, DEFAULT_DEPTH_SAMPLE_INTERVAL_MS, DEFAULT_EVICTED_RETENTION_MS,
    DEFAULT_INTERVAL_MS, DEFAULT_MAX_BATCHES_PER_SWEEP, DEFAULT_ORDERING_REPAIR_INTERVAL_MS,
    MAX_BATCHES_PER_SWEEP, MAX_INTERVAL_MS, MAX_RETENTION_MS, NAME, NOTIFICATION_QUEUE_WARN,
};
