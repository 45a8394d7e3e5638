//! [`Liveness`]: the one set of liveness cutoffs a host declares and judges by.
//!
//! Every heartbeat declares them (`record_heartbeat` stores them with the instance row, and a
//! peer's sweep never judges an instance by shorter ones), and every sweep judges by them
//! (the heartbeat's opportunistic sweep and the maintenance backstop,
//! `cleanup_stale_instances`). They live here, in the crate every worker depends on, so that
//! the heartbeat and maintenance workers are built from the same value and their defaults
//! cannot drift; the host reads them from its `[liveness]` section.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ConfigProblem;

/// Default [`Liveness::stale_after`]: 30 s.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(30);
/// Default [`Liveness::dead_after`]: 5 min.
pub const DEFAULT_DEAD_AFTER: Duration = Duration::from_secs(300);
/// Default [`Liveness::lock_grace`]: 3 s.
pub const DEFAULT_LOCK_GRACE: Duration = Duration::from_secs(3);
/// The longest cutoff [`Liveness::validate`] accepts: 24 h.
pub const MAX_LIVENESS_CUTOFF: Duration = Duration::from_secs(24 * 60 * 60);
/// The store's floor of each cutoff as migrated (the table `liveness_floor`, enforced by
/// `check_liveness_cutoffs`): `stale_after` 1 s, `dead_after` 2 s, `lock_grace` 500 ms.
/// [`Liveness::validate`] refuses cutoffs below it at start, rather than letting every beat
/// and sweep be refused later. An operator may raise the store's floor (then a cutoff between
/// the two is refused by the store, with an error naming `liveness_floor`).
pub const STORE_FLOOR: Liveness = Liveness {
    stale_after: Duration::from_secs(1),
    dead_after: Some(Duration::from_secs(2)),
    lock_grace: Some(Duration::from_millis(500)),
};

/// The liveness cutoffs of one host (the `[liveness]` section: `stale_after_ms`,
/// `dead_after_ms`, `lock_grace_ms`). `Default` holds the only defaults: 30 s, 5 min, 3 s.
///
/// Written in a config as milliseconds or a duration string (`stale_after_ms = "30s"`, see
/// [`duration_ms`](crate::duration_ms)); `dead_after_ms` and `lock_grace_ms` also take
/// `"none"` (or JSON `null`) to turn their rule off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "LivenessMs", into = "LivenessMs")]
pub struct Liveness {
    /// An instance whose heartbeat is older than this is stale: a sweep reaps it unless its
    /// alive-lock is held. Must be at least twice the heartbeat's fast interval, so that an
    /// instance beating at the fast cadence never looks stale between two beats.
    /// **Default: 30 s.**
    pub stale_after: Duration,
    /// An instance whose heartbeat is older than this is reaped even though its alive-lock is
    /// held (the definitive-dead bypass, for a dead process whose half-open connection still
    /// holds the lock). Must exceed `stale_after` and, with the alive-lock in use, twice the
    /// heartbeat's slow interval. `None` turns the bypass off. **Default: 5 min.**
    pub dead_after: Option<Duration>,
    /// A lock-proven instance whose alive-lock has stayed gone this long is dead (failover in
    /// seconds: a crashed process loses its connections, and the lock, at once). The heartbeat
    /// worker takes its own lock again within this grace after a connection blip. `None`
    /// turns the rule off (a dead peer is then found by staleness only). **Default: 3 s.**
    pub lock_grace: Option<Duration>,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            stale_after: DEFAULT_STALE_AFTER,
            dead_after: Some(DEFAULT_DEAD_AFTER),
            lock_grace: Some(DEFAULT_LOCK_GRACE),
        }
    }
}

impl Liveness {
    /// Every cutoff this refuses, each named `prefix.<field>_ms` (e.g.
    /// `liveness.stale_after_ms`); empty when usable. Each cutoff must lie between the
    /// store's floor ([`STORE_FLOOR`]) and 24 h, and `dead_after` beyond `stale_after`. The
    /// rules that tie them to the heartbeat's cadences are the heartbeat worker's
    /// (`HeartbeatConfig::validate`).
    pub fn validate(&self, prefix: &str) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        let mut in_range = |field: &str, value: Duration, floor: Duration| {
            let name = setting(prefix, field);
            if value < floor {
                problems.push(ConfigProblem::new(
                    name,
                    format!(
                        "must be at least {} ms (the store's floor, liveness_floor), got {} ms",
                        floor.as_millis(),
                        value.as_millis()
                    ),
                ));
                false
            } else if value > MAX_LIVENESS_CUTOFF {
                problems.push(ConfigProblem::new(
                    name,
                    format!(
                        "must be at most {} ms (24 h), got {} ms",
                        MAX_LIVENESS_CUTOFF.as_millis(),
                        value.as_millis()
                    ),
                ));
                false
            } else {
                true
            }
        };
        let floor = STORE_FLOOR;
        let stale = in_range("stale_after_ms", self.stale_after, floor.stale_after);
        let dead = self.dead_after.map(|d| {
            in_range(
                "dead_after_ms",
                d,
                floor.dead_after.unwrap_or(Duration::ZERO),
            )
        });
        if let Some(grace) = self.lock_grace {
            in_range(
                "lock_grace_ms",
                grace,
                floor.lock_grace.unwrap_or(Duration::ZERO),
            );
        }
        if let (true, Some(true), Some(dead_after)) = (stale, dead, self.dead_after) {
            if dead_after <= self.stale_after {
                problems.push(ConfigProblem::new(
                    setting(prefix, "dead_after_ms"),
                    format!(
                        "{} ({} ms) must be greater than {} ({} ms): the definitive-dead cutoff \
                         lies beyond the stale one",
                        setting(prefix, "dead_after_ms"),
                        dead_after.as_millis(),
                        setting(prefix, "stale_after_ms"),
                        self.stale_after.as_millis(),
                    ),
                ));
            }
        }
        problems
    }

    /// Whether [`stale_after`](Self::stale_after) passed its own range check (for the rules
    /// of other sections that build on it: they are skipped for a cutoff already refused, so
    /// one bad key is one problem).
    pub fn stale_after_in_range(&self) -> bool {
        (STORE_FLOOR.stale_after..=MAX_LIVENESS_CUTOFF).contains(&self.stale_after)
    }

    /// Whether [`dead_after`](Self::dead_after), when set, passed its own range check.
    pub fn dead_after_in_range(&self) -> bool {
        self.dead_after.is_none_or(|d| {
            (STORE_FLOOR.dead_after.unwrap_or(Duration::ZERO)..=MAX_LIVENESS_CUTOFF).contains(&d)
        })
    }
}

/// `prefix.field`, or `field` without a prefix.
fn setting(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_owned()
    } else {
        format!("{prefix}.{field}")
    }
}

/// How [`Liveness`] is written in a config: milliseconds or a duration string
/// ([`duration_ms`](crate::duration_ms)); `dead_after_ms` and `lock_grace_ms` also `"none"`
/// (or `null`) to turn their rule off.
#[derive(Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct LivenessMs {
    #[serde(deserialize_with = "crate::duration_ms::deserialize")]
    stale_after_ms: u64,
    #[serde(deserialize_with = "crate::duration_ms::or_none::deserialize")]
    dead_after_ms: Option<u64>,
    #[serde(deserialize_with = "crate::duration_ms::or_none::deserialize")]
    lock_grace_ms: Option<u64>,
}

impl Default for LivenessMs {
    fn default() -> Self {
        Liveness::default().into()
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl From<Liveness> for LivenessMs {
    fn from(l: Liveness) -> Self {
        LivenessMs {
            stale_after_ms: ms(l.stale_after),
            dead_after_ms: l.dead_after.map(ms),
            lock_grace_ms: l.lock_grace.map(ms),
        }
    }
}

impl From<LivenessMs> for Liveness {
    fn from(l: LivenessMs) -> Self {
        Liveness {
            stale_after: Duration::from_millis(l.stale_after_ms),
            dead_after: l.dead_after_ms.map(Duration::from_millis),
            lock_grace: l.lock_grace_ms.map(Duration::from_millis),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(l: &Liveness) -> Vec<String> {
        l.validate("liveness")
            .into_iter()
            .map(|p| p.setting)
            .collect()
    }

    #[test]
    fn the_defaults_are_thirty_seconds_five_minutes_and_three_seconds_and_valid() {
        let l = Liveness::default();
        assert_eq!(l.stale_after, Duration::from_secs(30));
        assert_eq!(l.dead_after, Some(Duration::from_secs(300)));
        assert_eq!(l.lock_grace, Some(Duration::from_secs(3)));
        assert!(l.validate("liveness").is_empty());
    }

    #[test]
    fn cutoffs_below_the_store_floor_or_above_a_day_are_refused_once_each() {
        let below = Liveness {
            stale_after: Duration::from_millis(999),
            dead_after: Some(Duration::from_millis(1_999)),
            lock_grace: Some(Duration::from_millis(499)),
        };
        assert_eq!(
            refused(&below),
            [
                "liveness.stale_after_ms",
                "liveness.dead_after_ms",
                "liveness.lock_grace_ms"
            ]
        );
        let at_floor = STORE_FLOOR;
        assert!(refused(&at_floor).is_empty(), "{:?}", refused(&at_floor));
        let above = Liveness {
            stale_after: MAX_LIVENESS_CUTOFF + Duration::from_millis(1),
            dead_after: None,
            lock_grace: None,
        };
        assert_eq!(refused(&above), ["liveness.stale_after_ms"]);
    }

    #[test]
    fn dead_after_must_lie_beyond_stale_after() {
        let l = Liveness {
            dead_after: Some(DEFAULT_STALE_AFTER),
            ..Liveness::default()
        };
        let problems = l.validate("liveness");
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].setting, "liveness.dead_after_ms");
        assert!(problems[0].reason.contains("liveness.stale_after_ms"));
        let off = Liveness {
            dead_after: None,
            lock_grace: None,
            ..Liveness::default()
        };
        assert!(off.validate("liveness").is_empty());
    }

    #[test]
    fn the_config_form_is_milliseconds_with_none_for_a_rule_turned_off() {
        let l: Liveness = serde_json::from_value(serde_json::json!({
            "stale_after_ms": 20_000,
            "dead_after_ms": "none",
            "lock_grace_ms": null,
        }))
        .expect("valid");
        assert_eq!(
            l,
            Liveness {
                stale_after: Duration::from_secs(20),
                dead_after: None,
                lock_grace: None,
            }
        );
        let partial: Liveness =
            serde_json::from_value(serde_json::json!({ "dead_after_ms": "600000" }))
                .expect("valid");
        assert_eq!(partial.dead_after, Some(Duration::from_secs(600)));
        assert_eq!(partial.stale_after, DEFAULT_STALE_AFTER);
        let back = serde_json::to_value(Liveness::default()).expect("serializes");
        assert_eq!(
            back,
            serde_json::json!({
                "stale_after_ms": 30_000,
                "dead_after_ms": 300_000,
                "lock_grace_ms": 3_000,
            })
        );
        assert!(
            serde_json::from_value::<Liveness>(serde_json::json!({ "dead_after_ms": -1 })).is_err()
        );
        assert!(
            serde_json::from_value::<Liveness>(serde_json::json!({ "stale_after": 1 })).is_err()
        );
    }
}
