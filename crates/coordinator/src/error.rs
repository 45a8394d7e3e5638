//! The coordinator's errors: each variant is an outcome a caller can act on.

use crate::types::{InstanceId, WorkId, WorkState};

/// What went wrong in a coordinator call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The write belonged to a claim that no longer holds the item (it was reclaimed,
    /// released or finished): nothing changed. The caller must stop working on the item.
    #[error("work item {id} is fenced out: this claim no longer holds its lease")]
    FencedOut {
        /// The item whose write was refused.
        id: WorkId,
    },

    /// The queue was never registered (`register_queue`); nothing was written.
    #[error("unknown queue {0:?}: register it before enqueueing to it")]
    UnknownQueue(String),

    /// An argument is out of its documented range; nothing was written. The message names it.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The instance has no live registration: it never recorded a heartbeat, or it was reaped
    /// as stale (evicted). An evicted instance must register afresh under a new id.
    #[error("instance {0} is not registered (record a heartbeat first; an evicted instance must register afresh)")]
    NotRegistered(InstanceId),

    /// No work item has this id (it never existed, or it was pruned or discarded).
    #[error("work item {id} not found")]
    NotFound {
        /// The id asked for.
        id: WorkId,
    },

    /// The item's state does not allow the operation (cancelling a finished item, retrying
    /// an item that is not a dead letter, discarding an unfinished one); nothing changed.
    #[error("work item {id} is {state}: {reason}")]
    InvalidState {
        /// The item.
        id: WorkId,
        /// The state it is in.
        state: WorkState,
        /// Why that state refuses the operation.
        reason: String,
    },

    /// The database said no, or could not be reached. `context` says what was being done.
    #[error("{context}: {source}")]
    Database {
        /// What the coordinator was doing, e.g. "renewing 37 leases".
        context: String,
        /// The driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl Error {
    /// Wraps a driver error with what was being done.
    pub fn database(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Error::Database {
            context: context.into(),
            source: source.into(),
        }
    }

    /// Whether retrying the same call later may succeed (the database was unreachable or
    /// said no for a passing reason). Fencing, unknown queues, invalid arguments, unknown
    /// items and invalid states are final.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Database { .. })
    }
}

/// The coordinator's `Result`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
