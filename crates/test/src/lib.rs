//! A test kit for services built on workpump: test your handlers and your producers the way
//! Oban.Testing, rivertest and awa-testing let you. Add it as a dev-dependency.
//!
//! **Unit tests, no database.** [`JobBuilder`] builds a [`Job<T>`](workpump_host::Job) with
//! your payload and whatever attempt, id, queue, kind, created_at, checkpoint and metadata
//! the test needs; [`run_job`] runs a handler on it inline and returns its [`JobOutcome`]
//! (completed, retry, dead letter, cancelled, panicked; [`run_json`] adds undecodable
//! payloads). The [`JobProbe`] that comes with the job fires its cancellation token with a
//! [`CancelReason`] (an operator's cancel, a shutdown) and records the checkpoints the handler
//! saves.
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use workpump_host::{handler_fn, Job, JobArgs, JobError};
//! use workpump_test::{run_job, CancelReason, JobBuilder, JobOutcome};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Import { rows: u32 }
//! impl JobArgs for Import { const KIND: &'static str = "import"; }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let import = handler_fn(|job: Job<Import>| async move {
//!     let start = job.checkpoint::<u32>()?.unwrap_or(0);
//!     for row in start..job.payload().rows {
//!         if job.is_cancelled() {
//!             job.save_checkpoint(&row).await?;
//!             return Err(JobError::cancelled(format!("stopped at row {row}")));
//!         }
//!         // import the row
//!     }
//!     Ok(())
//! });
//!
//! let (job, _) = JobBuilder::new(Import { rows: 3 }).build();
//! assert_eq!(run_job(&import, job).await, JobOutcome::Completed);
//!
//! // A second attempt resumes from its checkpoint, and stops when the host shuts down.
//! let (job, probe) = JobBuilder::new(Import { rows: 10 }).attempt(2).checkpoint(&4u32).build();
//! probe.cancel(CancelReason::Shutdown);
//! let outcome = run_job(&import, job).await;
//! assert_eq!(outcome, JobOutcome::Cancelled { message: "stopped at row 4".into() });
//! assert_eq!(probe.last_checkpoint::<u32>().unwrap(), Some(4));
//! # });
//! ```
//!
//! **Against a real database** (your test database; workpump's own tests use the throwaway
//! cluster): [`TestKit`] asserts what was enqueued, by kind and payload
//! ([`TestKit::enqueued`], [`TestKit::assert_enqueued`], a failure lists what the queue
//! holds); drains a queue through the real claim path — leases, fences, retries and outcome
//! writes are production's — and counts how its items ended ([`TestKit::drain`]); and makes
//! scheduled items, delayed ones and retries in their backoff, due now ([`TestKit::run_now`],
//! [`Drain::with_scheduled`]; the store's `run_now` operator action).
//!
//! Where it sits: it depends on `workpump-host` (and on `workpump-claim-worker`'s `testing`
//! feature, which makes a job outside a claim); nothing in workpump depends on it. It is a
//! crate of its own, not a feature of the host, so that a service's production build never
//! compiles it and its test-only API never shows in the host's. docs/jobs.md, "Testing your
//! jobs", walks through each part; `crates/test/tests/test_kit.rs` is an example test of each.

mod kit;
mod run;

pub use kit::{Drain, DrainCounts, Error, TestKit, DEFAULT_DRAIN_TIMEOUT};
pub use run::{run_job, run_json, JobOutcome};
pub use workpump_claim_worker::testing::{decode, JobBuilder, JobProbe};
pub use workpump_coordinator::CancelReason;
