//! The operator's surface: what a person (or a CLI, a dashboard) asks of the store, beside
//! the workers' seam.

use async_trait::async_trait;

use crate::error::Result;
use crate::types::*;

/// What an operator asks of the store: cancel, retry or discard an item, see whether an
/// instance is alive. Nothing here is called by a worker; the workers' seam is
/// [`crate::WorkCoordinator`]. Method names are the SQL function names; each takes one params
/// struct and returns one outcome struct. Object-safe: hold an `Arc<dyn Operations>`.
///
/// **Sealed**: implemented by [`crate::PgCoordinator`] and the in-memory `FakeCoordinator`
/// (feature `testing`) only, and held to the same behaviour by the conformance suite. It is
/// meant to grow (listing and reading items, queue overviews, bulk actions, pausing queues)
/// and every call it gains is store-specific SQL; sealing it lets each of those land as a new
/// method without breaking anyone, where an implementable trait would break every outside
/// implementation or answer "unsupported" to its callers. Call it; wrap a
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
