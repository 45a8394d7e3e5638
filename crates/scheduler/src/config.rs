//! [`PeriodicConfig`]: a periodic job declared in configuration (`[periodic.<name>]`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use workpump_coordinator::{ConfigProblem, NewWork};

use crate::schedule::{Misfire, PeriodicJob, ScheduleError};

/// A periodic job declared in configuration, under `[periodic.<name>]`: the name is the
/// table's key. Exactly one of `cron` and `interval_ms`.
///
/// ```toml
/// [periodic.nightly-report]
/// queue = "reports"
/// payload = { kind = "nightly" }
/// cron = "0 3 * * *"
/// timezone = "Europe/Paris"
/// misfire = "run_once"
///
/// [periodic.sync]
/// queue = "sync"
/// interval_ms = 30000
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PeriodicConfig {
    /// The queue each fire time enqueues into; the host must declare it (a handler, or
    /// `produces`). **Required.**
    pub queue: Option<String>,
    /// The payload of each item (any TOML value, as JSON). **Default: `{}`.**
    pub payload: Option<Value>,
    /// The items' job kind, for a queue whose handlers are typed (`JobArgs::KIND`).
    /// **Default: none (untyped items).**
    pub kind: Option<String>,
    /// A cron expression: 5 fields (minute precision), 6 (seconds first) or 7 (a year
    /// last), or a nickname (`@hourly`, `@daily`, ...). Read in `timezone`.
    pub cron: Option<String>,
    /// A fixed interval in milliseconds, 1 000 to 366 days: fires at the multiples of it
    /// since the Unix epoch (UTC).
    pub interval_ms: Option<u64>,
    /// The IANA time zone a cron expression is read in (`"Europe/Paris"`); cron only.
    /// **Default: `UTC`.**
    pub timezone: Option<String>,
    /// `skip` or `run_once`: what happens to fire times missed while nobody could enqueue
    /// them. **Default: `skip`.**
    pub misfire: Misfire,
    /// The items' priority (lower runs first). **Default: 0.**
    pub priority: Option<i16>,
    /// The items' attempt limit. **Default: the queue's.**
    pub max_attempts: Option<i32>,
}

impl PeriodicConfig {
    /// The job this entry declares, or every problem with it, each named
    /// `<prefix>.<field>` (e.g. `periodic.nightly.cron`).
    pub fn to_job(&self, name: &str, prefix: &str) -> Result<PeriodicJob, Vec<ConfigProblem>> {
        let field = |f: &str| format!("{prefix}.{f}");
        let mut problems = Vec::new();
        let Some(queue) = &self.queue else {
            problems.push(ConfigProblem::new(
                field("queue"),
                "is required: the queue each fire time enqueues into",
            ));
            return Err(problems);
        };
        let mut work = NewWork::new(
            queue.clone(),
            self.payload
                .clone()
                .unwrap_or_else(|| Value::Object(Default::default())),
        );
        if let Some(p) = self.priority {
            work = work.priority(p);
        }
        if let Some(kind) = &self.kind {
            match workpump_coordinator::validate_kind(kind) {
                Ok(()) => work = work.kind(kind.clone()),
                Err(workpump_coordinator::Error::InvalidArgument(reason)) => {
                    problems.push(ConfigProblem::new(field("kind"), reason))
                }
                Err(e) => problems.push(ConfigProblem::new(field("kind"), e.to_string())),
            }
        }
        if let Some(m) = self.max_attempts {
            if !(1..=1000).contains(&m) {
                problems.push(ConfigProblem::new(
                    field("max_attempts"),
                    format!("must be between 1 and 1000, got {m}"),
                ));
            }
            work = work.max_attempts(m);
        }
        let job = match (&self.cron, self.interval_ms) {
            (Some(_), Some(_)) => {
                problems.push(ConfigProblem::new(
                    prefix,
                    "sets both cron and interval_ms; set exactly one",
                ));
                return Err(problems);
            }
            (None, None) => {
                problems.push(ConfigProblem::new(
                    prefix,
                    "sets neither cron nor interval_ms; set exactly one",
                ));
                return Err(problems);
            }
            (Some(expr), None) => PeriodicJob::cron(name, expr, work).map_err(|e| (e, "cron")),
            (None, Some(ms)) => PeriodicJob::every(name, Duration::from_millis(ms), work)
                .map_err(|e| (e, "interval_ms")),
        };
        let job = job.and_then(|job| match &self.timezone {
            Some(zone) => job.time_zone(zone).map_err(|e| (e, "timezone")),
            None => Ok(job),
        });
        match job {
            Ok(job) if problems.is_empty() => Ok(job.misfire(self.misfire)),
            Ok(_) => Err(problems),
            Err((e, key)) => {
                let setting = match e {
                    ScheduleError::Name { .. } => prefix.to_owned(),
                    _ => field(key),
                };
                problems.push(ConfigProblem::new(setting, e.to_string()));
                Err(problems)
            }
        }
    }
}
