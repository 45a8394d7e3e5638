//! workpump's periodic jobs: [`SchedulerWorker`] enqueues one item per fire time of each
//! [`PeriodicJob`] — a cron expression in a time zone, or a fixed interval — across the whole
//! fleet, with no leader. Its one job is to wait for fire times and call the SQL function
//! `fire_periodic`, which claims a fire time with a compare-and-set on the schedule's row
//! (`periodic_schedules.last_fire_at < fire_at`) and enqueues the item in the same
//! transaction: every instance may ask, exactly one item is enqueued per fire time.
//!
//! It deliberately does not run the items (the claim worker does, like any other item), does
//! not catch up on every missed fire time (see [`Misfire`]), and keeps no leader or lock.
//! Arrows: coordinator ← scheduler ← host; it depends on `workpump-coordinator` only.
//!
//! # Fire times and the clock
//!
//! Every instance computes the same fire times from a job's definition: a cron expression's
//! times in its time zone (the `croner` crate; DST rules in [`PeriodicJob::time_zone`]), or
//! the multiples of an interval since the Unix epoch. Which fire time is due is decided by
//! the database's clock: the worker passes the fire time and the one after it, and
//! `fire_periodic` claims it only when `fire_at <= now() < next_fire_at`. The worker sleeps
//! on tokio's clock for the duration the database's now leaves until the next fire time (at
//! most `max_sleep_ms`, then it asks again).
//!
//! # Misfires
//!
//! A fire time the worker planned while it was still ahead is on time, however late the
//! worker wakes, as long as the next fire time has not come. Fire times that passed while no
//! worker of the fleet was waiting for them — every instance stopped, the database down, a
//! pause longer than the period — are *missed*: [`Misfire::Skip`] (the default) drops them and
//! goes on with the next future fire time; [`Misfire::RunOnce`] enqueues one item for the most
//! recent missed one, then goes on. A schedule seen for the first time, or under a changed
//! definition, has no missed fire times: it starts with its next one.
//!
//! # Changed definitions
//!
//! The definition's [`fingerprint`](PeriodicJob::fingerprint) is stored with each claim. A
//! new definition under the same name goes on after the last fire time, whoever claimed it;
//! fire times only move forward, so no instant is enqueued twice. During a rolling deploy,
//! instances running the old and the new definition both claim their own fire times: the
//! schedule fires at the union of both until the last old instance stops (docs/periodic.md).
//!
//! # Settings (`[scheduler]`, [`SchedulerConfig`])
//!
//! | setting | default | meaning |
//! | --- | --- | --- |
//! | `enabled` | `true` | the killswitch |
//! | `max_sleep_ms` | 60 000 | the longest sleep before asking the database's clock again |
//! | `retry_ms` | 1 000 | wait after a failed store call |
//! | `call_timeout_ms` | 10 000 | a store call is abandoned (rolled back) after this |
//!
//! # Metrics
//!
//! See [`metrics`]: fire times by result, misfires by policy, failed calls, and how late each
//! enqueued fire time was.

mod config;
mod schedule;
mod worker;

pub mod metrics;

#[cfg(test)]
mod tests;

pub use config::PeriodicConfig;
pub use schedule::{fire_key, Misfire, PeriodicJob, ScheduleError, MAX_INTERVAL, MIN_INTERVAL};
pub use worker::{
    Plans, SchedulerConfig, SchedulerWorker, TickReport, DEFAULT_CALL_TIMEOUT_MS,
    DEFAULT_MAX_SLEEP_MS, DEFAULT_RETRY_MS, MAX_SETTING_MS, NAME,
};
