//! The handler API: what users write.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use sqlx::PgConnection;
use tokio_util::sync::CancellationToken;

use crate::service::HandlerService;
use workpump_coordinator::{
    CancelReason, CheckpointWorkParams, Fence, FencedTransaction, InstanceId, PgCoordinator,
    TrackedLease, WorkCoordinator, WorkId,
};

/// What a handler returns: `Ok(())` for success, or a [`JobError`] that says what happens
/// next (retry with the queue's backoff, retry after a delay, dead letter, cancelled).
pub type JobResult = Result<(), JobError>;

/// A handler for one queue. The payload is deserialised into `Payload` before the handler
/// runs; a payload that doesn't match goes straight to the dead letters with the serde error.
///
/// ```
/// use serde::Deserialize;
/// use workpump_claim_worker::{Handler, Job, JobError, JobResult};
///
/// #[derive(Deserialize)]
/// struct Email { to: String }
///
/// struct SendEmail;
///
/// #[async_trait::async_trait]
/// impl Handler for SendEmail {
///     type Payload = Email;
///     async fn handle(&self, job: Job<Email>) -> JobResult {
///         if job.payload().to.is_empty() {
///             return Err(JobError::dead_letter("no recipient"));
///         }
///         // send it; stop early if job.cancellation_token() fires
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// The payload type.
    type Payload: DeserializeOwned + Send + 'static;

    /// Runs one attempt of one item.
    async fn handle(&self, job: Job<Self::Payload>) -> JobResult;

    /// This handler as a tower service, for layers to wrap; [`service_handler`] makes the
    /// wrapped service a handler again (see [`HandlerService`]).
    ///
    /// [`service_handler`]: crate::service_handler
    fn into_service(self) -> HandlerService<Self>
    where
        Self: Sized,
    {
        HandlerService::new(self)
    }
}

/// A handler from an async closure.
///
/// ```
/// use std::time::Duration;
/// use workpump_claim_worker::{handler_fn, Job, JobError};
///
/// let resize = handler_fn(|job: Job<serde_json::Value>| async move {
///     let Some(url) = job.payload()["url"].as_str() else {
///         return Err(JobError::dead_letter("payload has no url"));
///     };
///     if url.starts_with("http://flaky") {
///         return Err(JobError::retry_after("upstream busy", Duration::from_secs(30)));
///     }
///     Ok(())
/// });
/// # let _ = resize;
/// ```
pub fn handler_fn<T, F, Fut>(f: F) -> FnHandler<T, F>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(Job<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = JobResult> + Send + 'static,
{
    FnHandler {
        f,
        _payload: PhantomData,
    }
}

/// See [`handler_fn`].
pub struct FnHandler<T, F> {
    f: F,
    _payload: PhantomData<fn() -> T>,
}

#[async_trait]
impl<T, F, Fut> Handler for FnHandler<T, F>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(Job<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = JobResult> + Send + 'static,
{
    type Payload = T;

    async fn handle(&self, job: Job<T>) -> JobResult {
        (self.f)(job).await
    }
}

/// A failed attempt, and what should happen next.
///
/// Any `std::error::Error` converts into a retry with the queue's backoff, so `?` works in a
/// handler. (Deliberately not an `Error` itself, so that conversion can exist.)
pub struct JobError {
    pub(crate) kind: Disposition,
    pub(crate) message: String,
}

/// What a [`JobError`] asks for ([`JobError::disposition`]). What is finally recorded also
/// depends on why the handler's token fired, if it did (see [`JobError::cancelled`]) and on
/// the attempts left: a retry on the last attempt is a dead letter.
///
/// ```
/// use std::time::Duration;
/// use workpump_claim_worker::{Disposition, JobError};
///
/// let e = JobError::retry_after("busy", Duration::from_secs(30));
/// assert_eq!(e.disposition(), Disposition::Retry { after: Some(Duration::from_secs(30)) });
/// assert_eq!(JobError::dead_letter("bad").disposition(), Disposition::DeadLetter);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disposition {
    /// Retry, after `after` or (`None`) the queue's backoff, if attempts are left.
    Retry {
        /// The delay the handler asked for ([`JobError::retry_after`]).
        after: Option<Duration>,
    },
    /// Straight to the dead letters ([`JobError::dead_letter`]).
    DeadLetter,
    /// The handler stopped because it was cancelled ([`JobError::cancelled`]).
    Cancelled,
}

impl JobError {
    /// Retry with the queue's backoff, if attempts are left.
    pub fn retry(message: impl fmt::Display) -> Self {
        JobError {
            kind: Disposition::Retry { after: None },
            message: message.to_string(),
        }
    }

    /// Retry after `delay` (measured on the database clock), if attempts are left.
    pub fn retry_after(message: impl fmt::Display, delay: Duration) -> Self {
        JobError {
            kind: Disposition::Retry { after: Some(delay) },
            message: message.to_string(),
        }
    }

    /// Fail for good: straight to the dead letters, whatever attempts are left.
    pub fn dead_letter(message: impl fmt::Display) -> Self {
        JobError {
            kind: Disposition::DeadLetter,
            message: message.to_string(),
        }
    }

    /// The handler stopped because it was cancelled. What is recorded depends on why its
    /// token fired ([`Job::cancel_reason`]): an operator's cancel, or none (the handler's own
    /// decision) — the item ends cancelled; the host draining — its lease is released for a
    /// peer, without using up the attempt; the lease fence, `max_duration` or
    /// `max_renewals` — a failed attempt naming the reason, retried with backoff; the lease
    /// lost or the instance evicted — nothing (it would be fenced out).
    pub fn cancelled(message: impl fmt::Display) -> Self {
        JobError {
            kind: Disposition::Cancelled,
            message: message.to_string(),
        }
    }

    /// The message recorded in the item's error history.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// What it asks for: a retry (with its delay, if any), a dead letter, or a cancel.
    pub fn disposition(&self) -> Disposition {
        self.kind
    }
}

impl<E> From<E> for JobError
where
    E: std::error::Error + Send + Sync + 'static,
{
    fn from(e: E) -> Self {
        let mut message = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        JobError::retry(message)
    }
}

impl fmt::Debug for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobError")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .finish()
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// One attempt of one work item, as its handler sees it.
pub struct Job<T> {
    payload: T,
    ctx: Arc<JobContext>,
}

/// What the dispatcher knows about an attempt; shared with the handler's [`Job`].
pub(crate) struct JobContext {
    pub(crate) fence: Fence,
    pub(crate) instance: InstanceId,
    pub(crate) queue: String,
    pub(crate) kind: Option<String>,
    pub(crate) metadata: Option<Value>,
    pub(crate) attempt: i32,
    pub(crate) max_attempts: i32,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) checkpoint: Option<Value>,
    pub(crate) lease: Arc<dyn TrackedLease>,
    pub(crate) store: JobStore,
    /// Set when the handler completed the item in a fenced transaction.
    pub(crate) completed_in_transaction: AtomicBool,
}

/// Where an attempt's checkpoints and transaction go.
pub(crate) enum JobStore {
    /// A claimed item: the store that claimed it (and the PostgreSQL one for transactions).
    Claimed {
        coordinator: Arc<dyn WorkCoordinator>,
        pg: Option<PgCoordinator>,
    },
    /// A job built for a test (`testing::JobBuilder`): no store; checkpoints are recorded here.
    #[cfg(feature = "testing")]
    Detached {
        checkpoints: Arc<std::sync::Mutex<Vec<Value>>>,
    },
}

impl<T> Job<T> {
    pub(crate) fn new(payload: T, ctx: Arc<JobContext>) -> Self {
        Job { payload, ctx }
    }

    /// The same attempt with another payload (a JSON job decoded for its handler).
    pub(crate) fn with_payload<U>(self, payload: U) -> Job<U> {
        Job {
            payload,
            ctx: self.ctx,
        }
    }

    /// The payload, taken out, and the attempt without it.
    pub(crate) fn take_payload(self) -> (T, Job<()>) {
        (
            self.payload,
            Job {
                payload: (),
                ctx: self.ctx,
            },
        )
    }

    /// The payload.
    pub fn payload(&self) -> &T {
        &self.payload
    }

    /// The payload, mutably.
    pub fn payload_mut(&mut self) -> &mut T {
        &mut self.payload
    }

    /// The item's id.
    pub fn id(&self) -> WorkId {
        self.ctx.fence.id
    }

    /// The item and this claim's token: store the token beside an external effect and refuse
    /// writes carrying an older one to fence your own systems against zombies.
    pub fn fence(&self) -> Fence {
        self.ctx.fence
    }

    /// The instance running the attempt.
    pub fn instance(&self) -> InstanceId {
        self.ctx.instance
    }

    /// The queue.
    pub fn queue(&self) -> &str {
        &self.ctx.queue
    }

    /// The item's job kind (`None` for an untyped item).
    pub fn kind(&self) -> Option<&str> {
        self.ctx.kind.as_deref()
    }

    /// The metadata object the enqueuer attached (the W3C trace context lives here), if any.
    pub fn metadata(&self) -> Option<&Value> {
        self.ctx.metadata.as_ref()
    }

    /// This attempt's number, 1 for the first.
    pub fn attempt(&self) -> i32 {
        self.ctx.attempt
    }

    /// How many attempts the item may have.
    pub fn max_attempts(&self) -> i32 {
        self.ctx.max_attempts
    }

    /// When the item was enqueued (database clock).
    pub fn created_at(&self) -> DateTime<Utc> {
        self.ctx.created_at
    }

    /// Fires when the handler should stop: lease lost or not renewable in time, a cancel
    /// request, max duration, shutdown, eviction. See [`Job::cancel_reason`].
    pub fn cancellation_token(&self) -> CancellationToken {
        self.ctx.lease.token()
    }

    /// Why the token fired, if it did.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.ctx.lease.cancel_reason()
    }

    /// Whether the token fired.
    pub fn is_cancelled(&self) -> bool {
        self.ctx.lease.token().is_cancelled()
    }

    /// The checkpoint an earlier attempt saved, decoded as `C`.
    pub fn checkpoint<C: DeserializeOwned>(&self) -> Result<Option<C>, JobError> {
        match &self.ctx.checkpoint {
            None => Ok(None),
            Some(v) => serde_json::from_value(v.clone()).map(Some).map_err(|e| {
                JobError::dead_letter(format!(
                    "the saved checkpoint does not match {}: {e}",
                    std::any::type_name::<C>()
                ))
            }),
        }
    }

    /// Saves a checkpoint (fenced): a later attempt of this item starts with it. Long jobs save
    /// a cursor between units of work that each fit comfortably in a lease.
    pub async fn save_checkpoint<C: Serialize>(&self, checkpoint: &C) -> Result<(), JobError> {
        let checkpoint = serde_json::to_value(checkpoint)
            .map_err(|e| JobError::retry(format!("checkpoint is not serialisable: {e}")))?;
        match &self.ctx.store {
            JobStore::Claimed { coordinator, .. } => {
                coordinator
                    .checkpoint_work(CheckpointWorkParams {
                        instance: self.ctx.instance,
                        fence: self.ctx.fence,
                        checkpoint,
                    })
                    .await?;
            }
            #[cfg(feature = "testing")]
            JobStore::Detached { checkpoints } => checkpoints
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(checkpoint),
        }
        Ok(())
    }

    /// Opens a transaction whose first statement verifies and locks this claim's lease. The
    /// handler's writes on [`JobTransaction::connection`] and the item's completion
    /// ([`JobTransaction::complete`]) commit together — or not at all, when the lease was lost
    /// (then this returns an error and the handler should stop). Effects in the same database
    /// happen exactly once. Needs the PostgreSQL coordinator.
    pub async fn begin_transaction(&self) -> Result<JobTransaction, JobError> {
        let pg = match &self.ctx.store {
            JobStore::Claimed { pg, .. } => pg.as_ref().ok_or_else(|| {
                JobError::dead_letter(
                    "transactional completion needs the PostgreSQL coordinator (this host runs on another)",
                )
            })?,
            #[cfg(feature = "testing")]
            JobStore::Detached { .. } => {
                return Err(JobError::dead_letter(
                    "a job built for a unit test (JobBuilder) has no store, so it cannot open a \
                     fenced transaction; test a transactional handler against PostgreSQL \
                     (workpump-test's TestKit::drain)",
                ))
            }
        };
        let tx = pg.begin_fenced(self.ctx.instance, self.ctx.fence).await?;
        Ok(JobTransaction {
            tx,
            ctx: self.ctx.clone(),
        })
    }
}

/// A transaction that holds the attempt's lease locked; see [`Job::begin_transaction`].
/// Dropping it without [`complete`](Self::complete) rolls back.
pub struct JobTransaction {
    tx: FencedTransaction,
    ctx: Arc<JobContext>,
}

impl JobTransaction {
    /// The connection for the handler's writes, inside the transaction.
    pub fn connection(&mut self) -> &mut PgConnection {
        self.tx.connection()
    }

    /// Marks the item completed and commits it with the handler's writes. The handler then
    /// returns `Ok(())`; nothing else is recorded for the attempt.
    pub async fn complete(self) -> Result<(), JobError> {
        self.tx.complete().await?;
        self.ctx
            .completed_in_transaction
            .store(true, Ordering::Release);
        Ok(())
    }

    /// Rolls the handler's writes back; the lease stays held.
    pub async fn rollback(self) -> Result<(), JobError> {
        self.tx.rollback().await?;
        Ok(())
    }
}

/// Decodes a payload for a handler of `T`; the error is what the dead letter records.
pub(crate) fn decode_payload<T: DeserializeOwned>(payload: Value) -> Result<T, String> {
    serde_json::from_value(payload).map_err(|e| {
        format!(
            "the payload does not match {}: {e}",
            std::any::type_name::<T>()
        )
    })
}
