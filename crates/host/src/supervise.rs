//! Supervision: every worker runs under a child token; one that fails or panics is logged,
//! counted and restarted with exponential backoff and jitter; one that keeps failing ends
//! the host with an error that names it. Between a failure and its restart the worker's
//! supervision condition is degraded (`restarting after: <error>`); once it gave up, stopped.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use workpump_coordinator::{Condition, ConfigProblem, Worker};

use crate::metrics;

/// How failing workers are restarted (section `[supervision]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SupervisionConfig {
    /// The first restart delay; it doubles per consecutive failure. **Default: 500 ms.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub restart_base_ms: u64,
    /// The longest restart delay. **Default: 30 000 ms.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub restart_max_ms: u64,
    /// Consecutive failures after which the host gives up and stops with an error naming the
    /// worker. A run that lasted longer than `restart_max_ms` resets the count.
    /// **Default: 10.**
    pub max_consecutive_failures: u32,
}

impl Default for SupervisionConfig {
    fn default() -> Self {
        SupervisionConfig {
            restart_base_ms: 500,
            restart_max_ms: 30_000,
            max_consecutive_failures: 10,
        }
    }
}

impl SupervisionConfig {
    pub(crate) fn validate(&self, problems: &mut Vec<ConfigProblem>) {
        if self.restart_base_ms == 0 {
            problems.push(ConfigProblem::new(
                "supervision.restart_base_ms",
                "must be positive",
            ));
        }
        if self.restart_max_ms < self.restart_base_ms {
            problems.push(ConfigProblem::new(
                "supervision.restart_max_ms",
                "must not be below restart_base_ms",
            ));
        }
        if self.max_consecutive_failures == 0 {
            problems.push(ConfigProblem::new(
                "supervision.max_consecutive_failures",
                "must be at least 1",
            ));
        }
    }

    fn delay(&self, failures: u32) -> Duration {
        let base = Duration::from_millis(self.restart_base_ms);
        let max = Duration::from_millis(self.restart_max_ms);
        let nominal = base
            .checked_mul(1u32 << failures.saturating_sub(1).min(20))
            .unwrap_or(max)
            .min(max);
        nominal.mul_f64(rand::random_range(0.8..=1.2)).min(max)
    }
}

/// Why a supervised worker gave up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GaveUp {
    /// The worker's name.
    pub worker: String,
    /// How many times in a row it failed.
    pub failures: u32,
    /// Its last error or panic message.
    pub last_error: String,
}

/// Runs `worker` until `shutdown`, restarting it when it fails. `running` is true while a
/// run is in progress, and `condition` says how supervision sees it (for health reports):
/// healthy while a run is in progress, degraded between a failure and the restart, stopped
/// once it gave up.
pub(crate) async fn supervise(
    worker: Arc<dyn Worker>,
    shutdown: CancellationToken,
    config: SupervisionConfig,
    running: watch::Sender<bool>,
    condition: watch::Sender<Condition>,
) -> Result<(), GaveUp> {
    let name = worker.name().to_owned();
    // The series exists from the start, so a first restart shows in `increase()`.
    ::metrics::counter!(metrics::WORKER_RESTARTS, "worker" => name.clone()).increment(0);
    let mut failures = 0u32;
    // The first failure of the current streak.
    let mut streak_since = Utc::now();
    loop {
        let token = shutdown.child_token();
        let started = Instant::now();
        running.send_replace(true);
        condition.send_replace(Condition::Healthy);
        let w = worker.clone();
        let result = tokio::spawn(async move { w.run(token).await }).await;
        running.send_replace(false);
        let error = match result {
            Ok(Ok(())) if shutdown.is_cancelled() => return Ok(()),
            Ok(Ok(())) => "returned before shutdown".to_owned(),
            Ok(Err(e)) => e.to_string(),
            Err(join) => match join.try_into_panic() {
                Ok(panic) => format!("panicked: {}", panic_message(&*panic)),
                Err(_) => "was cancelled".to_owned(),
            },
        };
        if started.elapsed() > Duration::from_millis(config.restart_max_ms) {
            failures = 0;
        }
        if failures == 0 {
            streak_since = Utc::now();
        }
        failures += 1;
        ::metrics::counter!(metrics::WORKER_RESTARTS, "worker" => name.clone()).increment(1);
        if failures >= config.max_consecutive_failures {
            tracing::error!("worker {name} failed {failures} times in a row, giving up: {error}");
            condition.send_replace(Condition::Stopped {
                why: format!("gave up after {failures} failures in a row; last: {error}"),
            });
            return Err(GaveUp {
                worker: name,
                failures,
                last_error: error,
            });
        }
        let delay = config.delay(failures);
        condition.send_replace(Condition::Degraded {
            since: streak_since,
            last_error: format!("restarting after: {error}"),
            failures: failures.into(),
        });
        tracing::warn!("worker {name} {error}; restarting in {delay:?} (failure {failures})");
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(delay) => {}
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use std::sync::atomic::{AtomicU32, Ordering};
    use workpump_coordinator::WorkerError;

    struct Flaky {
        runs: AtomicU32,
        fail_first: u32,
        panic: bool,
    }

    #[async_trait]
    impl Worker for Flaky {
        fn name(&self) -> &str {
            "flaky"
        }
        async fn run(&self, shutdown: CancellationToken) -> Result<(), WorkerError> {
            let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
            if n <= self.fail_first {
                if self.panic {
                    panic!("boom {n}");
                }
                return Err(WorkerError::Failed {
                    worker: "flaky".into(),
                    message: format!("failure {n}"),
                });
            }
            shutdown.cancelled().await;
            Ok(())
        }
    }

    fn config() -> SupervisionConfig {
        SupervisionConfig {
            restart_base_ms: 100,
            restart_max_ms: 1_000,
            max_consecutive_failures: 5,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_worker_is_restarted_with_growing_delays_and_keeps_running() {
        let worker = Arc::new(Flaky {
            runs: AtomicU32::new(0),
            fail_first: 3,
            panic: true,
        });
        let shutdown = CancellationToken::new();
        let (running, rx) = watch::channel(false);
        let (condition, _) = watch::channel(Condition::Healthy);
        let started = Instant::now();
        let task = tokio::spawn(supervise(
            worker.clone(),
            shutdown.clone(),
            config(),
            running,
            condition,
        ));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(worker.runs.load(Ordering::SeqCst), 4);
        assert!(*rx.borrow(), "the fourth run is up");
        // Delays of about 100, 200 and 400 ms (±20 %) came before it.
        assert!(started.elapsed() >= Duration::from_millis(560));
        shutdown.cancel();
        assert_eq!(task.await.unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_keeps_failing_ends_supervision_with_its_name() {
        let worker = Arc::new(Flaky {
            runs: AtomicU32::new(0),
            fail_first: u32::MAX,
            panic: false,
        });
        let (running, _rx) = watch::channel(false);
        let (condition, seen) = watch::channel(Condition::Healthy);
        let gave_up = supervise(
            worker.clone(),
            CancellationToken::new(),
            config(),
            running,
            condition,
        )
        .await
        .unwrap_err();
        assert_eq!(gave_up.worker, "flaky");
        assert_eq!(gave_up.failures, 5);
        assert!(gave_up.last_error.contains("failure 5"), "{gave_up:?}");
        let condition = seen.borrow().clone();
        match condition {
            Condition::Stopped { why } => assert!(
                why.contains("gave up after 5 failures") && why.contains("failure 5"),
                "{why}"
            ),
            other => panic!("expected stopped, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn between_a_failure_and_its_restart_the_worker_is_degraded_with_the_error() {
        let worker = Arc::new(Flaky {
            runs: AtomicU32::new(0),
            fail_first: 2,
            panic: false,
        });
        let shutdown = CancellationToken::new();
        let (running, _rx) = watch::channel(false);
        let (condition, mut seen) = watch::channel(Condition::Healthy);
        let task = tokio::spawn(supervise(
            worker.clone(),
            shutdown.clone(),
            config(),
            running,
            condition,
        ));
        // The first failure: degraded during the ~100 ms restart delay.
        let degraded = seen
            .wait_for(|c| matches!(c, Condition::Degraded { .. }))
            .await
            .unwrap()
            .clone();
        match degraded {
            Condition::Degraded {
                last_error,
                failures,
                ..
            } => {
                assert_eq!(failures, 1);
                assert!(
                    last_error.starts_with("restarting after: ")
                        && last_error.contains("failure 1"),
                    "{last_error}"
                );
            }
            _ => unreachable!(),
        }
        // The third run keeps running: healthy again.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(worker.runs.load(Ordering::SeqCst), 3);
        assert_eq!(*seen.borrow(), Condition::Healthy);
        shutdown.cancel();
        assert_eq!(task.await.unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_during_a_restart_delay_ends_quietly() {
        let worker = Arc::new(Flaky {
            runs: AtomicU32::new(0),
            fail_first: u32::MAX,
            panic: false,
        });
        let shutdown = CancellationToken::new();
        let (running, _rx) = watch::channel(false);
        let (condition, _) = watch::channel(Condition::Healthy);
        let task = tokio::spawn(supervise(
            worker,
            shutdown.clone(),
            config(),
            running,
            condition,
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        shutdown.cancel();
        assert_eq!(task.await.unwrap(), Ok(()));
    }
}
