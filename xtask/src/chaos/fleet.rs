//! The fault suite's side of the worker fleet (`crate::harness::fleet`): the settings
//! profiles the workers run with, the figures the scenarios derive from them, and how a
//! scenario's [`WorkerSpec`] becomes the harness's [`Launch`].

use figment::providers::Serialized;
use figment::Figment;
use workpump_host::HostConfig;

use super::Result;
use crate::harness::fleet::Launch;
pub(crate) use crate::harness::fleet::{scrape, Fleet, Life};
use crate::harness::{keys, worker_env};

/// The queue every worker serves.
pub(crate) const QUEUE: &str = "chaos";

/// The short profile: the shipped defaults with these settings changed (dotted paths of
/// `HostConfig`, values in milliseconds), so that a scenario's recovery takes seconds:
/// lease 3 s (renewed every 1 s, fence grace 0.5 s), heartbeat 1 s / 2 s, stale after 3 s,
/// definitively dead after 12 s, lock grace 3 s (the default), a sweep every second, retries
/// from 100 ms, a drain of a 2 s soft stop and a 5 s hard timeout. The workers get them as `WORKPUMP_*` variables, and the suite's
/// bounds are derived from the same `HostConfig` (see [`Timing::of`]).
pub(crate) const SHORT_SETTINGS: [(&str, u64); 10] = [
    (keys::FAST_INTERVAL_MS, 1_000),
    (keys::SLOW_INTERVAL_MS, 2_000),
    (keys::STALE_AFTER_MS, 3_000),
    (keys::DEAD_AFTER_MS, 12_000),
    (keys::LOCK_GRACE_MS, 3_000),
    (keys::SWEEP_INTERVAL_MS, 1_000),
    ("queues.chaos.lease_ms", 3_000),
    ("queues.chaos.backoff_base_ms", 100),
    ("shutdown_soft_timeout_ms", 2_000),
    ("shutdown_timeout_ms", 5_000),
];

/// The settings of a profile that the scenarios' timelines and recovery bounds are derived
/// from, in seconds: read from the profile's `HostConfig`, never written down twice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Timing {
    /// The lease of the chaos queue.
    pub(crate) lease_s: f64,
    /// Its renewal interval (lease / 3 unless set).
    pub(crate) renew_s: f64,
    /// Its lease-fence grace (lease / 6 unless set).
    pub(crate) fence_grace_s: f64,
    /// The retry delay unit of the chaos queue.
    pub(crate) backoff_base_s: f64,
    /// Heartbeat cadence without the alive-lock.
    pub(crate) fast_s: f64,
    /// Heartbeat cadence while the alive-lock is held.
    pub(crate) slow_s: f64,
    pub(crate) stale_after_s: f64,
    pub(crate) dead_after_s: f64,
    pub(crate) lock_grace_s: f64,
    /// The maintenance sweep's interval.
    pub(crate) sweep_s: f64,
    /// The longest claim poll wait.
    pub(crate) poll_max_s: f64,
    /// The longest drain: the soft stop, then the hard timeout.
    pub(crate) shutdown_s: f64,
}

impl Timing {
    /// The figures of `config` for the chaos queue.
    pub(crate) fn of(config: &HostConfig) -> Timing {
        let secs = |ms: u64| ms as f64 / 1000.0;
        let queue = config.queue_settings(QUEUE);
        let hb = &config.heartbeat;
        let liveness = &config.liveness;
        Timing {
            lease_s: queue.lease.lease.as_secs_f64(),
            renew_s: queue.lease.renewal_interval.as_secs_f64(),
            fence_grace_s: queue.lease.grace.as_secs_f64(),
            backoff_base_s: queue.backoff.base.as_secs_f64(),
            fast_s: secs(hb.fast_interval_ms),
            slow_s: secs(hb.slow_interval_ms),
            stale_after_s: liveness.stale_after.as_secs_f64(),
            // Without the bypass nothing is definitively dead; a day stands for "never".
            dead_after_s: liveness.dead_after.map_or(86_400.0, |d| d.as_secs_f64()),
            lock_grace_s: liveness.lock_grace.map_or(0.0, |g| g.as_secs_f64()),
            sweep_s: secs(config.maintenance.interval_ms),
            poll_max_s: secs(config.claim.poll_max_ms),
            shutdown_s: secs(config.shutdown_soft_timeout_ms + config.shutdown_timeout_ms),
        }
    }

    /// How long after a fault an eviction it causes shows up at the latest, if one is
    /// coming: the liveness cutoff (stale after), the lock grace, two sweeps and a margin.
    /// Scenarios that must show "nobody evicted" watch this long after each fault.
    pub(crate) fn settle_s(&self) -> f64 {
        self.stale_after_s + self.lock_grace_s + 2.0 * self.sweep_s + 5.0
    }

    /// The recovery bound of a process stopped past its lease (paused, partitioned, frozen
    /// inside its fenced transaction), with why: the lease, 1.5 sweeps (the fleet's look for
    /// lapsed leases, taken in turns, then the release), the longest claim poll wait and 2 s.
    pub(crate) fn lapsed_lease_bound(&self) -> (f64, String) {
        (
            self.lease_s + 1.5 * self.sweep_s + self.poll_max_s + 2.0,
            format!(
                "lease {} s + 1.5 sweeps of {} s (the fleet's look for lapsed leases, taken in \
                 turns, sees one within 1.5 sweeps and releases it) + the longest claim poll \
                 wait {} s + 2 s",
                self.lease_s, self.sweep_s, self.poll_max_s
            ),
        )
    }

    /// How long after a worker's server connection comes back its alive-lock, LISTEN and
    /// claims must be back: the reconnect backoff (250 ms doubling, under 10 s) plus one
    /// fast heartbeat interval (the lock is re-taken at least at the fast cadence) and 2 s.
    pub(crate) fn comeback_s(&self) -> f64 {
        10.0 + self.fast_s + 2.0
    }

    /// A deadline for the work of a scenario whose items are due within `spread_s`: the
    /// spread, then room for a lapsed lease and its reclaim, for retries with backoff (up to
    /// the 3rd attempt) and their promotion, twice over, and a minute.
    pub(crate) fn finish_s(&self, spread_s: f64) -> f64 {
        spread_s
            + 2.0 * (self.lease_s + self.poll_max_s + 8.0 * self.backoff_base_s + self.sweep_s)
            + 60.0
    }
}

/// Which settings the workers run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Profile {
    /// [`SHORT_SETTINGS`] over the defaults.
    Short,
    /// The shipped defaults, untouched.
    Defaults,
}

impl Profile {
    /// Every profile, in the order `--profile all` runs them.
    pub(crate) const ALL: [Profile; 2] = [Profile::Short, Profile::Defaults];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Profile::Short => "short",
            Profile::Defaults => "defaults",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Profile> {
        Profile::ALL.into_iter().find(|p| p.label() == s)
    }

    /// The settings the workers run with: the shipped defaults, with the profile's changes.
    pub(crate) fn config(self) -> Result<HostConfig> {
        let mut figment = Figment::from(Serialized::defaults(HostConfig::default()));
        for (key, value) in self.settings() {
            figment = figment.merge((*key, *value));
        }
        figment
            .extract()
            .map_err(|e| format!("the {} profile's settings: {e}", self.label()).into())
    }

    /// The settings this profile changes.
    pub(crate) fn settings(self) -> &'static [(&'static str, u64)] {
        match self {
            Profile::Short => &SHORT_SETTINGS,
            Profile::Defaults => &[],
        }
    }

    /// The same changes as `WORKPUMP_*` variables for the workers.
    pub(crate) fn env(self) -> Vec<(String, String)> {
        worker_env(self.settings())
    }

    pub(crate) fn timing(self) -> Result<Timing> {
        Ok(Timing::of(&self.config()?))
    }
}

/// How to start one worker.
pub(crate) struct WorkerSpec {
    pub(crate) profile: Profile,
    /// The port it connects to: the server's, or a proxy's.
    pub(crate) port: u16,
    /// A standby's port: the worker's URL then lists `port`, then this one, with
    /// `target_session_attrs=read-write`, so that it follows a failover to the standby.
    pub(crate) standby: Option<u16>,
    pub(crate) concurrency: usize,
    /// Extra environment (on top of the profile's).
    pub(crate) env: Vec<(String, String)>,
    /// A note for the report (e.g. "clock +1h").
    pub(crate) label: Option<String>,
}

impl WorkerSpec {
    /// How the harness starts it, on database `db`.
    pub(crate) fn launch(self, db: &str) -> Launch {
        let mut env = self.profile.env();
        env.extend(self.env);
        Launch {
            url: worker_url(self.port, self.standby, db),
            queue: QUEUE.to_owned(),
            concurrency: Some(self.concurrency),
            lease_ms: None,
            env,
            log_filter: "info",
            ledger: true,
            metrics: true,
            label: self.label,
        }
    }

    pub(crate) fn new(profile: Profile, port: u16, concurrency: usize) -> WorkerSpec {
        WorkerSpec {
            profile,
            port,
            standby: None,
            concurrency,
            env: Vec::new(),
            label: None,
        }
    }
}

/// The database URL of a worker: the server (or proxy) at `port`, and after it, when
/// given, a standby, with `target_session_attrs=read-write` (a multi-host URL: the worker
/// follows a failover). The fleet adds the worker's `application_name`.
fn worker_url(port: u16, standby: Option<u16>, db: &str) -> String {
    match standby {
        None => format!("postgres://postgres@127.0.0.1:{port}/{db}"),
        Some(standby) => format!(
            "postgres://postgres@127.0.0.1:{port},127.0.0.1:{standby}/{db}\
             ?target_session_attrs=read-write"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_short_profile_is_a_configuration_the_host_accepts() {
        let config = Profile::Short.config().expect("the short settings load");
        let problems = config.validate([QUEUE]);
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn each_profile_derives_its_figures_from_its_settings() {
        let short = Profile::Short.timing().expect("short");
        assert_eq!(
            (
                short.lease_s,
                short.renew_s,
                short.fence_grace_s,
                short.backoff_base_s
            ),
            (3.0, 1.0, 0.5, 0.1)
        );
        assert_eq!(
            (
                short.fast_s,
                short.slow_s,
                short.stale_after_s,
                short.dead_after_s
            ),
            (1.0, 2.0, 3.0, 12.0)
        );
        assert_eq!(
            (short.lock_grace_s, short.sweep_s, short.shutdown_s),
            (3.0, 1.0, 7.0)
        );
        // The shipped defaults, as docs/guarantees.md states them.
        let defaults = Profile::Defaults.timing().expect("defaults");
        assert_eq!(
            (defaults.lease_s, defaults.fast_s, defaults.slow_s),
            (60.0, 10.0, 60.0)
        );
        assert_eq!(
            (
                defaults.stale_after_s,
                defaults.dead_after_s,
                defaults.lock_grace_s
            ),
            (30.0, 300.0, 3.0)
        );
        assert_eq!((defaults.sweep_s, defaults.poll_max_s), (2.0, 10.0));
        assert_eq!(defaults.settle_s(), 30.0 + 3.0 + 4.0 + 5.0);
    }

    #[test]
    fn a_worker_with_a_standby_gets_a_multi_host_url_that_follows_a_failover() {
        let named = |url: &str, name: &str| crate::harness::fleet::with_application_name(url, name);
        assert_eq!(
            named(&worker_url(5432, None, "chaos_x"), "chaos-w1"),
            "postgres://postgres@127.0.0.1:5432/chaos_x?application_name=chaos-w1"
        );
        let url = named(&worker_url(5432, Some(5433), "chaos_x"), "chaos-w2");
        assert_eq!(
            url,
            "postgres://postgres@127.0.0.1:5432,127.0.0.1:5433/chaos_x\
             ?target_session_attrs=read-write&application_name=chaos-w2"
        );
        let parsed = workpump_coordinator::DatabaseUrl::parse(&url).expect("a libpq URL");
        assert_eq!(parsed.hosts(), ["127.0.0.1:5432", "127.0.0.1:5433"]);
        assert!(parsed.needs_failover());
        assert_eq!(parsed.target_session_attrs().as_str(), "read-write");
    }

    #[test]
    fn the_short_settings_reach_the_workers_as_workpump_variables() {
        let env = Profile::Short.env();
        assert!(env.contains(&(
            "WORKPUMP_HEARTBEAT__FAST_INTERVAL_MS".to_owned(),
            "1000".to_owned()
        )));
        assert!(env.contains(&(
            "WORKPUMP_QUEUES__chaos__LEASE_MS".to_owned(),
            "3000".to_owned()
        )));
        assert!(Profile::Defaults.env().is_empty());
    }
}
