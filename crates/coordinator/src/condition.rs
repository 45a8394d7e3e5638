//! How a worker is doing, as the host's health reports it: [`Condition`] (healthy, degraded
//! while it retries transient store errors, stopped once it gave up) and the cheap
//! [`HealthReporter`] a worker holds to say so.
//!
//! It lives here because every worker crate depends on this crate and the host reads it; a
//! worker of your own reports through the same handle (the host hands one to each worker
//! slot through its `WorkerContext`).
//!
//! Seed 004 separates a store that fails for a while (the worker is *degraded*: it retries and
//! recovers by itself) from a worker that gave up (*stopped*: nothing it owns makes progress
//! until the process is restarted). A worker reports [`HealthReporter::degraded`] on each
//! failed pass and [`HealthReporter::ok`] on the next success; the reporter keeps the streak
//! (since when, how many failures, the last error). A reporter is a `watch` channel: reporting
//! is a lock-free store when nothing changes, and the host reads the latest value when asked.
//!
//! Parts: a worker whose pieces fail independently (the claim worker's queues, its listener,
//! its outcome writes) reports each through its own [`part`](HealthReporter::part) or
//! [`queue`](HealthReporter::queue), so one
//! piece's success never hides another's failure; the worker's condition is the worst of its
//! own and its parts' ([`HealthReporter::condition`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use tokio::sync::watch;

/// How a worker (or a part of one: a queue, a listener) is doing.
///
/// Serialized with a `state` tag: `{"state":"healthy"}`,
/// `{"state":"degraded","since":"2026-…Z","last_error":"…","failures":3}`,
/// `{"state":"stopped","why":"…"}`.
#[derive(Clone, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Condition {
    /// Working: the last pass succeeded (or nothing failed yet).
    #[default]
    Healthy,
    /// Failing for a while and retrying (transient store errors, a lost connection): it
    /// recovers by itself once the store answers again.
    Degraded {
        /// The first failure of the current streak, by this process's wall clock (for
        /// people reading health; no lease or liveness decision uses it).
        since: DateTime<Utc>,
        /// The latest failure's message.
        last_error: String,
        /// Failures in the current streak.
        failures: u64,
    },
    /// Gave up: nothing makes it progress until the process is restarted.
    Stopped {
        /// Why it stopped.
        why: String,
    },
}

impl Condition {
    /// How bad it is, for picking the worst: healthy 0, degraded 1, stopped 2.
    pub fn severity(&self) -> u8 {
        match self {
            Condition::Healthy => 0,
            Condition::Degraded { .. } => 1,
            Condition::Stopped { .. } => 2,
        }
    }

    /// Whether it is [`Condition::Healthy`].
    pub fn is_healthy(&self) -> bool {
        matches!(self, Condition::Healthy)
    }

    /// The worst of `conditions` (healthy when empty); of several degraded ones, the oldest
    /// streak.
    pub fn worst<'a>(conditions: impl IntoIterator<Item = &'a Condition>) -> Condition {
        let mut worst = Condition::Healthy;
        for c in conditions {
            let replace = match (c, &worst) {
                (Condition::Degraded { since: a, .. }, Condition::Degraded { since: b, .. }) => {
                    a < b
                }
                _ => c.severity() > worst.severity(),
            };
            if replace {
                worst = c.clone();
            }
        }
        worst
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Condition::Healthy => f.write_str("healthy"),
            Condition::Degraded {
                since,
                last_error,
                failures,
            } => write!(
                f,
                "degraded since {} ({failures} failures): {last_error}",
                since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            Condition::Stopped { why } => write!(f, "stopped: {why}"),
        }
    }
}

/// What a worker reports its [`Condition`] through. Cheap to clone; clones share the
/// condition. A worker built outside a host makes its own ([`HealthReporter::new`]); in a
/// host, the worker slot's comes from its `WorkerContext`, so the host sees what it reports.
#[derive(Clone, Default)]
pub struct HealthReporter {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    condition: watch::Sender<Condition>,
    parts: Mutex<BTreeMap<String, HealthReporter>>,
    queues: Mutex<BTreeMap<String, HealthReporter>>,
}

impl fmt::Debug for HealthReporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthReporter")
            .field("condition", &*self.inner.condition.borrow())
            .field("parts", &self.parts())
            .field("queues", &self.queues())
            .finish()
    }
}

impl HealthReporter {
    /// A reporter that starts healthy, with no parts.
    pub fn new() -> Self {
        Self::default()
    }

    /// The last pass succeeded: back to healthy (a no-op when already healthy). Does not
    /// clear [`stopped`](Self::stopped).
    pub fn ok(&self) {
        self.inner.condition.send_if_modified(|c| match c {
            Condition::Degraded { .. } => {
                *c = Condition::Healthy;
                true
            }
            _ => false,
        });
    }

    /// A pass failed with `error` and will be retried: degraded, the streak's `since` kept
    /// from its first failure, its count raised by one.
    pub fn degraded(&self, error: impl fmt::Display) {
        let last_error = error.to_string();
        self.inner.condition.send_modify(|c| match c {
            Condition::Healthy => {
                *c = Condition::Degraded {
                    since: Utc::now(),
                    last_error,
                    failures: 1,
                }
            }
            Condition::Degraded {
                last_error: last,
                failures,
                ..
            } => {
                *last = last_error;
                *failures += 1;
            }
            Condition::Stopped { .. } => {}
        });
    }

    /// Gave up for good, because of `why`. Only a new reporter is healthy again.
    pub fn stopped(&self, why: impl fmt::Display) {
        self.inner.condition.send_replace(Condition::Stopped {
            why: why.to_string(),
        });
    }

    /// This reporter's own condition, without its parts'.
    pub fn own(&self) -> Condition {
        self.inner.condition.borrow().clone()
    }

    /// The worst of this reporter's own condition, its parts' and its queues'
    /// ([`Condition::worst`]).
    pub fn condition(&self) -> Condition {
        let own = self.own();
        let (parts, queues) = (self.parts(), self.queues());
        Condition::worst(
            std::iter::once(&own)
                .chain(parts.iter().map(|(_, c)| c))
                .chain(queues.iter().map(|(_, c)| c)),
        )
    }

    /// The part `name` of this worker (the claim worker's `"listener"` and `"outcomes"`, a
    /// scheduler's periodic job): its own reporter, created healthy on first use; the same
    /// one for the same name.
    pub fn part(&self, name: &str) -> HealthReporter {
        entry(&self.inner.parts, name)
    }

    /// The part of this worker that serves queue `name` (the claim worker's claim loop of
    /// it): like [`part`](Self::part), but the host's health lists it under the queue.
    pub fn queue(&self, name: &str) -> HealthReporter {
        entry(&self.inner.queues, name)
    }

    /// Every part's name and condition (each with its own parts folded in), in name order.
    pub fn parts(&self) -> Vec<(String, Condition)> {
        conditions(&self.inner.parts)
    }

    /// Every queue part's name and condition, in name order.
    pub fn queues(&self) -> Vec<(String, Condition)> {
        conditions(&self.inner.queues)
    }

    /// Watches this reporter's own condition (not its parts').
    pub fn subscribe(&self) -> watch::Receiver<Condition> {
        self.inner.condition.subscribe()
    }
}

fn entry(map: &Mutex<BTreeMap<String, HealthReporter>>, name: &str) -> HealthReporter {
    map.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(name.to_owned())
        .or_default()
        .clone()
}

fn conditions(map: &Mutex<BTreeMap<String, HealthReporter>>) -> Vec<(String, Condition)> {
    let reporters: Vec<(String, HealthReporter)> = map
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(n, r)| (n.clone(), r.clone()))
        .collect();
    reporters
        .into_iter()
        .map(|(n, r)| (n, r.condition()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn streak(c: &Condition) -> (DateTime<Utc>, String, u64) {
        match c {
            Condition::Degraded {
                since,
                last_error,
                failures,
            } => (*since, last_error.clone(), *failures),
            other => panic!("expected degraded, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_streak_keeps_its_first_failure_counts_them_and_ends_on_the_next_success() {
        let r = HealthReporter::new();
        assert_eq!(r.condition(), Condition::Healthy);
        r.degraded("connection refused");
        let (since, error, failures) = streak(&r.condition());
        assert_eq!((error.as_str(), failures), ("connection refused", 1));
        tokio::time::sleep(Duration::from_secs(5)).await;
        r.degraded("timed out");
        let (since2, error, failures) = streak(&r.condition());
        assert_eq!(since2, since, "since is the streak's first failure");
        assert_eq!((error.as_str(), failures), ("timed out", 2));
        r.ok();
        assert_eq!(r.condition(), Condition::Healthy);
        r.degraded("again");
        let (_, error, failures) = streak(&r.condition());
        assert_eq!((error.as_str(), failures), ("again", 1), "a new streak");
    }

    #[test]
    fn stopped_is_not_cleared_by_a_success_or_a_failure() {
        let r = HealthReporter::new();
        r.stopped("gave up");
        r.ok();
        r.degraded("late error");
        assert_eq!(
            r.condition(),
            Condition::Stopped {
                why: "gave up".into()
            }
        );
    }

    #[test]
    fn a_part_s_failure_is_not_hidden_by_another_part_s_success() {
        let r = HealthReporter::new();
        r.queue("emails").degraded("claiming: connection refused");
        r.part("listener").ok();
        r.ok();
        assert!(matches!(r.condition(), Condition::Degraded { .. }));
        assert_eq!(r.own(), Condition::Healthy);
        let queues = r.queues();
        assert_eq!(queues.len(), 1);
        assert_eq!(queues[0].0, "emails");
        assert!(matches!(queues[0].1, Condition::Degraded { .. }));
        assert_eq!(r.parts(), vec![("listener".to_owned(), Condition::Healthy)]);
        r.queue("emails").ok();
        assert_eq!(r.condition(), Condition::Healthy);
    }

    #[test]
    fn the_worst_condition_wins_and_of_two_streaks_the_older() {
        let old = Condition::Degraded {
            since: DateTime::from_timestamp(100, 0).unwrap(),
            last_error: "old".into(),
            failures: 9,
        };
        let new = Condition::Degraded {
            since: DateTime::from_timestamp(200, 0).unwrap(),
            last_error: "new".into(),
            failures: 1,
        };
        assert_eq!(Condition::worst([]), Condition::Healthy);
        assert_eq!(Condition::worst([&Condition::Healthy, &new, &old]), old);
        let stopped = Condition::Stopped { why: "x".into() };
        assert_eq!(Condition::worst([&old, &stopped, &new]), stopped);
    }

    #[test]
    fn conditions_serialize_with_a_state_tag() {
        let json = serde_json::to_value(Condition::Degraded {
            since: DateTime::from_timestamp(0, 0).unwrap(),
            last_error: "e".into(),
            failures: 2,
        })
        .unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "state": "degraded",
                "since": "1970-01-01T00:00:00Z",
                "last_error": "e",
                "failures": 2
            })
        );
        assert_eq!(
            serde_json::to_value(Condition::Healthy).unwrap(),
            serde_json::json!({"state": "healthy"})
        );
    }
}
