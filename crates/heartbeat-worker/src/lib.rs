//! workpump's heartbeat: [`HeartbeatWorker`] proves that this instance is alive. Its one job
//! is to call the SQL function `record_heartbeat` on its own timer (independent of claim
//! polling) and to hold the instance's session-level advisory alive-lock on a dedicated
//! connection (`take_alive_lock`), choosing its cadence from whether that lock is held. It
//! deliberately does not claim, renew leases or cancel handlers: when the store says the
//! instance was reaped it mints a fresh id through [`Identity`](workpump_coordinator::Identity)
//! and the subscribers (host, claim worker) cancel the old id's work. It does not sweep on a
//! timer of its own either (that backstop is the maintenance worker's); it only passes the
//! cutoffs to the sweep inside `record_heartbeat`. Arrows: coordinator ← heartbeat-worker ←
//! host; it depends on `workpump-coordinator` only.
//!
//! # The liveness model
//!
//! A peer decides whether this instance is alive in `cleanup_stale_instances` (run by the
//! heartbeat of whichever instance sees a stale peer, and by the maintenance backstop):
//!
//! - **The alive-lock is the primary signal.** In the default liveness mode
//!   (`"advisory_lock_when_available"`) the worker opens a connection of its own, outside the
//!   shared pool, and takes the instance's advisory lock on it. While the process lives the
//!   session lives and PostgreSQL shows the lock in `pg_locks`; when the process dies its
//!   connection closes and the lock goes with it. A row whose lock is held is never reaped as
//!   merely stale (the alive-lock guard).
//! - **The heartbeat row is the fallback.** Each beat sets `last_heartbeat_at = now()` (the
//!   database clock). A row older than `stale_after_ms` whose lock is not held is reaped: the
//!   row is deleted and all its leases are released at once, so peers reclaim the work
//!   without waiting for the leases to expire.
//! - **Failover in seconds.** A process that dies on the database's network loses its
//!   connections, and with them its lock, at once. An instance that has held its lock
//!   (lock-proven) is dead once a sweep has seen the lock gone for longer than
//!   `lock_grace_ms`; its leases are released and the claimers of its queues woken. This
//!   worker waits on its lock session, so when that connection closes under a live process it
//!   takes the lock again at once (retrying quickly for the length of the grace). An instance
//!   that cannot hold its lock says so in each heartbeat and is judged by staleness alone.
//!   After a server restart, instances registered before it get `stale_after_ms` to come back.
//! - **The definitive-dead bypass.** A row older than `dead_after_ms` is reaped even with its
//!   lock held: a process killed behind a half-open TCP connection can leave its session (and
//!   lock) on the server until keepalive notices, hours later by default.
//! - **Eviction.** A heartbeat for an instance that was reaped does not bring it back: the
//!   store answers `evicted`. The worker then calls `Identity::evicted` (a fresh id; every
//!   subscriber treats the old id's leases as lost and cancels its handlers), drops the old
//!   id's lock session, counts and logs it, and beats again at once under the fresh id, which
//!   registers it and takes its lock.
//!
//! # Cadence
//!
//! The first beat happens when `run` starts. After a recorded beat the worker waits
//! `slow_interval_ms` while its session holds the alive-lock, and `fast_interval_ms`
//! otherwise: not taken yet, held by another session (a former connection the server has not
//! closed), the session lost, or the liveness mode `"heartbeat_table_only"` (which never takes
//! the lock). After a failed beat it always waits `fast_interval_ms`. The lock is re-checked
//! on its session every beat; when the session is gone (a killed connection, a restarted
//! server) it is dropped and a new one is opened in the same beat. Every store call of a beat
//! (the heartbeat, the lock check, opening a session) is abandoned after `fast_interval_ms`,
//! so a hung call cannot stall the timer: the beat counts as failed, or the lock as not held.
//!
//! With the lock held, the slow cadence (60 s) is longer than the stale cutoff (30 s) **by
//! design**: between two beats the row looks stale to peers, and their sweeps keep it only
//! because the lock is held. That is why `dead_after_ms` must exceed twice
//! `slow_interval_ms` (else the definitive-dead bypass would reap a live lock holder), and why
//! `stale_after_ms` must be at least twice `fast_interval_ms` (an instance without the lock
//! must not look stale between two of its beats; the anchor that set the interval equal to
//! the cutoff declared live instances dead). The worker notices its lock session
//! closing without waiting for a beat and takes the lock again within the lock grace, so a
//! peer's sweep does not reap it for a blip.
//!
//! # Settings (`[heartbeat]`, [`HeartbeatConfig`])
//!
//! | setting | default | meaning |
//! | --- | --- | --- |
//! | `enabled` | `true` | killswitch: `false` = no heartbeats, no lock; peers see the instance stale and release its leases (a drain) |
//! | `fast_interval_ms` | `10000` | wait while the lock is not held, in table-only mode and after a failure; also each call's timeout |
//! | `slow_interval_ms` | `60000` | wait while the lock is held; at least `fast_interval_ms` |
//! | `liveness` | `"advisory_lock_when_available"` | or `"heartbeat_table_only"`: no lock, always fast |
//! | `stale_after_ms` | `30000` | stale cutoff passed to `record_heartbeat`; at least 2 × `fast_interval_ms` |
//! | `dead_after_ms` | `300000` | definitive-dead cutoff; above `stale_after_ms` and (with the lock) above 2 × `slow_interval_ms`; `"none"` disables the bypass |
//! | `lock_grace_ms` | `3000` | a lock-proven peer whose lock stays gone this long is dead (failover in seconds); `"none"` disables the rule |
//!
//! Every interval and cutoff is positive and at most 24 h. [`HeartbeatConfig::validate`]
//! names every refused setting; `run` refuses to start with an invalid config.
//!
//! # Observing it
//!
//! [`HeartbeatWorker::status`] and [`HeartbeatWorker::subscribe_status`] give the last
//! recorded beat (tokio `Instant`), whether the lock is held, the current instance, the
//! consecutive failures, the evictions seen and the current cadence. The metrics are in
//! [`metrics`]; the host calls [`metrics::describe`].
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use workpump_coordinator::{Identity, PgCoordinator, Worker};
//! # use workpump_heartbeat_worker::{HeartbeatConfig, HeartbeatWorker};
//! # async fn example(coordinator: PgCoordinator) {
//! let identity = Identity::new();
//! let worker = HeartbeatWorker::new(
//!     Arc::new(coordinator),
//!     identity.clone(),
//!     HeartbeatConfig::default(),
//!     "web-1".to_owned(),
//!     serde_json::json!({ "region": "eu-1" }),
//! );
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! worker.run(shutdown).await.expect("a valid config");
//! # }
//! ```

mod heartbeat;
pub mod metrics;

#[cfg(test)]
mod tests;

pub use heartbeat::{
    AliveLock, BeatOutcome, HeartbeatConfig, HeartbeatStatus, HeartbeatWorker, LivenessMode,
    DEFAULT_DEAD_AFTER_MS, DEFAULT_FAST_INTERVAL_MS, DEFAULT_LOCK_GRACE_MS,
    DEFAULT_SLOW_INTERVAL_MS, DEFAULT_STALE_AFTER_MS, MAX_SETTING_MS, NAME,
};

use std::time::Duration;

use workpump_coordinator::InstanceId;

/// Why a beat did not record the heartbeat. Each one is logged and counted by `run`, and the
/// next beat follows at the fast cadence.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `record_heartbeat` failed: the store said no or could not be reached.
    #[error("recording the heartbeat of instance {instance}: {source}")]
    Heartbeat {
        /// The instance the beat was for.
        instance: InstanceId,
        /// The coordinator's error.
        #[source]
        source: workpump_coordinator::Error,
    },
    /// `record_heartbeat` did not answer in time and was abandoned.
    #[error(
        "recording the heartbeat of instance {instance}: no answer within {after:?}; abandoned"
    )]
    TimedOut {
        /// The instance the beat was for.
        instance: InstanceId,
        /// The timeout (the fast interval).
        after: Duration,
    },
    /// The fresh id minted after an eviction was itself reported reaped at once. Another
    /// fresh id was minted; the next beat registers it.
    #[error("instance {instance}, registered right after an eviction, was reported evicted too")]
    EvictedAgain {
        /// The fresh id that was reported evicted.
        instance: InstanceId,
    },
}

impl Error {
    /// The instance the failed beat was for.
    pub fn instance(&self) -> InstanceId {
        match self {
            Error::Heartbeat { instance, .. }
            | Error::TimedOut { instance, .. }
            | Error::EvictedAgain { instance } => *instance,
        }
    }
}

/// This crate's `Result`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
