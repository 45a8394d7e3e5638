//! Keeps the leases of in-flight work items alive, and stops handlers whose lease is gone.
//! Every dispatched item gets a [`LeaseHandle`] (through [`Leases::register`]) whose
//! cancellation token fires at the local lease fence — the deadline minus a grace, on tokio's
//! monotonic clock, with no database reply needed — and when the lease is lost (or the whole
//! instance was evicted), a cancel is requested, `max_duration` passes, the host shuts down or the handle is dropped. The
//! [`LeaseRenewalWorker`] coalesces the handles' renewal requests into batched calls of the
//! `renew_leases` SQL function and moves each
//! deadline only after the database confirmed, from when the call was sent.
//!
//! It deliberately does not claim work, run handlers, record outcomes or release leases (the
//! claim worker and the host do), and it never decides that a lease is lost on its own: a
//! failed renewal call changes nothing, and only the fence or the database's word stops a
//! handler. Arrows: coordinator ← lease-renewal ← host (the claim worker receives [`Leases`]
//! from the host; this crate depends on `workpump-coordinator` only).
//!
//! # Settings (`[lease]` in the host config, [`LeaseConfig`])
//!
//! | setting | default | what it does |
//! | --- | --- | --- |
//! | `lease_ms` | 60 000 | how long a claim and each renewal last on the database clock |
//! | `renewal_interval_ms` | lease / 3 | how often each item's renewal is requested; must be shorter than the lease |
//! | `grace_ms` | lease / 6 | the fence fires this long before the local deadline; must be shorter than lease − renewal interval |
//! | `max_renewals` | none | renewals after which the lease is left to lapse ("exceeded max_renewals (N)") |
//! | `max_duration_ms` | 1 800 000 (30 min), `"none"` to disable | the token fires this long after registration ("exceeded max_duration") |
//! | `max_batch` | 200 | the most leases in one `renew_leases` call |
//! | `window_ms` | 200 | the first pending request waits at most this long for company |
//! | `flush_at` | `max_batch` | this many pending requests are sent at once; fewer wait for the window |
//! | `channel_capacity` | 5 000 | renewal requests queued before a request is refused (`channel_full`); a host raises it to its handler slots |
//!
//! Refused at start ([`LeaseConfig::validate`], [`LeaseSettings::validate`]), naming the
//! setting: any zero bound, `renewal_interval >= lease`, `grace >= lease − renewal_interval`,
//! `renewal_interval + window >= lease − grace`, `flush_at > max_batch`.
//!
//! Metrics are listed in [`metrics`].
//!
//! # Use
//!
//! ```no_run
//! use std::sync::Arc;
//! use tokio::time::Instant;
//! use tokio_util::sync::CancellationToken;
//! use workpump_coordinator::{Fence, InstanceId, WorkCoordinator};
//! use workpump_lease_renewal::{LeaseConfig, LeaseRenewalWorker};
//!
//! async fn handler(stop: CancellationToken) -> Result<(), String> {
//!     stop.cancelled().await; // a real handler checks it between units of work
//!     Ok(())
//! }
//!
//! async fn dispatch_one(
//!     coordinator: Arc<dyn WorkCoordinator>,
//!     host: CancellationToken,
//!     instance: InstanceId,
//!     fence: Fence,
//!     claim_sent_at: Instant,
//! ) -> Result<(), String> {
//!     let config = LeaseConfig::default();
//!     assert!(config.validate("lease").is_empty());
//!     // The host builds the worker once and runs `worker.run(shutdown)` under supervision.
//!     let worker = LeaseRenewalWorker::new(coordinator, config.clone());
//!     let handle = worker.leases().register(instance, fence, claim_sent_at, config.settings(), &host);
//!     if handle.is_expired() {
//!         return Err("the lease ran out before the handler started".into());
//!     }
//!     let work = handler(handle.token());
//!     tokio::pin!(work);
//!     let outcome = tokio::select! {
//!         outcome = &mut work => outcome,
//!         // The token fired: the handler sees it and winds down.
//!         _ = handle.guard() => (&mut work).await,
//!     };
//!     match handle.cancel_reason() {
//!         Some(reason) => Err(reason.to_string()), // e.g. "exceeded max_renewals (6)"
//!         None => outcome,
//!     }
//!     // Dropping the handle disposes it.
//! }
//! ```
//!
#![doc = include_str!("../TIMING.md")]

mod handle;
pub mod metrics;
mod worker;

pub use handle::{CancelReasonReader, LeaseHandle, Leases};
pub use worker::{
    LeaseConfig, LeaseRenewalWorker, RenewalCounts, DEFAULT_CHANNEL_CAPACITY, DEFAULT_MAX_BATCH,
    DEFAULT_WINDOW, MAX_BATCH_LIMIT, MAX_CHANNEL_CAPACITY,
};
/// The lease contract's types live in the coordinator crate (the claim worker may depend on
/// nothing else); they are re-exported here for convenience.
pub use workpump_coordinator::{CancelReason, LeaseSettings, DEFAULT_LEASE, DEFAULT_MAX_DURATION};
