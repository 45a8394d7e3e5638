//! What a case needs besides the coordinator: the [`Harness`] and the row it reads.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use crate::error::Result;
use crate::types::*;
use crate::{Operations, WorkCoordinator};

/// A work item as the store holds it, for assertions.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkRow {
    /// The id.
    pub id: WorkId,
    /// The queue.
    pub queue: String,
    /// The state.
    pub state: WorkState,
    /// The priority.
    pub priority: i16,
    /// Attempts started.
    pub attempt: i32,
    /// Attempt limit.
    pub max_attempts: i32,
    /// The lease owner.
    pub instance: Option<InstanceId>,
    /// Whether a lease expiry is set.
    pub has_lease: bool,
    /// The latest claim's token.
    pub claim_token: Option<ClaimToken>,
    /// Renewals of the current claim.
    pub renewals: i32,
    /// An operator asked to cancel.
    pub cancel_requested: bool,
    /// The payload.
    pub payload: Value,
    /// The saved checkpoint.
    pub checkpoint: Option<Value>,
    /// The error history, oldest first.
    pub errors: Vec<ErrorEntry>,
    /// The unique key.
    pub unique_key: Option<String>,
    /// The ordering key.
    pub ordering_key: Option<String>,
    /// Whether `finished_at` is set.
    pub finished: bool,
}

/// One entry of an item's error history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorEntry {
    /// The attempt that failed.
    pub attempt: i64,
    /// `failed`, `rejected`, `cancelled`, `lease_expired`, `released`, or `retried` (a note
    /// that an operator retried the dead letter).
    pub kind: String,
    /// The message.
    pub error: String,
    /// The instance that held the attempt, when known.
    pub instance: Option<String>,
}

impl ErrorEntry {
    /// Reads an entry of the `errors` JSON array.
    pub fn from_json(v: &Value) -> Self {
        ErrorEntry {
            attempt: v["attempt"].as_i64().unwrap_or(-1),
            kind: v["kind"].as_str().unwrap_or_default().to_owned(),
            error: v["error"].as_str().unwrap_or_default().to_owned(),
            instance: v["instance"].as_str().map(str::to_owned),
        }
    }
}

/// What a case needs besides the coordinator.
#[async_trait]
pub trait Harness: Send + Sync {
    /// The coordinator under test, on a fresh, migrated store.
    fn coordinator(&self) -> Arc<dyn WorkCoordinator>;
    /// The operator's calls on the same store. A [`WorkCoordinator`] implemented outside
    /// this crate (a decorator) returns those of the store it wraps: [`Operations`] is sealed.
    fn operations(&self) -> Arc<dyn Operations>;
    /// One work item as stored; `None` when it does not exist.
    async fn work_row(&self, id: WorkId) -> Option<WorkRow>;
    /// How many work items exist.
    async fn work_count(&self) -> usize;
    /// Sets a leased item's expiry to the store's now + `offset` (negative: in the past).
    async fn set_lease_expiry(&self, id: WorkId, offset: chrono::Duration);
    /// Sets an item's lease expiry to exactly the store's now, then sweeps
    /// (`dead_letter_expired`, which releases lapsed leases) and claims, at one instant.
    async fn sweep_and_claim_with_lease_expiring_now(
        &self,
        id: WorkId,
        params: ClaimWorkParams,
    ) -> Result<ClaimWorkOutcome>;
    /// Moves an instance's last heartbeat `by` into the past.
    async fn age_heartbeat(&self, instance: InstanceId, by: Duration);
    /// Moves the fleet's last look for lapsed leases that found none (`maintenance_due`'s
    /// turn) `by` into the past.
    async fn age_lapsed_look(&self, by: Duration);
    /// Moves the fleet's last complete check for headless ordering keys (`ordering_repair`'s
    /// turn) `by` into the past.
    async fn age_ordering_check(&self, by: Duration);
    /// Moves the fleet's last queue-depth sample (`queue_depth`'s turn) `by` into the past.
    async fn age_depth_sample(&self, by: Duration);
    /// Sets an item's cancel flag (an operator's cancel of a running item).
    async fn request_cancel(&self, id: WorkId);
    /// Whether the instance has a row.
    async fn instance_registered(&self, instance: InstanceId) -> bool;
    /// Ends the session that holds `instance`'s alive-lock, as a killed connection would.
    async fn kill_alive_lock_session(&self, instance: InstanceId);
    /// The instance's alive-lock key, where the store has one (PostgreSQL).
    async fn alive_lock_key(&self, instance: InstanceId) -> Option<i64>;
    /// Sets a waiting (scheduled or available) item's run_at to the store's now + `offset`
    /// (negative: due; an available item only ever gets a negative one).
    async fn set_run_at(&self, id: WorkId, offset: chrono::Duration);
    /// Moves a queue's rate bucket `by` into the past (`rate_refilled_at`), as if that much
    /// time had passed for its refill; a bucket never used (full) is left as it is.
    async fn age_rate_bucket(&self, queue: &str, by: Duration);
    /// Moves a finished item's finished_at `by` into the past.
    async fn age_finished(&self, id: WorkId, by: Duration);
    /// Deletes an item behind the store's back (no store function runs): what a stray
    /// manual write does, leaving its ordering key without a head.
    async fn delete_behind_the_stores_back(&self, id: WorkId);
    /// Makes the work table due a vacuum (`work_vacuum_due`) once it has a dead row version
    /// (a claimed item's): PostgreSQL's thresholds for the table lowered to none, with
    /// autovacuum of it off so that only the calls under test vacuum it, and back once the
    /// statistics show the dead row.
    async fn make_vacuum_due(&self);
    /// Moves the eviction tombstone of a reaped instance `by` into the past.
    async fn age_eviction(&self, instance: InstanceId, by: Duration);
    /// Moves the first observation of an instance's lost alive-lock `by` into the past.
    async fn age_lock_loss(&self, instance: InstanceId, by: Duration);
    /// Moves back `by` the moment `instance`'s alive-lock session took its lock
    /// (`lock_since`): as if that session, and so the instance's watch of the store, were
    /// older.
    async fn age_watch(&self, instance: InstanceId, by: Duration);
    /// Moves back `by` the last sighting of `instance`'s lock held by its own session
    /// (`lock_seen_at`), as if its last heartbeat were that much older.
    async fn age_lock_sighting(&self, instance: InstanceId, by: Duration);
    /// Ends every session of the store, as a PostgreSQL restart, crash or failover does: the
    /// alive-lock sessions, the listeners and every pooled connection.
    async fn restart(&self);
    /// Where [`judge`](super::judge) keeps the harness's seasoned judge.
    fn judge_slot(&self) -> &JudgeSlot;
}

/// The harness's judge: an instance that holds its alive-lock and has watched the store for
/// longer than any cutoff the cases use, so that its sweeps may apply every rule. Kept for
/// the harness's life (its lock session with it).
#[derive(Default)]
pub struct JudgeSlot(
    pub(super) tokio::sync::Mutex<Option<(InstanceId, Box<dyn crate::AliveLockSession>)>>,
);

impl std::fmt::Debug for JudgeSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JudgeSlot").finish_non_exhaustive()
    }
}
