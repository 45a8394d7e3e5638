//! Running a handler inline, on a job built with [`JobBuilder`](crate::JobBuilder), and what it
//! came to.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use serde_json::Value;
use workpump_claim_worker::{Disposition, Handler, Job, JobResult};

/// How a handler's run ended, as a test matches it.
///
/// It is what the handler *answered*. What the claim worker then records also depends on why
/// the job's token fired, if it did, and on the attempts left: a retry on the last attempt is
/// a dead letter; after an operator's cancel ([`CancelReason::CancelRequested`]) any failure
/// ends the item cancelled; during a drain ([`CancelReason::Shutdown`]) a failure releases the
/// item for a peer without using up the attempt (docs/jobs.md, "Testing your jobs"). To see
/// what the store records, drain the queue ([`TestKit::drain`](crate::TestKit::drain)).
///
/// [`CancelReason::CancelRequested`]: crate::CancelReason::CancelRequested
/// [`CancelReason::Shutdown`]: crate::CancelReason::Shutdown
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobOutcome {
    /// It returned `Ok(())`.
    Completed,
    /// It asked for a retry: [`JobError::retry`](workpump_host::JobError::retry) (`after: None`, the
    /// queue's backoff), [`retry_after`](workpump_host::JobError::retry_after), or any error through
    /// `?`.
    Retry {
        /// The error recorded in the item's history.
        message: String,
        /// The delay it asked for.
        after: Option<Duration>,
    },
    /// It rejected the item for good ([`JobError::dead_letter`](workpump_host::JobError::dead_letter)).
    DeadLetter {
        /// The error recorded.
        message: String,
    },
    /// It stopped because it was cancelled ([`JobError::cancelled`](workpump_host::JobError::cancelled)).
    Cancelled {
        /// The message recorded.
        message: String,
    },
    /// It panicked (the claim worker records a failed attempt naming the panic, retried).
    Panicked {
        /// The panic's message.
        message: String,
    },
    /// The payload did not decode into the handler's type ([`run_json`] only): the claim
    /// worker sends such an item to the dead letters at once, with this message.
    Undecodable {
        /// The serde error, as recorded ("the payload does not match ...").
        message: String,
    },
}

impl JobOutcome {
    fn of(result: JobResult) -> Self {
        match result {
            Ok(()) => JobOutcome::Completed,
            Err(e) => {
                let message = e.message().to_owned();
                match e.disposition() {
                    Disposition::Retry { after } => JobOutcome::Retry { message, after },
                    Disposition::DeadLetter => JobOutcome::DeadLetter { message },
                    Disposition::Cancelled => JobOutcome::Cancelled { message },
                    // A disposition added later: the closest is a failed attempt.
                    _ => JobOutcome::Retry {
                        message,
                        after: None,
                    },
                }
            }
        }
    }

    /// The message, for every outcome but [`Completed`](Self::Completed).
    pub fn message(&self) -> Option<&str> {
        match self {
            JobOutcome::Completed => None,
            JobOutcome::Retry { message, .. }
            | JobOutcome::DeadLetter { message }
            | JobOutcome::Cancelled { message }
            | JobOutcome::Panicked { message }
            | JobOutcome::Undecodable { message } => Some(message),
        }
    }
}

/// Runs `handler` on `job` here, on this task, and says how it ended; a panic is caught and
/// becomes [`JobOutcome::Panicked`]. Nothing is recorded anywhere: the job's checkpoints go to
/// its [`JobProbe`](crate::JobProbe).
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use workpump_host::{handler_fn, Job, JobArgs, JobError};
/// use workpump_test::{run_job, JobBuilder, JobOutcome};
///
/// #[derive(Serialize, Deserialize)]
/// struct SendEmail { to: String }
/// impl JobArgs for SendEmail { const KIND: &'static str = "send_email"; }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let handler = handler_fn(|job: Job<SendEmail>| async move {
///     if job.payload().to.is_empty() {
///         return Err(JobError::dead_letter("no recipient"));
///     }
///     Ok(())
/// });
/// let (job, _probe) = JobBuilder::new(SendEmail { to: String::new() }).build();
/// assert_eq!(
///     run_job(&handler, job).await,
///     JobOutcome::DeadLetter { message: "no recipient".into() }
/// );
/// # });
/// ```
pub async fn run_job<H: Handler>(handler: &H, job: Job<H::Payload>) -> JobOutcome {
    match AssertUnwindSafe(handler.handle(job)).catch_unwind().await {
        Ok(result) => JobOutcome::of(result),
        Err(panic) => JobOutcome::Panicked {
            message: panic_message(panic.as_ref()),
        },
    }
}

/// Runs `handler` on a job whose payload is JSON, decoding it first as the claim worker does:
/// a payload that does not decode into `H::Payload` is [`JobOutcome::Undecodable`] with the
/// message the dead letter would record, and the handler does not run.
///
/// ```
/// use serde::Deserialize;
/// use workpump_host::{handler_fn, Job};
/// use workpump_test::{run_json, JobBuilder, JobOutcome};
///
/// #[derive(Deserialize)]
/// struct Resize { width: u32 }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let handler = handler_fn(|_job: Job<Resize>| async move { Ok(()) });
/// let (job, _) = JobBuilder::untyped(serde_json::json!({"width": "wide"})).build();
/// let outcome = run_json(&handler, job).await;
/// assert!(matches!(outcome, JobOutcome::Undecodable { .. }), "{outcome:?}");
/// # });
/// ```
pub async fn run_json<H: Handler>(handler: &H, job: Job<Value>) -> JobOutcome {
    match workpump_claim_worker::testing::decode::<H::Payload>(job) {
        Ok(job) => run_job(handler, job).await,
        Err(message) => JobOutcome::Undecodable { message },
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}
