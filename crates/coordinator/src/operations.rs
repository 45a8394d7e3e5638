//! The operator's surface: what a person (or a CLI, a dashboard) asks of the store, beside
//! the workers' seam.

use async_trait::async_trait;

use crate::error::Result;
use crate::ops_types::*;
use crate::types::*;

/// What an operator asks of the store: list and read items, the queues' overview and the
/// instances; cancel, retry or discard items, one or many at a time; pause and resume queues. Nothing here is called by a worker; the workers' seam is
/// [`crate::WorkCoordinator`]. Method names are the SQL function names; each takes one params
/// struct and returns one outcome struct. Object-safe: hold an `Arc<dyn Operations>`.
///
/// **Sealed**: implemented by [`crate::PgCoordinator`] and the in-memory `FakeCoordinator`
/// (feature `testing`) only, and held to the same behaviour by the conformance suite. It
/// grows (an item's kind and ordering key in the filter, more settings) and every call it
/// gains is store-specific SQL; sealing it lets each of those land as a new method without
/// breaking anyone, where an implementable trait would break every outside implementation or
/// answer "unsupported" to its callers.
///
/// Made for a command line and a dashboard: reads are bounded (a page of at most
/// [`MAX_PAGE_SIZE`] items examining at most [`LIST_SCAN_BUDGET`] rows; an overview whose
/// finished counts say when they are bounds or estimates), every outcome serializes to JSON,
/// and bulk writes act on at most [`MAX_BULK_BATCH`] items per call, each in one short
/// transaction, answering per item. `docs/store.md` ("The operator's calls") has the costs. Call it; wrap a
/// `PgCoordinator` to add behaviour around it.
#[async_trait]
pub trait Operations: sealed::Sealed + Send + Sync + 'static {
    /// An operator cancels an item: available or scheduled → cancelled now; running → cancel
    /// requested (delivered in the next renewal reply). A finished item is refused with
    /// [`crate::Error::InvalidState`], an unknown id with [`crate::Error::NotFound`].
    async fn cancel_work(&self, params: CancelWorkParams) -> Result<CancelWorkOutcome>;

    /// An operator retries a dead letter: available again, attempts reset to 0, error history
    /// kept. Any other state is refused with [`crate::Error::InvalidState`], an unknown id
    /// with [`crate::Error::NotFound`].
    async fn retry_dead_work(&self, params: RetryDeadWorkParams) -> Result<RetryDeadWorkOutcome>;

    /// An operator deletes a finished item (completed, dead or cancelled). An unfinished item
    /// is refused with [`crate::Error::InvalidState`], an unknown id with
    /// [`crate::Error::NotFound`].
    async fn discard_work(&self, params: DiscardWorkParams) -> Result<DiscardWorkOutcome>;

    /// Whether some session holds the instance's alive-lock.
    async fn is_instance_alive(
        &self,
        params: IsInstanceAliveParams,
    ) -> Result<IsInstanceAliveOutcome>;

    /// One page of work items matching a filter, newest first, with the cursor of the next
    /// page. A page examines at most [`LIST_SCAN_BUDGET`] rows: a selective filter may come
    /// back short with [`ListWorkOutcome::scan_exhausted`] and a cursor to go on with. A
    /// malformed cursor, a page size outside 1..=[`MAX_PAGE_SIZE`] or a bad filter is
    /// [`crate::Error::InvalidArgument`].
    async fn list_work(&self, params: ListWorkParams) -> Result<ListWorkOutcome>;

    /// One whole item: payload, checkpoint, history, lease. An unknown id is
    /// [`crate::Error::NotFound`].
    async fn get_work(&self, params: GetWorkParams) -> Result<GetWorkOutcome>;

    /// Every queue: counts by state, pickup lag, rates over the last hour, settings. Finished
    /// counts and rates above [`OVERVIEW_SAMPLE`] items are bounds and estimates, and say so.
    async fn queue_overview(&self, params: QueueOverviewParams) -> Result<QueueOverviewOutcome>;

    /// Every registered instance: host, metadata, heartbeat age, alive-lock, leases.
    async fn list_instances(&self, params: ListInstancesParams) -> Result<ListInstancesOutcome>;

    /// Pauses a queue: claims hand out none of its items (running ones finish). An unknown
    /// queue is [`crate::Error::UnknownQueue`].
    async fn pause_queue(&self, params: PauseQueueParams) -> Result<PauseQueueOutcome>;

    /// Resumes a paused queue and wakes its claimers. An unknown queue is
    /// [`crate::Error::UnknownQueue`].
    async fn resume_queue(&self, params: ResumeQueueParams) -> Result<ResumeQueueOutcome>;

    /// An action on up to [`MAX_BULK_BATCH`] items named by id, in one short transaction; per
    /// id, what happened or why it was refused. Each item is changed whole or not at all.
    async fn bulk_work(&self, params: BulkWorkParams) -> Result<BulkWorkOutcome>;

    /// An action on at most `limit` items the filter matches, in one short transaction, and
    /// whether more were left. An empty filter without `all` is
    /// [`crate::Error::InvalidArgument`], and nothing changes.
    async fn bulk_work_matching(
        &self,
        params: BulkWorkMatchingParams,
    ) -> Result<BulkWorkMatchingOutcome>;

    /// The ordering keys held by a dead head, with how many items wait behind each; see the
    /// SQL function `list_held_keys` and docs/ordering.md.
    async fn list_held_keys(&self, params: ListHeldKeysParams) -> Result<ListHeldKeysOutcome>;

    /// Changes a queue's settings whoever owns them, or hands them to another service (see
    /// `register_queue`: a queue's settings have one owner). An unknown queue is
    /// [`crate::Error::UnknownQueue`].
    async fn set_queue_settings(
        &self,
        params: SetQueueSettingsParams,
    ) -> Result<SetQueueSettingsOutcome>;

    /// [`bulk_work_matching`](Self::bulk_work_matching) in batches until no matching item is
    /// left (each batch its own transaction: a failure midway leaves the batches before it
    /// applied, and says how far it got in its error's context).
    async fn bulk_work_matching_all(&self, params: BulkWorkMatchingParams) -> Result<BulkTotals> {
        params.validate()?;
        let mut totals = BulkTotals::default();
        loop {
            let batch = match self.bulk_work_matching(params.clone()).await {
                Ok(batch) => batch,
                Err(crate::Error::Database { context, source }) => {
                    return Err(crate::Error::Database {
                        context: format!(
                            "{context} (after {} batches: {} applied, {} refused)",
                            totals.batches, totals.applied, totals.refused
                        ),
                        source,
                    })
                }
                Err(e) => return Err(e),
            };
            totals.batches += 1;
            for item in &batch.items {
                if item.result.applied() {
                    totals.applied += 1;
                } else {
                    totals.refused += 1;
                }
            }
            if !batch.has_more || batch.items.is_empty() {
                return Ok(totals);
            }
        }
    }
}

/// The private supertrait that seals [`Operations`]: only this crate can name it.
pub(crate) mod sealed {
    /// Implemented by this crate's stores only.
    #[allow(unreachable_pub)]
    pub trait Sealed {}

    impl Sealed for crate::PgCoordinator {}
    #[cfg(feature = "testing")]
    impl Sealed for crate::FakeCoordinator {}
}
