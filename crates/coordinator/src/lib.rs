//! The seam between workpump's workers and its store.
//!
//! This crate owns the [`WorkCoordinator`] trait — one method per SQL function in `sql/` that
//! the workers or the host running them call (`claim_work`, `renew_leases`,
//! `record_heartbeat`, `cleanup_stale_instances`, the fenced outcomes `complete_work` /
//! `fail_work` / `release_work` / `checkpoint_work`, `register_queue`, `enqueue_work`, the
//! maintenance steps, the alive-lock helpers, `fire_periodic` for periodic jobs) — beside it the [`Operations`] trait, the
//! operator's calls (`list_work`, `get_work`, `queue_overview`, `list_instances`,
//! `cancel_work`, `retry_dead_work`, `discard_work`, `bulk_work`, `bulk_work_matching`,
//! `pause_queue`, `resume_queue`, `set_queue_settings`, `is_instance_alive`),
//! with their types and errors, the PostgreSQL implementation [`PgCoordinator`] of both and
//! [`migrate`], which applies the embedded migrations.
//! [`PgCoordinator::connect_lazy`] reads database URLs as libpq does ([`DatabaseUrl`]: a
//! host list and `target_session_attrs`), and its pools and dedicated sessions follow the
//! server that satisfies them through a failover (`docs/store.md`, "Database failover").
//! With the `testing` feature it also has an in-memory `FakeCoordinator` with the same
//! semantics, the conformance suite that holds both to them, and `testing::fresh_store`, the
//! one fresh-database fixture of the workspace's PostgreSQL tests.
//!
//! It does not schedule anything: the workers (claim-worker, heartbeat-worker,
//! lease-renewal, maintenance) decide when to call it, and the host wires them. Arrows:
//! coordinator ← workers ← host. No `sqlx` type crosses the trait.
//!
//! Which traits you may implement:
//!
//! - [`WorkCoordinator`]: yes. The conformance suite is the contract; a method added to the
//!   trait later gets a default body answering [`Error::Unsupported`], so a new SQL function
//!   does not break your implementation.
//! - [`Operations`]: no, it is sealed. It grows with store-specific calls, and sealing lets
//!   each one land without breaking anyone. Both stores of this crate implement it.
//! - [`Worker`], [`AliveLockSession`], [`WakeListener`]: yes; they are small and stable.
//!
//! It also holds the [`Worker`] contract that every worker implements and the one set of
//! liveness cutoffs ([`Liveness`]) the heartbeat and maintenance workers are built from,
//! because every worker crate depends on this one and on no other.
//!
//! Two rules hold for every call: the store's clock is the only clock (callers pass
//! durations, never timestamps they computed), and every write on a leased item is fenced on
//! the owning instance and the claim token minted by the claim.

mod condition;
mod coordinator;
pub mod duration_ms;
mod error;
mod identity;
mod job;
mod lease;
mod liveness;
mod operations;
mod ops_types;
mod periodic;
mod pg;
mod types;
mod validate;
mod worker;

#[cfg(feature = "testing")]
pub mod conformance;
#[cfg(feature = "testing")]
mod fake;
#[cfg(feature = "testing")]
mod recorded_metrics;
#[cfg(feature = "testing")]
pub mod testing;

pub use condition::{Condition, HealthReporter};
pub use coordinator::{AliveLockSession, WakeListener, WorkCoordinator};
pub use error::{Error, LockHolder, Result};
#[cfg(feature = "testing")]
pub use fake::{Call, FakeCoordinator, Method};
pub use identity::{Generation, Identity};
pub use job::{IntoWork, JobArgs};
pub use lease::{
    CancelReason, LeaseSettings, LeaseTracker, TrackedLease, DEFAULT_LEASE, DEFAULT_MAX_DURATION,
};
pub use liveness::{
    Liveness, DEFAULT_DEAD_AFTER, DEFAULT_LOCK_GRACE, DEFAULT_STALE_AFTER, MAX_LIVENESS_CUTOFF,
    STORE_FLOOR,
};
pub use operations::Operations;
pub use ops_types::*;
pub use periodic::{
    FirePeriodicOutcome, FirePeriodicParams, FireResult, PeriodicFire,
    MAX_PERIODIC_FINGERPRINT_CHARS, MAX_PERIODIC_NAME_CHARS,
};
pub use pg::{
    grants_sql, migrate, migrate_with, migration_status, DatabaseUrl, FencedTransaction,
    MigrateOptions, MigrationState, MigrationStatus, PendingWake, PgCoordinator,
    TargetSessionAttrs, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MIGRATE_LOCK_TIMEOUT, DEFAULT_SCHEMA,
};
#[cfg(feature = "testing")]
pub use recorded_metrics::RecordedMetrics;
pub use types::*;
pub use validate::{
    validate_kind, validate_ordering_key, validate_queue_name, validate_schema_name,
};
pub use worker::{ConfigProblem, Worker, WorkerError};

/// Attempts an item gets unless its queue or the item says otherwise.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 10;
/// The most items one `enqueue_work` call takes.
pub const MAX_ENQUEUE_BATCH: usize = 50_000;
/// The most items one `claim_work` call returns.
pub const MAX_CLAIM_BATCH: u32 = 10_000;
/// The largest payload, as JSON text.
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// The deepest nesting of arrays and objects in a payload (serde_json's own parse limit, so
/// every accepted payload can be read back: its recursion limit of 128 refuses a 128th
/// level).
pub const MAX_PAYLOAD_DEPTH: usize = 127;
/// The longest unique key, in bytes.
pub const MAX_UNIQUE_KEY_BYTES: usize = 512;
/// The longest job kind, in characters.
pub const MAX_KIND_CHARS: usize = 128;

/// The longest ordering key, in characters ([`NewWork::ordering_key`]).
pub const MAX_ORDERING_KEY_CHARS: usize = 128;
/// The longest lease (and renewal extension) accepted.
pub const MAX_LEASE: std::time::Duration = std::time::Duration::from_secs(24 * 60 * 60);
/// The furthest into the future an item may be scheduled (by delay or by time).
pub const MAX_SCHEDULE_AHEAD: std::time::Duration =
    std::time::Duration::from_secs(100 * 366 * 24 * 60 * 60);
