//! The claim worker and the handler API.
//!
//! [`ClaimWorker`] is the only caller of `claim_work`. It waits until the instance is
//! registered (the heartbeat worker's first recorded beat of the current id) before its first
//! claim, and again after an eviction, then runs one poll loop per queue: it claims no more than the queue's free
//! handler slots, dispatches each item on its own task under a lease kept by a
//! [`LeaseTracker`](workpump_coordinator::LeaseTracker) (the lease-renewal worker), runs the
//! user's [`Handler`], and writes the outcome — complete, retry with backoff, dead letter,
//! cancelled, or a release when draining — in coalesced, fenced batches. Between polls it
//! waits adaptively (see [`wait_after`]); wake signals from local enqueues and from
//! LISTEN/NOTIFY end any wait at once. On shutdown it drains: it stops claiming, lets running
//! handlers finish on their own for `drain_soft_timeout_ms` (the soft stop), then cancels
//! those still running and waits `drain_timeout_ms`, then releases the rest
//! ([`ClaimConfig`]).
//!
//! It deliberately does not renew leases, send heartbeats (not even to register: liveness has
//! one home, the heartbeat worker, so with the heartbeat switched off this worker claims
//! nothing), sweep stale instances or promote scheduled work: those are the lease-renewal,
//! heartbeat and maintenance workers' jobs. Arrows: coordinator ← claim-worker
//! ← host; it talks to the store only through `WorkCoordinator` (and, for transactional
//! completion, the PostgreSQL coordinator's fenced transactions).
//!
//! # Writing a handler
//!
//! ```
//! use serde::Deserialize;
//! use workpump_claim_worker::{handler_fn, Job, JobError};
//!
//! #[derive(Deserialize)]
//! struct Resize { image: String, width: u32 }
//!
//! let resize = handler_fn(|job: Job<Resize>| async move {
//!     if job.payload().width == 0 {
//!         return Err(JobError::dead_letter("width must be positive")); // no retry
//!     }
//!     let token = job.cancellation_token(); // fires on lease loss, cancel, shutdown
//!     tokio::select! {
//!         _ = token.cancelled() => Err(JobError::cancelled("stopped")),
//!         _ = async { /* resize job.payload().image */ } => Ok(()),
//!     }
//! });
//! # let _ = resize;
//! ```
//!
//! A plain error (`?`) retries with the queue's backoff (about 2^attempt s with jitter,
//! capped at 5 min) until the item's attempts are used up; then it becomes a dead letter with
//! every attempt's error. A panic is caught and recorded as a failure with its message.
//!
//! Handlers are tower services ([`AttemptService`], [`service_handler`],
//! [`Handler::into_service`], [`Handlers::layer`]), so tower layers wrap one kind or every
//! handler; [`JobHooks`] run around every attempt (claimed under the lease guard, started,
//! and one [`Ending`] per attempt). The workspace's docs/hooks.md has the sequence and the
//! ending table.
//!
//! With the `testing` feature, `testing::JobBuilder` builds a [`Job`] outside a claim, for
//! unit tests of handlers: no store, a cancellation the test fires, checkpoints recorded. The
//! users' test kit, `workpump-test`, re-exports it with an inline runner.

mod config;
mod handler;
mod hooks;
pub mod metrics;
mod outcome;
mod recorder;
mod service;
#[cfg(feature = "testing")]
pub mod testing;
mod trace;
mod wait;
mod worker;

pub use config::{
    Backoff, ClaimConfig, QueueSettings, DEFAULT_DRAIN_SOFT_TIMEOUT_MS, DEFAULT_DRAIN_TIMEOUT_MS,
    DEFAULT_MAX_ITEMS_PER_CLAIM, DEFAULT_NOTIFY_HEALTHY_BASE_MS, DEFAULT_OUTCOME_BATCH,
    DEFAULT_POLL_BASE_MS, DEFAULT_POLL_MAX_MS, MAX_CONCURRENCY,
};
pub use handler::{
    handler_fn, Disposition, FnHandler, Handler, Job, JobError, JobResult, JobTransaction,
};
pub use hooks::{Attempt, Ending, JobHooks, UnavailableReason};
pub use service::{service_handler, AttemptService, BoxError, HandlerService, ServiceHandler};
pub use trace::ATTEMPT_SPAN;
pub use wait::{wait_after, Gate};
pub use worker::{ClaimStatus, ClaimWorker, Handlers, Waker};
