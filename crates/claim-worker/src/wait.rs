//! How long the claim loop waits after a poll: the adaptive backoff and the NOTIFY gate.

use std::time::Duration;

use workpump_coordinator::{Throttle, ThrottleReason};

use crate::config::ClaimConfig;

/// Whether LISTEN/NOTIFY is delivering wake signals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// The listener is connected: other processes' work wakes the loop.
    Healthy,
    /// The listener is down (or disabled): only polling finds work.
    Unavailable,
}

/// The wait after a poll, given `empty` consecutive empty (or failed) polls.
///
/// - Gate unavailable: backoff is suspended, the loop polls every `base`.
/// - Gate healthy: the backoff starts at the relaxed base (when larger than `base`) and grows
///   `min(start << min(empty - 1, 10), max)`; with the safety-net poll off there is no timer
///   at all (`None`: sleep until a signal).
/// - `max <= base` disables the backoff.
pub fn wait_after(empty: u32, gate: Gate, config: &ClaimConfig) -> Option<Duration> {
    let base = config.base();
    match gate {
        Gate::Unavailable => Some(base),
        Gate::Healthy if !config.safety_net_poll => None,
        Gate::Healthy => {
            let start = config
                .notify_healthy_base_ms
                .map(Duration::from_millis)
                .filter(|relaxed| *relaxed > base)
                .unwrap_or(base);
            Some(backoff(start, config.max(), empty))
        }
    }
}

/// How the claim loop waits after the store throttled its queue (docs/flow-control.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ThrottleWait {
    /// The longest wait.
    pub(crate) wait: Duration,
    /// Whether a freed slot of this loop or a wake signal ends it early.
    pub(crate) on_signals: bool,
}

/// The wait after a throttled poll:
///
/// - rate limit: the store's time until the next token, at least 10 ms and at most `max`
///   (so tokens come in batches rather than one poll per token), not cut short by wake
///   signals (they would only meet the same empty bucket);
/// - running limit (or a reason this version does not know): no time is known, so the loop
///   polls again when one of its own slots frees, on a wake signal, or after `base` at most
///   (a slot freed by another instance sends no signal) — never the relaxed NOTIFY-healthy
///   wait, never no timer at all.
///
/// A throttled poll is not an empty one: the backoff does not grow.
pub(crate) fn throttle_wait(throttle: &Throttle, config: &ClaimConfig) -> ThrottleWait {
    match (throttle.reason, throttle.retry_after) {
        (ThrottleReason::Rate, Some(after)) => ThrottleWait {
            wait: after.clamp(MIN_RATE_WAIT, config.max().max(MIN_RATE_WAIT)),
            on_signals: false,
        },
        _ => ThrottleWait {
            wait: config.base(),
            on_signals: true,
        },
    }
}

/// The shortest wait after a rate throttle.
const MIN_RATE_WAIT: Duration = Duration::from_millis(10);

fn backoff(start: Duration, max: Duration, empty: u32) -> Duration {
    if max <= start {
        return start;
    }
    let shift = empty.saturating_sub(1).min(10);
    start.saturating_mul(1 << shift).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle(reason: ThrottleReason, retry_after: Option<Duration>) -> Throttle {
        Throttle {
            queue: "q".into(),
            reason,
            retry_after,
        }
    }

    /// A rate throttle waits for the next token, at least 10 ms and at most the backoff cap,
    /// deaf to signals; a running throttle waits for a signal or the base at most.
    #[test]
    fn a_throttle_waits_for_the_token_clamped_or_for_a_slot_within_the_base() {
        let config = ClaimConfig::default();
        let rate = |ms: u64| {
            throttle_wait(
                &throttle(ThrottleReason::Rate, Some(Duration::from_millis(ms))),
                &config,
            )
        };
        let deaf = |ms: u64| ThrottleWait {
            wait: Duration::from_millis(ms),
            on_signals: false,
        };
        assert_eq!(rate(0), deaf(10));
        assert_eq!(rate(1_234), deaf(1_234));
        assert_eq!(rate(3_600_000), deaf(config.poll_max_ms));
        assert_eq!(
            throttle_wait(&throttle(ThrottleReason::Running, None), &config),
            ThrottleWait {
                wait: Duration::from_millis(config.poll_base_ms),
                on_signals: true,
            }
        );
    }

    fn ms(d: Option<Duration>) -> Option<u64> {
        d.map(|d| d.as_millis() as u64)
    }

    /// Seed 000's table: base 250 ms, max 10 000 ms, tight polling.
    #[test]
    fn the_backoff_table_matches_the_seed() {
        let config = ClaimConfig {
            notify_healthy_base_ms: None,
            ..ClaimConfig::default()
        };
        let table: Vec<(u32, u64)> = [0, 1, 2, 3, 4, 5, 6, 7, 8, 20]
            .into_iter()
            .map(|e| (e, ms(wait_after(e, Gate::Healthy, &config)).unwrap()))
            .collect();
        assert_eq!(
            table,
            vec![
                (0, 250),
                (1, 250),
                (2, 500),
                (3, 1000),
                (4, 2000),
                (5, 4000),
                (6, 8000),
                (7, 10_000),
                (8, 10_000),
                (20, 10_000)
            ]
        );
    }

    #[test]
    fn an_unavailable_gate_pins_the_wait_to_the_base() {
        let config = ClaimConfig::default();
        for empty in [0, 1, 5, 50] {
            assert_eq!(ms(wait_after(empty, Gate::Unavailable, &config)), Some(250));
        }
    }

    #[test]
    fn a_healthy_gate_starts_the_backoff_at_the_relaxed_base() {
        let config = ClaimConfig::default();
        let waits: Vec<Option<u64>> = [0, 1, 2, 3]
            .into_iter()
            .map(|e| ms(wait_after(e, Gate::Healthy, &config)))
            .collect();
        assert_eq!(
            waits,
            vec![Some(5000), Some(5000), Some(10_000), Some(10_000)]
        );
        // A relaxed base below the tight base changes nothing.
        let lower = ClaimConfig {
            notify_healthy_base_ms: Some(100),
            ..ClaimConfig::default()
        };
        assert_eq!(ms(wait_after(0, Gate::Healthy, &lower)), Some(250));
    }

    #[test]
    fn without_the_safety_net_a_healthy_gate_sleeps_until_a_signal() {
        let config = ClaimConfig {
            safety_net_poll: false,
            ..ClaimConfig::default()
        };
        assert_eq!(wait_after(3, Gate::Healthy, &config), None);
        assert_eq!(ms(wait_after(3, Gate::Unavailable, &config)), Some(250));
    }

    #[test]
    fn a_max_at_or_below_the_base_disables_the_backoff() {
        let config = ClaimConfig {
            poll_max_ms: 250,
            notify_healthy_base_ms: None,
            ..ClaimConfig::default()
        };
        for empty in [0, 1, 2, 9, 100] {
            assert_eq!(ms(wait_after(empty, Gate::Healthy, &config)), Some(250));
        }
    }
}
