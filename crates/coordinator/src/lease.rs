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
use crate::MAX_LEASE;

/// The default lease. **60 s.**
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// The default longest attempt. **30 min.**
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(30 * 60);

fn setting(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_owned()
    } else {
        format!("{prefix}.{field}")
    }
}

fn ms(d: Duration) -> String {
    if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{d:?}")
    }
}

/// Resolved per-item lease settings (per queue in the host config). Build them with
/// [`LeaseSettings::from_lease`] or `workpump_lease_renewal::LeaseConfig::settings`; check them with
/// [`LeaseSettings::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    /// How long a claim (and each renewal) lasts on the database clock. **Default: 60 s.**
    pub lease: Duration,
    /// How often the item's renewal is requested; each renewal extends by the full lease.
    /// **Default: lease / 3.**
    pub renewal_interval: Duration,
    /// How long before the local deadline the lease fence fires. **Default: lease / 6.**
    pub grace: Duration,
    /// Renewals after which the lease is left to lapse. **Default: none.**
    pub max_renewals: Option<u32>,
    /// How long a handler may run before its token fires. **Default: 30 min.**
    pub max_duration: Option<Duration>,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self::from_lease(DEFAULT_LEASE)
    }
}

impl LeaseSettings {
    /// Settings for `lease` with the other defaults derived from it: renewal interval
    /// lease / 3, grace lease / 6, no renewal cap, max duration 30 min.
    pub fn from_lease(lease: Duration) -> Self {
        LeaseSettings {
            lease,
            renewal_interval: lease / 3,
            grace: lease / 6,
            max_renewals: None,
            max_duration: Some(DEFAULT_MAX_DURATION),
        }
    }

    /// Every refused setting, named `prefix.field` as in the config (`lease_ms`,
    /// `renewal_interval_ms`, `grace_ms`, `max_renewals`, `max_duration_ms`). Refused: any zero
    /// bound, a lease over 24 h, a renewal interval not shorter than the lease, and a grace
    /// that leaves no room (`grace >= lease − renewal_interval`: the fence would fire before
    /// the first renewal could land).
    pub fn validate(&self, prefix: &str) -> Vec<ConfigProblem> {
        let name = |field: &str| setting(prefix, field);
        let mut problems = Vec::new();
        // The relations between settings are checked only against a valid lease, so one
        // mistake is reported once.
        let lease_ok = self.lease >= Duration::from_millis(1) && self.lease <= MAX_LEASE;
        if self.lease < Duration::from_millis(1) {
            problems.push(ConfigProblem::new(
                name("lease_ms"),
                format!("must be at least 1 ms, got {}", ms(self.lease)),
            ));
        } else if self.lease > MAX_LEASE {
            problems.push(ConfigProblem::new(
                name("lease_ms"),
                format!(
                    "must be at most 24 h ({} ms), got {}",
                    MAX_LEASE.as_millis(),
                    ms(self.lease)
                ),
            ));
        }
        if self.renewal_interval.is_zero() {
            problems.push(ConfigProblem::new(
                name("renewal_interval_ms"),
                "must be positive",
            ));
        } else if lease_ok && self.renewal_interval >= self.lease {
            problems.push(ConfigProblem::new(
                name("renewal_interval_ms"),
                format!(
                    "must be shorter than the lease ({}), got {}",
                    ms(self.lease),
                    ms(self.renewal_interval)
                ),
            ));
        }
        if self.grace.is_zero() {
            problems.push(ConfigProblem::new(
                name("grace_ms"),
                "must be positive: the fence must stop the handler before the database lease expires",
            ));
        } else if lease_ok
            && self.renewal_interval < self.lease
            && self.grace >= self.lease - self.renewal_interval
        {
            problems.push(ConfigProblem::new(
                name("grace_ms"),
                format!(
                    "leaves no room: the fence (lease − grace = {}) would fire before the first \
                     renewal (every {}) could land; grace must be shorter than lease − \
                     renewal_interval ({})",
                    ms(self.lease.saturating_sub(self.grace)),
                    ms(self.renewal_interval),
                    ms(self.lease - self.renewal_interval)
                ),
            ));
        }
        if self.max_renewals == Some(0) {
            problems.push(ConfigProblem::new(
                name("max_renewals"),
                "must be at least 1 (leave it unset for no cap)",
            ));
        }
        if self.max_duration.is_some_and(|d| d.is_zero()) {
            problems.push(ConfigProblem::new(
                name("max_duration_ms"),
                "must be positive (\"none\" for no limit)",
            ));
        }
        problems
    }
}

/// Why a lease handle's token fired. The first reason recorded wins; later ones change
/// nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelReason {
    /// The local lease fence: the deadline minus the grace passed without a confirmed renewal
    /// moving it (renewal calls failed, hung or were never sent). No database reply is needed.
    LeaseFence,
    /// The database reported the lease lost: the item is no longer this claim's (reclaimed,
    /// released, finished or expired). Whatever the handler writes now is fenced out.
    LeaseLost,
    /// An operator asked to cancel the item; the renewal reply carried the request.
    CancelRequested,
    /// The handler ran for `max_duration` since its handle was registered.
    MaxDuration {
        /// The configured `max_duration`.
        limit: Duration,
    },
    /// Renewals stopped at `max_renewals` and the lease fence then fired.
    MaxRenewals {
        /// The configured `max_renewals`.
        limit: u32,
    },
    /// The host is shutting down (the parent token fired, or the host said so).
    Shutdown,
    /// The instance was evicted: every lease it held counts as lost.
    Evicted,
    /// The handle was dropped (the dispatch ended).
    Disposed,
}

impl CancelReason {
    /// Whether the lease can no longer be trusted (the store took it, or the instance): the
    /// handler must stop and nothing it records would land.
    pub fn lease_gone(self) -> bool {
        matches!(
            self,
            CancelReason::LeaseFence | CancelReason::LeaseLost | CancelReason::Evicted
        )
    }

    /// The reason's metric label.
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
            CancelReason::LeaseFence => f.write_str(
                "the lease fence fired: the lease was not renewed before its deadline minus the grace",
            ),
            CancelReason::LeaseLost => {
                f.write_str("the lease was lost: the item is no longer held by this claim")
            }
            CancelReason::CancelRequested => f.write_str("an operator requested cancellation"),
            CancelReason::MaxDuration { limit } => {
                write!(f, "exceeded max_duration ({})", format_duration(*limit))
            }
            CancelReason::MaxRenewals { limit } => write!(f, "exceeded max_renewals ({limit})"),
            CancelReason::Shutdown => f.write_str("the host is shutting down"),
            CancelReason::Evicted => {
                f.write_str("the instance was evicted: every lease it held is treated as lost")
            }
            CancelReason::Disposed => f.write_str("the lease handle was disposed"),
        }
    }
}

/// `1800s`, `600ms`, or Debug form for anything finer.
fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{d:?}")
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
