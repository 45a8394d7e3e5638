//! Lifecycle hooks: [`JobHooks`], called around every attempt this worker claims, with the
//! [`Attempt`] they are about and, at the end, its one [`Ending`] (docs/hooks.md).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use workpump_coordinator::{Fence, InstanceId, WorkId};

use crate::handler::JobResult;

/// Code run around every attempt a claim worker claims: registered with
/// [`Handlers::hooks`](crate::Handlers::hooks) (several allowed, called in registration
/// order), for every queue and kind of the worker. Every method has a no-op default.
///
/// For each claimed attempt the calls are: [`claimed`](Self::claimed) once; then, if every
/// claimed hook succeeded and the attempt may start, [`started`](Self::started); then exactly
/// one [`ended`](Self::ended), after the attempt's outcome was written (or is known not to
/// be). Hooks never change an outcome already recorded.
///
/// ```
/// use workpump_claim_worker::{Attempt, Ending, JobHooks, JobResult};
///
/// struct Audit;
///
/// #[async_trait::async_trait]
/// impl JobHooks for Audit {
///     async fn claimed(&self, attempt: &Attempt) -> JobResult {
///         println!("claimed {} (attempt {})", attempt.id(), attempt.attempt());
///         Ok(())
///     }
///     async fn ended(&self, attempt: &Attempt, ending: &Ending) {
///         println!("{} ended: {ending}", attempt.id());
///     }
/// }
/// ```
#[async_trait]
pub trait JobHooks: Send + Sync + 'static {
    /// The attempt was claimed. For an attempt that runs, this is called before the handler
    /// under the lease guard: its time counts toward `max_duration`, and lease loss, an
    /// operator's cancel or a limit interrupts it like a handler (a hook that blocks is
    /// dropped at its await point). An `Err` fails the attempt as the handler's error would
    /// (its [`Disposition`](crate::Disposition) applies), and so does a panic (a retried
    /// failure naming it); the handler then does not run, and later hooks' `claimed` is not
    /// called.
    ///
    /// For an attempt turned away before it starts (its lease expired on the way from the
    /// store, or was lost, or the instance was evicted or began draining), `claimed` is still
    /// called, bounded by the queue's lease grace and not under a lease (there is none left
    /// to guard it), its result ignored; `ended` follows.
    async fn claimed(&self, attempt: &Attempt) -> JobResult {
        let _ = attempt;
        Ok(())
    }

    /// The handler is about to run: every `claimed` hook succeeded. A panic here is logged
    /// and does not change the attempt.
    fn started(&self, attempt: &Attempt) {
        let _ = attempt;
    }

    /// The attempt's one ending, after its outcome was recorded (or is known unrecordable).
    /// Runs on the item's task before its handler slot is freed, bounded by the queue's lease
    /// grace: a hook still running then is dropped with a warning naming the attempt. A panic
    /// is logged. Nothing it does changes the outcome.
    async fn ended(&self, attempt: &Attempt, ending: &Ending) {
        let _ = (attempt, ending);
    }
}

/// The attempt a hook is called about. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Attempt {
    inner: Arc<AttemptInner>,
}

#[derive(Debug)]
struct AttemptInner {
    queue: String,
    kind: Option<String>,
    fence: Fence,
    instance: InstanceId,
    attempt: i32,
    max_attempts: i32,
}

impl Attempt {
    pub(crate) fn new(
        queue: &str,
        kind: Option<&str>,
        fence: Fence,
        instance: InstanceId,
        (attempt, max_attempts): (i32, i32),
    ) -> Self {
        Attempt {
            inner: Arc::new(AttemptInner {
                queue: queue.to_owned(),
                kind: kind.map(str::to_owned),
                fence,
                instance,
                attempt,
                max_attempts,
            }),
        }
    }

    /// The queue.
    pub fn queue(&self) -> &str {
        &self.inner.queue
    }

    /// The item's job kind (`None` for an untyped item).
    pub fn kind(&self) -> Option<&str> {
        self.inner.kind.as_deref()
    }

    /// The item's id.
    pub fn id(&self) -> WorkId {
        self.inner.fence.id
    }

    /// The item and this claim's token.
    pub fn fence(&self) -> Fence {
        self.inner.fence
    }

    /// The instance that claimed it.
    pub fn instance(&self) -> InstanceId {
        self.inner.instance
    }

    /// This attempt's number, 1 for the first.
    pub fn attempt(&self) -> i32 {
        self.inner.attempt
    }

    /// How many attempts the item may have.
    pub fn max_attempts(&self) -> i32 {
        self.inner.max_attempts
    }
}

/// How a claimed attempt ended, derived from what was recorded for it (the item's state
/// after the write), or from why nothing could be. More variants may come.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ending {
    /// The item is completed (by this worker's write, or in the handler's own fenced
    /// transaction).
    Completed,
    /// The attempt failed and the item will be retried (it is available or scheduled again).
    Failed {
        /// The error recorded in its history.
        error: String,
    },
    /// The item is a dead letter: attempts used up, or rejected for good.
    DeadLettered {
        /// The error recorded in its history.
        error: String,
    },
    /// The item ended cancelled (an operator's cancel, or the handler's own).
    Cancelled {
        /// The error recorded in its history.
        error: String,
    },
    /// The attempt could not be run or recorded by this worker; the store will hand the item
    /// out again (or already did).
    Unavailable(UnavailableReason),
    /// The drain handed the item back (its lease released, the attempt not counted).
    Released,
}

/// Why an attempt was [`Ending::Unavailable`]. More variants may come.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnavailableReason {
    /// The lease went away: a peer took the item, the lease expired (its fence passed and
    /// the handler did not stop), or the outcome's write was fenced out.
    LeaseLost,
    /// The claim's lease had already expired when the item reached the handler: never
    /// started, its lease released without counting the attempt.
    ExpiredBeforeStart,
    /// The instance was evicted (its peers judged it dead): every lease of it is lost.
    Evicted,
    /// The store refused the outcome's write: the item will be reclaimed when its lease
    /// expires.
    NotRecorded {
        /// The store's error.
        error: String,
    },
}

impl fmt::Display for Ending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ending::Completed => f.write_str("completed"),
            Ending::Failed { error } => write!(f, "failed (will be retried): {error}"),
            Ending::DeadLettered { error } => write!(f, "dead-lettered: {error}"),
            Ending::Cancelled { error } => write!(f, "cancelled: {error}"),
            Ending::Unavailable(reason) => write!(f, "unavailable: {reason}"),
            Ending::Released => f.write_str("released"),
        }
    }
}

impl fmt::Display for UnavailableReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnavailableReason::LeaseLost => f.write_str("lease lost"),
            UnavailableReason::ExpiredBeforeStart => f.write_str("lease expired before start"),
            UnavailableReason::Evicted => f.write_str("instance evicted"),
            UnavailableReason::NotRecorded { error } => {
                write!(f, "outcome not recorded: {error}")
            }
        }
    }
}

/// The hooks of one worker, in registration order.
pub(crate) type HookList = Arc<[Arc<dyn JobHooks>]>;
