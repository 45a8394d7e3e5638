//! [`PeriodicJob`]: one periodic job's declaration — its name, when it fires (a cron
//! expression in a time zone, or a fixed interval), its misfire policy and the item it
//! enqueues — and the fire-time arithmetic every instance does alike.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::CronParser;
use croner::Cron;
use serde::{Deserialize, Serialize};
use workpump_coordinator::{IntoWork, NewWork, MAX_PERIODIC_NAME_CHARS};

/// The shortest interval accepted: 1 s (each fire time costs every instance a round trip).
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The longest interval accepted: 366 days.
pub const MAX_INTERVAL: Duration = Duration::from_secs(366 * 24 * 60 * 60);

/// What happens to fire times that passed while no instance could enqueue them (every
/// instance stopped, the database unreachable, a pause longer than the schedule's period).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Misfire {
    /// Missed fire times are not run; the schedule goes on with its next future fire time
    /// (what River, Oban and cron do). **The default.**
    #[default]
    Skip,
    /// One item is enqueued for the most recent missed fire time (however many were missed),
    /// then the schedule goes on.
    RunOnce,
}

impl fmt::Display for Misfire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Misfire::Skip => "skip",
            Misfire::RunOnce => "run_once",
        })
    }
}

/// Why a declaration was refused; each message names the job and the problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The name is not 1 to 128 letters, digits, `_`, `.`, `:` or `-` starting with a letter
    /// or digit (the rule of queue names).
    #[error(
        "periodic job {name:?}: the name must be 1 to {MAX_PERIODIC_NAME_CHARS} ASCII letters, \
         digits, '_', '.', ':' or '-', starting with a letter or digit"
    )]
    Name {
        /// The name given.
        name: String,
    },
    /// The cron expression does not parse, or never fires.
    #[error("periodic job {name:?}: cron expression {expression:?}: {reason}")]
    Cron {
        /// The job.
        name: String,
        /// The expression given.
        expression: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The time zone is not an IANA name.
    #[error(
        "periodic job {name:?}: unknown time zone {zone:?} (use an IANA name such as \
         \"Europe/Paris\", \"America/New_York\" or \"UTC\")"
    )]
    TimeZone {
        /// The job.
        name: String,
        /// The zone given.
        zone: String,
    },
    /// The interval is out of range or not whole milliseconds.
    #[error("periodic job {name:?}: interval {interval:?}: {reason}")]
    Interval {
        /// The job.
        name: String,
        /// The interval given.
        interval: Duration,
        /// What is wrong with it.
        reason: String,
    },
    /// The item to enqueue could not be built (a job's arguments that do not serialise).
    #[error("periodic job {name:?}: its item: {reason}")]
    Work {
        /// The job.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// What each fire time enqueues, or why it cannot be built.
fn template(name: &str, work: impl IntoWork) -> Result<NewWork, ScheduleError> {
    work.into_work().map_err(|e| ScheduleError::Work {
        name: name.to_owned(),
        reason: e.to_string(),
    })
}

/// When a job fires.
#[derive(Clone, Debug)]
enum Timing {
    /// A cron expression (5 fields, or 6 with seconds first, or 7 with a year last) in a time
    /// zone.
    Cron {
        expression: String,
        cron: Box<Cron>,
        zone: Tz,
    },
    /// Every `interval`, at the multiples of it since the Unix epoch (UTC).
    Interval(Duration),
}

/// One periodic job: a name that is the same on every instance, when it fires, its misfire
/// policy, and the item each fire time enqueues.
///
/// ```
/// use std::time::Duration;
/// use workpump_coordinator::NewWork;
/// use workpump_scheduler::{Misfire, PeriodicJob};
///
/// # fn main() -> Result<(), workpump_scheduler::ScheduleError> {
/// // 03:00 every day, Paris time; after an outage, run the missed night once.
/// let nightly = PeriodicJob::cron(
///     "nightly-report",
///     "0 3 * * *",
///     NewWork::new("reports", serde_json::json!({"kind": "nightly"})),
/// )?
/// .time_zone("Europe/Paris")?
/// .misfire(Misfire::RunOnce);
/// // Every 30 s, aligned to the clock (:00 and :30).
/// let sync = PeriodicJob::every(
///     "sync",
///     Duration::from_secs(30),
///     NewWork::new("sync", serde_json::json!({})),
/// )?;
/// # let _ = (nightly, sync);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct PeriodicJob {
    name: String,
    timing: Timing,
    misfire: Misfire,
    work: NewWork,
}

impl PeriodicJob {
    /// A job that fires at the times of the cron expression `expression`, in UTC (see
    /// [`time_zone`](Self::time_zone)), enqueueing `work` each time: a job's arguments
    /// ([`JobArgs`](workpump_coordinator::JobArgs), with its kind's queue and defaults) or a
    /// [`NewWork`]. Five fields (minute
    /// precision), six (seconds first) or seven (a year last); `@hourly`, `@daily` and the
    /// other nicknames, `L`, `W` and `#` are understood (the `croner` crate's syntax).
    pub fn cron(
        name: impl Into<String>,
        expression: &str,
        work: impl IntoWork,
    ) -> Result<Self, ScheduleError> {
        let name = checked_name(name.into())?;
        let work = template(&name, work)?;
        let cron = CronParser::new()
            .parse(expression)
            .map_err(|e| ScheduleError::Cron {
                name: name.clone(),
                expression: expression.to_owned(),
                reason: e.to_string(),
            })?;
        let job = PeriodicJob {
            timing: Timing::Cron {
                expression: expression.trim().to_owned(),
                cron: Box::new(cron),
                zone: Tz::UTC,
            },
            name,
            misfire: Misfire::default(),
            work,
        };
        // An expression that matches no time at all (`0 0 30 2 *`) is refused now rather
        // than never firing.
        if job.next_after(Utc::now()).is_none() {
            let Timing::Cron { expression, .. } = &job.timing else {
                unreachable!("built as cron above");
            };
            return Err(ScheduleError::Cron {
                name: job.name.clone(),
                expression: expression.clone(),
                reason: "it has no future fire time".to_owned(),
            });
        }
        Ok(job)
    }

    /// A job that fires every `interval` (whole milliseconds, 1 s to 366 days), enqueueing
    /// `work` (job arguments or a [`NewWork`]) each time. Fire times are the multiples of the interval since the Unix epoch,
    /// so every instance computes the same ones: an hour fires on the hour (UTC), 30 s at :00
    /// and :30. Use a cron expression for wall-clock times in a time zone.
    pub fn every(
        name: impl Into<String>,
        interval: Duration,
        work: impl IntoWork,
    ) -> Result<Self, ScheduleError> {
        let name = checked_name(name.into())?;
        let work = template(&name, work)?;
        let problem = |reason: &str| ScheduleError::Interval {
            name: name.clone(),
            interval,
            reason: reason.to_owned(),
        };
        if interval < MIN_INTERVAL || interval > MAX_INTERVAL {
            return Err(problem("must be between 1 s and 366 days"));
        }
        if !interval.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(problem("must be whole milliseconds"));
        }
        Ok(PeriodicJob {
            timing: Timing::Interval(interval),
            name,
            misfire: Misfire::default(),
            work,
        })
    }

    /// The time zone a cron expression is read in: an IANA name (`"Europe/Paris"`,
    /// `"America/New_York"`, `"UTC"`). **Default: UTC.** Daylight saving time: a fire time
    /// in the hour skipped in spring runs at the first valid time after the gap (wildcard and
    /// step fields run in both passes). An interval job has no time zone (its fire times
    /// are instants): giving it one is refused.
    pub fn time_zone(mut self, zone: &str) -> Result<Self, ScheduleError> {
        let tz = Tz::from_str(zone.trim()).map_err(|_| ScheduleError::TimeZone {
            name: self.name.clone(),
            zone: zone.to_owned(),
        })?;
        match &mut self.timing {
            Timing::Cron { zone, .. } => *zone = tz,
            Timing::Interval(interval) => {
                return Err(ScheduleError::Interval {
                    name: self.name.clone(),
                    interval: *interval,
                    reason: "a time zone applies to cron expressions only (an interval's fire \
                             times are instants, multiples of it since the Unix epoch)"
                        .to_owned(),
                })
            }
        }
        Ok(self)
    }

    /// What to do with fire times missed while nobody could enqueue them. **Default:
    /// [`Misfire::Skip`].**
    pub fn misfire(mut self, misfire: Misfire) -> Self {
        self.misfire = misfire;
        self
    }

    /// The job's name, the same on every instance (the key of its fleet-wide state).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The misfire policy.
    pub fn misfire_policy(&self) -> Misfire {
        self.misfire
    }

    /// The item each fire time enqueues, as declared.
    pub fn work(&self) -> &NewWork {
        &self.work
    }

    /// What the fire times are computed from, as stored with each fire time
    /// (`cron "0 3 * * *" in Europe/Paris`, `every 30000 ms`): when it differs from the stored
    /// one, the definition changed.
    pub fn fingerprint(&self) -> String {
        match &self.timing {
            Timing::Cron {
                expression, zone, ..
            } => format!("cron {expression:?} in {}", zone.name()),
            Timing::Interval(d) => format!("every {} ms", d.as_millis()),
        }
    }

    /// The first fire time strictly after `t`; `None` when there is none.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.timing {
            Timing::Cron { cron, zone, .. } => cron
                .find_next_occurrence(&t.with_timezone(zone), false)
                .ok()
                .map(|d| d.with_timezone(&Utc)),
            Timing::Interval(d) => {
                let step = d.as_millis() as i64;
                let ms = t.timestamp_millis();
                // Strictly after t, even when t has sub-millisecond digits.
                let next = (ms.div_euclid(step) + 1) * step;
                Utc.timestamp_millis_opt(next).single()
            }
        }
    }

    /// The fire times in `(after, until]`, in order.
    pub fn fire_times(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> impl Iterator<Item = DateTime<Utc>> + '_ {
        std::iter::successors(self.next_after(after), move |t| self.next_after(*t))
            .take_while(move |t| *t <= until)
    }

    /// The latest fire time at or before `t`; `None` when there is none.
    pub fn latest_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.timing {
            Timing::Cron { cron, zone, .. } => cron
                .find_previous_occurrence(&t.with_timezone(zone), true)
                .ok()
                .map(|d| d.with_timezone(&Utc)),
            Timing::Interval(d) => {
                let step = d.as_millis() as i64;
                let at = t.timestamp_millis().div_euclid(step) * step;
                Utc.timestamp_millis_opt(at).single()
            }
        }
    }

    /// The item for fire time `fire_at`: the declared item, whole; when it has no unique key
    /// of its own it gets `periodic:<name>:<fire time>` (RFC 3339, UTC), which names the fire
    /// time on the item. A unique key of the declaration's own is kept: a fire time whose
    /// key matches an unfinished item then enqueues nothing (one run at a time).
    pub fn work_for(&self, fire_at: DateTime<Utc>) -> NewWork {
        let work = self.work.clone();
        if work.unique_key.is_some() {
            work
        } else {
            work.unique_key(fire_key(&self.name, fire_at))
        }
    }
}

/// The unique key an item of fire time `fire_at` of job `name` gets when its declaration
/// sets none: `periodic:<name>:<fire time in RFC 3339, UTC, milliseconds>`.
pub fn fire_key(name: &str, fire_at: DateTime<Utc>) -> String {
    format!(
        "periodic:{name}:{}",
        fire_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    )
}

fn checked_name(name: String) -> Result<String, ScheduleError> {
    let ok = name.len() <= MAX_PERIODIC_NAME_CHARS
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'));
    if !ok {
        return Err(ScheduleError::Name { name });
    }
    Ok(name)
}
