//! The lease contract between the worker that dispatches work (the claim worker) and the
//! worker that keeps leases alive (the lease-renewal worker). It lives here because a worker
//! crate may depend on this crate only: the host hands the claim worker an
//! `Arc<dyn LeaseTracker>`, normally the lease-renewal worker's, and a user may supply their
//! own.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::types::{Fence, InstanceId};
use crate::worker::ConfigProblem;

/// Resolved lease settings for one item (per queue in the host's config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    /// How long a claim or renewal holds the item without renewal. **Default: 60 s.**
    pub lease: Duration,
    /// How often a running item is renewed. **Default: lease / 3.**
    pub renewal_interval: Duration,
    /// How long before the local deadline the lease fence fires. **Default: lease / 6.**
    pub grace: Duration,
    /// Renewals one claim may have; past it the lease lapses. **Default: none.**
    pub max_renewals: Option<u32>,
    /// How long one attempt may run; past it the handler is stopped. **Default: 30 min.**
    pub max_duration: Option<Duration>,
}

impl LeaseSettings {
    /// The defaults derived from a lease length.
    pub fn from_lease(lease: Duration) -> Self {
        LeaseSettings {
            lease,
            renewal_interval: lease / 3,
            grace: lease / 6,
            max_renewals: None,
            max_duration: Some(Duration::from_secs(30 * 60)),
        }
    }

    /// Every rule this violates, each naming its setting under `prefix`.
    pub fn validate(&self, prefix: &str) -> Vec<ConfigProblem> {
        let name = |field: &str| {
            if prefix.is_empty() {
                field.to_owned()
            } else {
                format!("{prefix}.{field}")
            }
        };
        let mut problems = Vec::new();
        if self.lease.is_zero() {
            problems.push(ConfigProblem::new(name("lease_ms"), "must be positive"));
        }
        if self.renewal_interval.is_zero() {
            problems.push(ConfigProblem::new(
                name("renewal_interval_ms"),
                "must be positive",
            ));
        } else if self.renewal_interval >= self.lease {
            problems.push(ConfigProblem::new(
                name("renewal_interval_ms"),
                format!(
                    "must be shorter than the lease ({} ms >= {} ms): the lease would lapse between renewals",
                    self.renewal_interval.as_millis(),
                    self.lease.as_millis()
                ),
            ));
        }
        if self.grace.is_zero() {
            problems.push(ConfigProblem::new(name("grace_ms"), "must be positive"));
        } else if self.renewal_interval < self.lease
            && self.grace >= self.lease - self.renewal_interval
        {
            problems.push(ConfigProblem::new(
                name("grace_ms"),
                format!(
                    "leaves no room: the lease fence ({} ms before the deadline) would fire before the first renewal ({} ms after the claim) could land",
                    self.grace.as_millis(),
                    self.renewal_interval.as_millis()
                ),
            ));
        }
        if self.max_renewals == Some(0) {
            problems.push(ConfigProblem::new(
                name("max_renewals"),
                "must be at least 1 (leave it unset for no limit)",
            ));
        }
        if self.max_duration.is_some_and(|d| d.is_zero()) {
            problems.push(ConfigProblem::new(
                name("max_duration_ms"),
                "must be positive (leave it unset for no limit)",
            ));
        }
        problems
    }
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self::from_lease(Duration::from_secs(60))
    }
}

/// Why a tracked lease's token fired. The first reason wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelReason {
    /// The local deadline minus the grace passed without a confirmed renewal.
    LeaseFence,
    /// The store said the lease is no longer this claim's.
    LeaseLost,
    /// An operator asked to cancel the item.
    CancelRequested,
    /// The attempt ran longer than `max_duration`.
    MaxDuration {
        /// The limit.
        limit: Duration,
    },
    /// The claim used up `max_renewals` and its lease lapsed.
    MaxRenewals {
        /// The limit.
        limit: u32,
    },
    /// The host is shutting down (draining).
    Shutdown,
    /// The store reaped this instance: every lease of it is lost.
    Evicted,
    /// The dispatcher let go of the lease.
    Disposed,
}

impl CancelReason {
    /// Whether the lease can no longer be trusted (the handler must stop; no outcome can be
    /// expected to land).
    pub fn lease_gone(self) -> bool {
        matches!(
            self,
            CancelReason::LeaseFence | CancelReason::LeaseLost | CancelReason::Evicted
        )
    }

    /// A stable label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            CancelReason::LeaseFence => "lease_fence",
            CancelReason::LeaseLost => "lease_lost",
            CancelReason::CancelRequested => "cancel_requested",
            CancelReason::MaxDuration { .. } => "max_duration",
            CancelReason::MaxRenewals { .. } => "max_renewals",
            CancelReason::Shutdown => "shutdown",
            CancelReason::Evicted => "evicted",
            CancelReason::Disposed => "disposed",
        }
    }
}

impl fmt::Display for CancelReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CancelReason::LeaseFence => {
                f.write_str("the lease could not be renewed in time (lease fence)")
            }
            CancelReason::LeaseLost => f.write_str("the lease was lost"),
            CancelReason::CancelRequested => f.write_str("a cancel was requested"),
            CancelReason::MaxDuration { limit } => {
                write!(f, "exceeded max_duration ({} ms)", limit.as_millis())
            }
            CancelReason::MaxRenewals { limit } => write!(f, "exceeded max_renewals ({limit})"),
            CancelReason::Shutdown => f.write_str("the host is shutting down"),
            CancelReason::Evicted => f.write_str("this instance was evicted"),
            CancelReason::Disposed => f.write_str("the lease was disposed"),
        }
    }
}

/// Starts tracking leases: the lease-renewal worker's side of the contract.
pub trait LeaseTracker: Send + Sync + 'static {
    /// Tracks a freshly claimed item. `sent_at` is when the claim was *sent*; the first local
    /// deadline is `sent_at + settings.lease`. The lease's token is a child of `parent`.
    fn track(
        &self,
        instance: InstanceId,
        fence: Fence,
        sent_at: Instant,
        settings: LeaseSettings,
        parent: &CancellationToken,
    ) -> Arc<dyn TrackedLease>;
}

/// One tracked lease, held by the task that runs the item's handler.
#[async_trait]
pub trait TrackedLease: Send + Sync {
    /// The claim.
    fn fence(&self) -> Fence;
    /// Fires for every [`CancelReason`].
    fn token(&self) -> CancellationToken;
    /// Why the token fired, if it did.
    fn cancel_reason(&self) -> Option<CancelReason>;
    /// Fires the token with `reason` (unless it already fired).
    fn cancel(&self, reason: CancelReason);
    /// Whether the lease fence has passed (deadline − grace): a claim that arrives expired
    /// must not start its handler.
    fn is_expired(&self) -> bool;
    /// Drives the lease's timers (renewal requests, the fence, max duration) until the token
    /// fires. The dispatcher polls it alongside the handler.
    async fn guard(&self);
    /// The dispatcher is done with the lease: stop renewing it. Idempotent.
    fn dispose(&self);
}
