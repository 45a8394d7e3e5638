//! The coordinator's errors: each variant is an outcome a caller can act on.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::types::{InstanceId, WorkId, WorkState};

/// What went wrong in a coordinator call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The write belonged to a claim that no longer holds the item (it was reclaimed,
    /// released or finished): nothing changed. The caller must stop working on the item.
    #[error("work item {id} is fenced out: this claim no longer holds its lease")]
    FencedOut {
        /// The item whose write was refused.
        id: WorkId,
    },

    /// The queue was never registered (`register_queue`): an enqueue to it or a claim from it
    /// is refused, and nothing was written.
    #[error("unknown queue {0:?}: it was never registered (register_queue); nothing was written")]
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

    /// [`migrate`](crate::migrate) waited its lock timeout for the schema's migration lock and
    /// another session still holds it (a migrator that hangs, or any role that may connect and
    /// took the same advisory lock); nothing was migrated. `holder` names that session, when it
    /// still held the lock as the error was built.
    #[error(
        "migrating schema {schema:?}: gave up after waiting {waited:?} for the migration lock, \
         held by {}; nothing was migrated",
        holder_text(.holder)
    )]
    MigrationLocked {
        /// The schema being migrated.
        schema: String,
        /// How long `migrate` waited (its lock timeout).
        waited: Duration,
        /// The session holding the lock (boxed: it is rare, and large).
        holder: Option<Box<LockHolder>>,
    },

    /// The store does not implement this call: the default body of a [`WorkCoordinator`]
    /// method added after the trait's release, in an implementation written before it. The
    /// caller skips what needed the call; nothing changed.
    ///
    /// [`WorkCoordinator`]: crate::WorkCoordinator
    #[error("{method} is not supported by this store; nothing changed")]
    Unsupported {
        /// The method's name (the SQL function's).
        method: &'static str,
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
        matches!(self, Error::Database { .. } | Error::MigrationLocked { .. })
    }
}

/// A session that holds a lock, as `pg_stat_activity` shows it. A field the connected role may
/// not see (another role's session without `pg_read_all_stats`) is `None`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockHolder {
    /// The server process id (`pg_terminate_backend(pid)` ends the session).
    pub pid: i32,
    /// The role it connected as.
    pub user: Option<String>,
    /// Its `application_name`.
    pub application_name: Option<String>,
    /// Its client address (`None` for a Unix socket, or when hidden).
    pub client_addr: Option<String>,
    /// When it connected.
    pub connected_since: Option<DateTime<Utc>>,
    /// What it is doing (`idle`, `active`, `idle in transaction`, ...).
    pub state: Option<String>,
    /// Since when it is in that state.
    pub state_since: Option<DateTime<Utc>>,
}

impl fmt::Display for LockHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let or_unknown = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".to_owned());
        let at =
            |t: &Option<DateTime<Utc>>| t.map_or_else(|| "unknown".to_owned(), |t| t.to_rfc3339());
        write!(
            f,
            "the session with pid {} (user {}, application_name {:?}, client {}, connected since {}, {} since {})",
            self.pid,
            or_unknown(&self.user),
            self.application_name.as_deref().unwrap_or(""),
            self.client_addr.as_deref().unwrap_or("local socket or hidden"),
            at(&self.connected_since),
            or_unknown(&self.state),
            at(&self.state_since),
        )
    }
}

fn holder_text(holder: &Option<Box<LockHolder>>) -> String {
    match holder {
        Some(h) => h.to_string(),
        None => "a session that released it before it could be named".to_owned(),
    }
}

/// The coordinator's `Result`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
