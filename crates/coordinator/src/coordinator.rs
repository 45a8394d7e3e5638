//! The seam between the workers and the store.

use async_trait::async_trait;

use crate::error::Result;
use crate::periodic::{FirePeriodicOutcome, FirePeriodicParams};
use crate::types::*;

/// Everything the workers and the host that runs them ask of the store, and nothing else:
/// the operator's calls are [`crate::Operations`]. Method names are the SQL function names;
/// each takes one params struct and returns one outcome struct. Object-safe: workers hold an
/// `Arc<dyn WorkCoordinator>`, so the PostgreSQL implementation ([`crate::PgCoordinator`]) and
/// the in-memory fake (`FakeCoordinator`, feature `testing`) are interchangeable; the
/// conformance suite holds them to the same behaviour.
///
/// **You may implement it** (a decorator that adds tracing or injects faults, another
/// store): the conformance suite (`conformance_suite!`, feature `testing`) is the contract.
/// A method added to this trait after its release comes with a default body that returns
/// [`crate::Error::Unsupported`], and the worker that calls it treats that answer as "this
/// store cannot", so a new SQL function does not break an existing implementation; changing
/// an existing method is a breaking change of the crate.
///
/// Every timestamp is the store's clock; a caller never passes one it computed, only
/// durations (and business times for scheduling).
#[async_trait]
pub trait WorkCoordinator: Send + Sync + 'static {
    /// Declares a queue or updates its settings. Idempotent.
    async fn register_queue(&self, params: RegisterQueueParams) -> Result<RegisterQueueOutcome>;

    /// Enqueues a batch in one statement, all or nothing. Unknown queue, invalid payload or
    /// oversized batch: an error naming the problem and nothing written. When it returns,
    /// the batch is committed and the claimers of its queues with work due have been sent
    /// a wake (the PostgreSQL store sends it right after the commit, in a round trip of its
    /// own: docs/store.md, "Wake signals").
    async fn enqueue_work(&self, params: EnqueueWorkParams) -> Result<EnqueueWorkOutcome>;

    /// Leases runnable and orphaned items; see the SQL function
    /// `claim_work`. A queue nobody registered is refused
    /// ([`crate::Error::UnknownQueue`]); an unregistered or evicted instance too
    /// ([`crate::Error::NotRegistered`]).
    async fn claim_work(&self, params: ClaimWorkParams) -> Result<ClaimWorkOutcome>;

    /// Extends a batch of leases fenced to the caller; see the SQL function
    /// `renew_leases`. One answer per distinct lease; an instance that was reaped
    /// gets [`RenewalStatus::Evicted`] for every lease.
    async fn renew_leases(&self, params: RenewLeasesParams) -> Result<RenewLeasesOutcome>;

    /// Records success (fenced). One answer per distinct claim, in the order of its first
    /// occurrence.
    async fn complete_work(&self, params: CompleteWorkParams) -> Result<CompleteWorkOutcome>;

    /// Records failed attempts and where each item goes next (fenced); a cancel-requested item
    /// ends cancelled. One answer per distinct claim, its first failure applied.
    async fn fail_work(&self, params: FailWorkParams) -> Result<FailWorkOutcome>;

    /// Gives leases back before they expire (fenced); a cancel-requested item ends cancelled.
    /// One answer per distinct claim.
    async fn release_work(&self, params: ReleaseWorkParams) -> Result<ReleaseWorkOutcome>;

    /// Saves a checkpoint (fenced); [`crate::Error::FencedOut`] when the claim lost the item.
    async fn checkpoint_work(&self, params: CheckpointWorkParams) -> Result<CheckpointWorkOutcome>;

    /// Refreshes the instance's heartbeat (and what it knows of its alive-lock) and, when a
    /// peer may be dead, sweeps with the instance as the judge; see the SQL function `record_heartbeat`.
    async fn record_heartbeat(
        &self,
        params: RecordHeartbeatParams,
    ) -> Result<RecordHeartbeatOutcome>;

    /// Deletes dead instances by the liveness rule of the SQL function `cleanup_stale_instances` (judged only on what
    /// the judge saw while connected; the judge is never reaped) and releases their leases.
    async fn cleanup_stale_instances(
        &self,
        params: CleanupStaleInstancesParams,
    ) -> Result<CleanupStaleInstancesOutcome>;

    /// Deletes the instance's row and releases any lease it still holds (end of a drain).
    async fn deregister_instance(
        &self,
        params: DeregisterInstanceParams,
    ) -> Result<DeregisterInstanceOutcome>;

    /// Promotes due scheduled items (delays and retries whose time came) to available in
    /// every queue, at most `limit`, and wakes their claimers; see
    /// the SQL function `promote_scheduled`.
    async fn promote_scheduled(
        &self,
        params: PromoteScheduledParams,
    ) -> Result<PromoteScheduledOutcome>;

    /// Ends orphans that must not run again, in every queue, at most `limit`: attempts used up
    /// → dead letter, cancel requested → cancelled; see the SQL function `dead_letter_expired`.
    async fn dead_letter_expired(
        &self,
        params: DeadLetterExpiredParams,
    ) -> Result<DeadLetterExpiredOutcome>;

    /// Deletes finished items past their retention, at most `limit`; see
    /// the SQL function `prune_finished`.
    async fn prune_finished(&self, params: PruneFinishedParams) -> Result<PruneFinishedOutcome>;

    /// Deletes eviction tombstones past their retention, at most `limit`; see
    /// the SQL function `prune_evicted_instances`.
    async fn prune_evicted_instances(
        &self,
        params: PruneEvictedInstancesParams,
    ) -> Result<PruneEvictedInstancesOutcome>;

    /// Which maintenance steps have work right now, in one cheap statement (an idle sweep
    /// costs one round trip).
    async fn maintenance_due(&self, params: MaintenanceDueParams) -> Result<MaintenanceDueOutcome>;

    /// Counts available, scheduled and running items per queue (for metrics); see
    /// the SQL function `queue_depth` for its cost.
    async fn queue_depth(&self, params: QueueDepthParams) -> Result<QueueDepthOutcome>;

    /// Reads the state of the server that workpump depends on (the NOTIFY queue's usage);
    /// see the SQL function `server_status`.
    async fn server_status(&self, params: ServerStatusParams) -> Result<ServerStatusOutcome>;

    /// Opens a dedicated session (not from the shared pool) and takes the instance's
    /// alive-lock on it.
    async fn take_alive_lock(&self, params: TakeAliveLockParams) -> Result<TakeAliveLockOutcome>;

    /// Opens a listener for wake signals on a dedicated connection.
    async fn listen(&self, params: ListenParams) -> Result<Box<dyn WakeListener>>;

    /// Claims one fire time of a periodic job for the whole fleet and enqueues its item in
    /// the same transaction, or reads the schedule's state; see the SQL function
    /// `fire_periodic` and [`FirePeriodicParams`]. A fire time is claimed at most once,
    /// only once the store's clock reached it and before it reached the next one, and only
    /// when it is later than the schedule's last fire time; the item is enqueued exactly as
    /// given. The scheduler worker is its only caller.
    ///
    /// Added after the trait's first methods: the default body answers
    /// [`crate::Error::Unsupported`], and the scheduler then schedules nothing.
    async fn fire_periodic(&self, params: FirePeriodicParams) -> Result<FirePeriodicOutcome> {
        let _ = params;
        Err(crate::Error::Unsupported {
            method: "fire_periodic",
        })
    }

    /// Finds ordering keys that have blocked items but no head and promotes each one's next
    /// item; see the SQL function `ordering_repair` and docs/ordering.md. Every transition
    /// that ends a head promotes the next in its own transaction, so this must find nothing;
    /// the maintenance worker counts what it repairs.
    ///
    /// Added after the trait's first methods: the default body answers
    /// [`crate::Error::Unsupported`], and the maintenance worker then skips the check.
    async fn ordering_repair(&self, params: OrderingRepairParams) -> Result<OrderingRepairOutcome> {
        let _ = params;
        Err(crate::Error::Unsupported {
            method: "ordering_repair",
        })
    }

    /// Vacuums the work table when the SQL function `work_vacuum_due` says it is due: its
    /// dead row versions passed autovacuum's threshold for it, no vacuum of it runs, and this
    /// role may vacuum it. Every claim scans the claim index past the entries of the rows
    /// claimed since the table's last vacuum, so claims slow down between vacuums; the
    /// maintenance sweep calls this every few seconds where autovacuum looks once a minute
    /// (docs/store.md, "Vacuuming the work table").
    ///
    /// Added after the trait's first methods: the default body answers
    /// [`crate::Error::Unsupported`], and the maintenance worker then leaves the table to
    /// autovacuum.
    async fn vacuum_work(&self, params: VacuumWorkParams) -> Result<VacuumWorkOutcome> {
        let _ = params;
        Err(crate::Error::Unsupported {
            method: "vacuum_work",
        })
    }
}

/// A dedicated session that holds an instance's alive-lock. Dropping it ends the session,
/// which releases the lock.
#[async_trait]
pub trait AliveLockSession: Send + Sync {
    /// Takes the lock if this session does not hold it yet, and says whether it holds it now.
    /// An error means the session is gone (the lock with it): drop it and open a new one.
    async fn retake(&mut self) -> Result<bool>;

    /// Resolves when the session is gone (its connection closed or broke), without polling
    /// the server: the owner re-takes the lock at once, well within the lock grace. Cancel-safe.
    async fn lost(&mut self);

    /// The server process id of the session, when there is one (for diagnostics and tests).
    fn session_id(&self) -> Option<i32>;
}

/// A listener for wake signals. The first event after opening is
/// [`ListenEvent::Connected`]; after [`ListenEvent::Disconnected`] the next call reconnects
/// (an error means it could not, and the caller retries later).
#[async_trait]
pub trait WakeListener: Send {
    /// Waits for the next event.
    async fn next_event(&mut self) -> Result<ListenEvent>;
}
