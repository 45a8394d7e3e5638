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
//! heartbeat of whichever instance sees a peer that may be dead, and by the maintenance
//! backstop). The rule (the SQL function `cleanup_stale_instances`, `docs/store.md`): an instance is
//! judged dead only on evidence its judge gathered while the judge could itself see the
//! server without interruption, so a server restart, a crash, a failover or an outage is never
//! evidence that a client died. Within that:
//!
//! - **The alive-lock is the primary signal.** In the default liveness mode
//!   (`"advisory_lock_when_available"`) the worker opens a connection of its own, outside the
//!   shared pool, and takes the instance's advisory lock on it. While the process lives the
//!   session lives and PostgreSQL shows the lock in `pg_locks`; when the process dies its
//!   connection closes and the lock goes with it. A row whose lock is held is never reaped as
//!   merely stale (the alive-lock guard). Each beat names the session (`AliveLockReport`):
//!   the store credits only that session, never another holder of the key (a former,
//!   half-open connection of the same process).
//! - **The heartbeat row is the fallback.** Each beat sets `last_heartbeat_at = now()` (the
//!   database clock) and stores the cutoffs this instance is judged by (the host's one
//!   [`Liveness`](workpump_coordinator::Liveness), `[liveness]`: `stale_after_ms`,
//!   `dead_after_ms`, `lock_grace_ms`; a peer's sweep cannot shorten them). A row older than
//!   the stale cutoff whose lock is not held is reaped: the row is deleted and all its leases
//!   are released at once, so peers reclaim the work without waiting for the leases to
//!   expire.
//! - **Failover in seconds.** A process that dies on the database's network loses its
//!   connections, and with them its lock, at once. An instance that relies on its lock is
//!   dead once a sweep has seen the lock gone for longer than `lock_grace_ms`; its leases are
//!   released and the claimers of its queues woken.
//! - **A lost lock is answered at once.** This worker waits on its lock session; when that
//!   connection closes under a live process it beats at once, saying it holds no lock (from
//!   then on peers judge it by that fresh beat, not by the lock), and takes the lock again:
//!   quickly (100 ms, doubling to 1 s) for the length of the grace, then at every beat. The
//!   grace covers a blip at any heartbeat age, also when the last beat is older than the
//!   stale cutoff (as it often is at the slow cadence).
//! - **The definitive-dead bypass.** A row older than `dead_after_ms` is reaped even with its
//!   lock held: a process killed behind a half-open TCP connection can leave its session (and
//!   lock) on the server until keepalive notices, hours later by default.
//! - **Registration.** This worker is the only part of a host that beats: its first recorded
//!   beat of an id registers the instance (`Identity::mark_registered`), and the claim
//!   worker claims only once the current id is registered. With the killswitch off the
//!   instance is never registered and claims nothing.
//! - **Eviction.** A heartbeat for an instance that was reaped does not bring it back: the
//!   store answers `evicted` (after this process's first recorded beat of an id, a missing row
//!   can only mean that, tombstone or not). The worker then calls `Identity::evicted` (a
//!   fresh id; every subscriber treats the old id's leases as lost and cancels its handlers),
//!   drops the old id's lock session, counts and logs it, and beats again at once under the
//!   fresh id, which registers it and takes its lock.
//!
//! # Cadence
//!
//! The first beat happens when `run` starts. After a recorded beat the worker waits
//! `slow_interval_ms` while its session holds the alive-lock, and `fast_interval_ms`
//! otherwise: not taken yet, held by another session (a former connection the server has not
//! closed), the session lost, or the liveness mode `"heartbeat_table_only"` (which never takes
//! the lock). A failed beat is retried after 100 ms, doubling up to 1 s (or the fast interval,
//! if shorter): the first beat after a store outage lands within about a second of the store
//! coming back, which is what peers whose watch restarted with the store need. The lock is
//! re-checked on its session at every beat and, while it is held, every `fast_interval_ms`
//! between the slow beats (a session the server closed during a network outage shows only
//! when it is used); when the session is gone (a killed connection, a restarted server) the
//! worker beats at once and opens a new one. Every store call of a beat (the heartbeat, the
//! lock check, opening a session) is abandoned after `fast_interval_ms`, so a hung call cannot
//! stall the timer: the beat counts as failed, or the lock as not held.
//!
//! With the lock held, the slow cadence (60 s) is longer than the stale cutoff (30 s) **by
//! design**: between two beats the row looks stale to peers, and their sweeps keep it only
//! because the lock is held. That is why `liveness.dead_after_ms` must exceed twice
//! `slow_interval_ms` (else the definitive-dead bypass would reap a live lock holder), and why
//! `liveness.stale_after_ms` must be at least twice `fast_interval_ms` (an instance without the lock
//! must not look stale between two of its beats; the anchor that set the interval equal to
//! the cutoff declared live instances dead).
//!
//! # Settings (`[heartbeat]`, [`HeartbeatConfig`])
//!
//! | setting | default | meaning |
//! | --- | --- | --- |
//! | `enabled` | `true` | killswitch: `false` = no heartbeats, no lock, no registration (so no claims); peers see the instance stale and release its leases (a drain) |
//! | `fast_interval_ms` | `10000` | wait while the lock is not held and in table-only mode; the lock check's period while it is held; the cap of a failed beat's retry (with 1 s); also each call's timeout |
//! | `slow_interval_ms` | `60000` | wait while the lock is held; at least `fast_interval_ms` |
//! | `liveness` | `"advisory_lock_when_available"` | or `"heartbeat_table_only"`: no lock, always fast |
//!
//! The cutoffs the beats declare are the host's `[liveness]` section
//! ([`Liveness`](workpump_coordinator::Liveness), passed to [`HeartbeatWorker::new`]):
//!
//! | setting | default | meaning |
//! | --- | --- | --- |
//! | `liveness.stale_after_ms` | `30000` | stale cutoff passed to `record_heartbeat`; at least 2 × `fast_interval_ms` |
//! | `liveness.dead_after_ms` | `300000` | definitive-dead cutoff; above `stale_after_ms` and (with the lock) above 2 × `slow_interval_ms`; `"none"` disables the bypass |
//! | `liveness.lock_grace_ms` | `3000` | a lock-proven peer whose lock stays gone this long is dead (failover in seconds); `"none"` disables the rule |
//!
//! Every interval is positive and at most 24 h; every cutoff lies between the store's floor
//! and 24 h (`Liveness::validate`). [`HeartbeatConfig::validate`] checks the intervals and
//! the rules that tie them to the cutoffs, naming every refused setting; `run` refuses to
//! start with an invalid config or cutoffs.
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
//! # use workpump_coordinator::{Identity, Liveness, PgCoordinator, Worker};
//! # use workpump_heartbeat_worker::{HeartbeatConfig, HeartbeatWorker};
//! # async fn example(coordinator: PgCoordinator) {
//! let identity = Identity::new();
//! let worker = HeartbeatWorker::new(
//!     Arc::new(coordinator),
//!     identity.clone(),
//!     HeartbeatConfig::default(),
//!     Liveness::default(),
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
    AliveLock, BeatOutcome, HeartbeatConfig, HeartbeatStatus, HeartbeatWorker, LiveMetadata,
    LivenessMode, DEFAULT_FAST_INTERVAL_MS, DEFAULT_SLOW_INTERVAL_MS, LIVENESS_SECTION,
    MAX_SETTING_MS, NAME,
};

use std::time::Duration;

use workpump_coordinator::InstanceId;

/// Why a beat did not record the heartbeat. Each one is logged and counted by `run`, and the
/// next beat follows at the fast cadence.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `record_heartbeat` failed: the store said no or could not be reached.
    /// The message names the beat once: a store error that already says "recording the
    /// heartbeat of instance …" (the PostgreSQL store's do) is not prefixed again.
    #[error("{}", heartbeat_message(*instance, source))]
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

/// "recording the heartbeat of instance …: <source>", unless the source already says so.
fn heartbeat_message(instance: InstanceId, source: &workpump_coordinator::Error) -> String {
    let what = format!("recording the heartbeat of instance {instance}");
    let source = source.to_string();
    if source.starts_with(&what) {
        source
    } else {
        format!("{what}: {source}")
    }
}
