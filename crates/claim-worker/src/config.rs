//! The claim worker's settings and the per-queue settings of a handler.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use workpump_coordinator::{ConfigProblem, LeaseSettings, MAX_CLAIM_BATCH};

/// Tight poll cadence, used while LISTEN/NOTIFY is down. **250 ms.**
pub const DEFAULT_POLL_BASE_MS: u64 = 250;
/// Backoff cap. **10 s.**
pub const DEFAULT_POLL_MAX_MS: u64 = 10_000;
/// Relaxed poll start while LISTEN/NOTIFY is healthy. **5 s.**
pub const DEFAULT_NOTIFY_HEALTHY_BASE_MS: u64 = 5_000;
/// Rows per claim_work call at most. **1 000.**
pub const DEFAULT_MAX_ITEMS_PER_CLAIM: u32 = 1_000;
/// Outcomes written per statement at most. **1 000.**
pub const DEFAULT_OUTCOME_BATCH: usize = 1_000;
/// The most handlers of one queue that may run at once (a semaphore of that many permits;
/// tokio refuses more than `usize::MAX >> 3`).
pub const MAX_CONCURRENCY: usize = 1_000_000;
/// How long a drain waits for running handlers after cancelling them. **30 s.**
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 30_000;
/// How long a drain lets running handlers finish on their own before cancelling them.
/// **30 s.**
pub const DEFAULT_DRAIN_SOFT_TIMEOUT_MS: u64 = 30_000;

/// The claim worker's settings (section `[claim]` of the host config).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClaimConfig {
    /// Killswitch: `false` means the worker sends no SQL at all (an enqueue-only or
    /// maintenance-only host; its readiness then does not wait for a claim registration).
    /// Enabled, it still claims only once the heartbeat worker has registered the instance:
    /// with `heartbeat.enabled = false` it claims nothing (the heartbeat killswitch drains
    /// the instance from the outside) and the host stays unready. **Default: true.**
    pub enabled: bool,
    /// The tight poll cadence and the start of the backoff while the NOTIFY gate is down.
    /// **Default: 250 ms.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub poll_base_ms: u64,
    /// The backoff cap: `wait = min(base << min(empty - 1, 10), max)`. At or below the base it
    /// disables backoff. **Default: 10 000 ms.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub poll_max_ms: u64,
    /// While LISTEN/NOTIFY is healthy, the backoff starts here instead of at the base (only
    /// when larger). `None` keeps tight polling. **Default: 5 000 ms.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::option::deserialize")]
    pub notify_healthy_base_ms: Option<u64>,
    /// While LISTEN/NOTIFY is healthy, poll on a timer at all (the safety net for work that
    /// sends no signal: expired leases, missed notifications). `false`: sleep until a signal.
    /// **Default: true.**
    pub safety_net_poll: bool,
    /// LISTEN for wake signals from other processes on a dedicated connection. **Default: true.**
    pub listen: bool,
    /// The most items one claim_work call asks for (it never asks for more than the free
    /// handler slots). **Default: 1 000.**
    pub max_items_per_claim: u32,
    /// The most outcomes (completions, failures, releases) written in one statement.
    /// Outcomes that arrive while a write is in flight go out together in the next.
    /// **Default: 1 000.**
    pub outcome_batch: usize,
    /// The drain's soft stop: on shutdown the worker stops claiming and lets running
    /// handlers finish on their own for this long, their tokens not fired and their leases
    /// still renewed; the handlers still running then are cancelled
    /// ([`CancelReason::Shutdown`](workpump_coordinator::CancelReason::Shutdown)) and get
    /// [`drain_timeout_ms`](Self::drain_timeout_ms). 0 cancels them at once. The host sets it
    /// from its `shutdown_soft_timeout_ms`. **Default: 30 000 ms.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub drain_soft_timeout_ms: u64,
    /// The drain's hard timeout: how long cancelled handlers get to stop before they are
    /// abandoned and their leases released (the attempt not counted). The host sets it from
    /// its `shutdown_timeout_ms`. **Default: 30 000 ms.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub drain_timeout_ms: u64,
}

impl Default for ClaimConfig {
    fn default() -> Self {
        ClaimConfig {
            enabled: true,
            poll_base_ms: DEFAULT_POLL_BASE_MS,
            poll_max_ms: DEFAULT_POLL_MAX_MS,
            notify_healthy_base_ms: Some(DEFAULT_NOTIFY_HEALTHY_BASE_MS),
            safety_net_poll: true,
            listen: true,
            max_items_per_claim: DEFAULT_MAX_ITEMS_PER_CLAIM,
            outcome_batch: DEFAULT_OUTCOME_BATCH,
            drain_soft_timeout_ms: DEFAULT_DRAIN_SOFT_TIMEOUT_MS,
            drain_timeout_ms: DEFAULT_DRAIN_TIMEOUT_MS,
        }
    }
}

impl ClaimConfig {
    /// Every rule this violates, each naming its setting under `prefix`.
    pub fn validate(&self, prefix: &str) -> Vec<ConfigProblem> {
        let name = |f: &str| format!("{prefix}.{f}");
        let mut problems = Vec::new();
        if self.poll_base_ms == 0 {
            problems.push(ConfigProblem::new(name("poll_base_ms"), "must be positive"));
        }
        if self.poll_max_ms == 0 {
            problems.push(ConfigProblem::new(name("poll_max_ms"), "must be positive"));
        }
        if self.notify_healthy_base_ms == Some(0) {
            problems.push(ConfigProblem::new(
                name("notify_healthy_base_ms"),
                "must be positive (leave it unset for tight polling)",
            ));
        }
        if let Some(relaxed) = self.notify_healthy_base_ms {
            if relaxed > 0 && self.poll_max_ms > self.poll_base_ms && self.poll_max_ms < relaxed {
                problems.push(ConfigProblem::new(
                    name("poll_max_ms"),
                    format!(
                        "{} ms is below notify_healthy_base_ms ({relaxed} ms), so it would never apply while LISTEN/NOTIFY is healthy: raise it, or lower notify_healthy_base_ms (unset: tight polling)",
                        self.poll_max_ms
                    ),
                ));
            }
        }
        if self.max_items_per_claim == 0 || self.max_items_per_claim > MAX_CLAIM_BATCH {
            problems.push(ConfigProblem::new(
                name("max_items_per_claim"),
                format!("must be between 1 and {MAX_CLAIM_BATCH}"),
            ));
        }
        if self.outcome_batch == 0 || self.outcome_batch > 10_000 {
            problems.push(ConfigProblem::new(
                name("outcome_batch"),
                "must be between 1 and 10000",
            ));
        }
        problems
    }

    pub(crate) fn base(&self) -> Duration {
        Duration::from_millis(self.poll_base_ms)
    }
    pub(crate) fn max(&self) -> Duration {
        Duration::from_millis(self.poll_max_ms)
    }
    pub(crate) fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_timeout_ms)
    }
    pub(crate) fn drain_soft_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_soft_timeout_ms)
    }
}

/// Exponential backoff between a failed attempt and the next: `min(base × 2^attempt, cap)`,
/// with ±10 % jitter so a burst of failures does not retry in lockstep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The unit: attempt n waits about `base × 2^n`. **Default: 1 s** (2 s, 4 s, 8 s, ...).
    pub base: Duration,
    /// The longest wait. **Default: 5 min.**
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The delay before the attempt after `attempt` (1-based), without jitter.
    pub fn nominal(&self, attempt: i32) -> Duration {
        let exp = u32::try_from(attempt.clamp(0, 30)).unwrap_or(0);
        self.base
            .checked_mul(1u32 << exp)
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// The delay with ±10 % jitter, never above the cap.
    pub fn delay(&self, attempt: i32) -> Duration {
        let nominal = self.nominal(attempt);
        let factor = rand::random_range(0.9..=1.1);
        nominal.mul_f64(factor).min(self.cap)
    }
}

/// What a queue's handler runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSettings {
    /// Handlers of this queue that may run at once; the worker never claims more than the
    /// free slots. **Default: 10.**
    pub concurrency: usize,
    /// The lease each claim gets, its renewal and its limits.
    pub lease: LeaseSettings,
    /// Retry delays after failures.
    pub backoff: Backoff,
    /// Commit this queue's claims without waiting for their WAL flush: a sooner pickup, at
    /// the price that a server crash or failover can lose a claim and let a peer run the item
    /// beside the first handler (one outcome still lands; see
    /// [`ClaimWorkParams::async_commit`](workpump_coordinator::ClaimWorkParams::async_commit)).
    /// **Default: false.**
    pub async_commit: bool,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            concurrency: 10,
            lease: LeaseSettings::default(),
            backoff: Backoff::default(),
            async_commit: false,
        }
    }
}

impl QueueSettings {
    /// Every rule this violates, each naming its setting under `prefix`.
    pub fn validate(&self, prefix: &str) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        if self.concurrency == 0 || self.concurrency > MAX_CONCURRENCY {
            problems.push(ConfigProblem::new(
                format!("{prefix}.concurrency"),
                format!(
                    "must be between 1 and {MAX_CONCURRENCY}, got {}",
                    self.concurrency
                ),
            ));
        }
        let max_cap = workpump_coordinator::MAX_SCHEDULE_AHEAD;
        if self.backoff.cap > max_cap {
            problems.push(ConfigProblem::new(
                format!("{prefix}.backoff_cap_ms"),
                format!(
                    "must be at most {} ms (100 years, the longest retry delay the store \
                     takes), got {} ms",
                    max_cap.as_millis(),
                    self.backoff.cap.as_millis()
                ),
            ));
        }
        if self.backoff.base.is_zero() {
            problems.push(ConfigProblem::new(
                format!("{prefix}.backoff_base_ms"),
                "must be positive",
            ));
        }
        if self.backoff.cap < self.backoff.base {
            problems.push(ConfigProblem::new(
                format!("{prefix}.backoff_cap_ms"),
                "must not be below backoff_base_ms",
            ));
        }
        problems.extend(self.lease.validate(prefix));
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_attempt_up_to_the_cap() {
        let b = Backoff::default();
        let secs: Vec<u64> = (1..=10).map(|a| b.nominal(a).as_secs()).collect();
        assert_eq!(secs, vec![2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(b.nominal(1000), Duration::from_secs(300));
        for attempt in 1..=12 {
            let d = b.delay(attempt);
            let n = b.nominal(attempt);
            assert!(
                d >= n.mul_f64(0.9) && d <= n.mul_f64(1.1).min(b.cap),
                "{d:?} vs {n:?}"
            );
        }
    }

    #[test]
    fn validation_names_every_refused_setting() {
        let config = ClaimConfig {
            poll_base_ms: 0,
            max_items_per_claim: 0,
            notify_healthy_base_ms: Some(0),
            ..ClaimConfig::default()
        };
        let max_below_relaxed = ClaimConfig {
            poll_max_ms: 2_000,
            ..ClaimConfig::default()
        };
        assert_eq!(
            max_below_relaxed.validate("claim")[0].setting,
            "claim.poll_max_ms"
        );
        let settings: Vec<String> = config
            .validate("claim")
            .into_iter()
            .map(|p| p.setting)
            .collect();
        assert_eq!(
            settings,
            vec![
                "claim.poll_base_ms",
                "claim.notify_healthy_base_ms",
                "claim.max_items_per_claim"
            ]
        );
        assert!(ClaimConfig::default().validate("claim").is_empty());
        let queue = QueueSettings {
            concurrency: 0,
            ..QueueSettings::default()
        };
        assert_eq!(
            queue.validate("queues.emails")[0].setting,
            "queues.emails.concurrency"
        );
    }
}
