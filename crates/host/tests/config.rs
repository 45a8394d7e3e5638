//! The configuration's own rules, without a store: the one `[liveness]` section, the cutoff
//! keys that moved there from `[heartbeat]` and `[maintenance]`, and one problem per bad
//! key (each bound is checked in one place).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use workpump_coordinator::MAX_SCHEDULE_AHEAD;
use workpump_host::{HostConfig, HostError, Liveness, QueueConfig};

/// The queue the configurations below have a handler for.
const QUEUE: &str = "emails";

static FILES: AtomicU64 = AtomicU64::new(0);

/// Loads `toml` as the configuration file (defaults, then the file, then the environment).
fn load(toml: &str) -> Result<HostConfig, HostError> {
    let path: PathBuf = std::env::temp_dir().join(format!(
        "workpump-config-{}-{}.toml",
        std::process::id(),
        FILES.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, toml).expect("write the config file");
    let loaded = HostConfig::load(Some(&path));
    let _ = std::fs::remove_file(&path);
    loaded
}

#[test]
fn the_liveness_section_holds_the_cutoffs_with_none_for_a_rule_turned_off() {
    let config = load(
        "[liveness]\nstale_after_ms = 40000\ndead_after_ms = \"none\"\nlock_grace_ms = 1500\n",
    )
    .expect("loads");
    assert_eq!(
        config.liveness,
        Liveness {
            stale_after: Duration::from_secs(40),
            dead_after: None,
            lock_grace: Some(Duration::from_millis(1_500)),
        }
    );
    assert!(config.validate([QUEUE]).is_empty());
    // Absent, the defaults: 30 s, 5 min, 3 s.
    let config = load("[heartbeat]\nfast_interval_ms = 5000\n").expect("loads");
    assert_eq!(config.liveness, Liveness::default());
    assert_eq!(
        (
            config.liveness.stale_after,
            config.liveness.dead_after,
            config.liveness.lock_grace
        ),
        (
            Duration::from_secs(30),
            Some(Duration::from_secs(300)),
            Some(Duration::from_secs(3))
        )
    );
    // A typo in it is refused, naming the key.
    match load("[liveness]\nstale_after = 40000\n") {
        Err(HostError::ConfigLoad(msg)) => {
            let msg = msg.to_string();
            assert!(msg.contains("stale_after"), "{msg}")
        }
        other => panic!("loaded: {other:?}"),
    }
}

#[test]
fn the_health_section_sets_where_the_endpoints_listen_and_a_bad_address_is_refused_by_key() {
    assert_eq!(
        load("").expect("loads").health.listen,
        None,
        "off by default"
    );
    let config = load("[health]\nlisten = \"0.0.0.0:9091\"\n").expect("loads");
    assert_eq!(
        config.health.listen,
        Some(std::net::SocketAddr::from(([0, 0, 0, 0], 9091)))
    );
    match load("[health]\nlisten = \"port 9091\"\n") {
        Err(HostError::ConfigLoad(msg)) => {
            let msg = msg.to_string();
            assert!(msg.contains("health.listen"), "{msg}")
        }
        other => panic!("loaded: {other:?}"),
    }
}

#[test]
fn a_cutoff_still_set_in_heartbeat_or_maintenance_is_refused_naming_its_new_key() {
    for section in ["heartbeat", "maintenance"] {
        for key in ["stale_after_ms", "dead_after_ms", "lock_grace_ms"] {
            let toml = format!("[{section}]\n{key} = 30000\n");
            match load(&toml) {
                Err(HostError::ConfigLoad(msg)) => {
                    let msg = msg.to_string();
                    let moved = format!("{section}.{key} moved to liveness.{key}");
                    assert!(msg.contains(&moved), "{toml:?}: {msg}");
                    assert!(
                        !msg.contains("unknown field"),
                        "not serde's bare message: {msg}"
                    );
                }
                other => panic!("{toml:?} loaded: {other:?}"),
            }
        }
    }
    // Several at once are named together.
    match load("[heartbeat]\nstale_after_ms = 30000\ndead_after_ms = \"none\"\n") {
        Err(HostError::ConfigLoad(msg)) => {
            let msg = msg.to_string();
            assert!(
                msg.contains("heartbeat.stale_after_ms moved to liveness.stale_after_ms")
                    && msg.contains("heartbeat.dead_after_ms moved to liveness.dead_after_ms"),
                "{msg}"
            );
        }
        other => panic!("loaded: {other:?}"),
    }
    // The rest of the sections still read, and other mistakes in them are still named.
    match load("[heartbeat]\nfast_interval = 5000\n") {
        Err(HostError::ConfigLoad(msg)) => {
            let msg = msg.to_string();
            assert!(msg.contains("fast_interval"), "{msg}")
        }
        other => panic!("loaded: {other:?}"),
    }
    let config = load("[maintenance]\ninterval_ms = 1000\n").expect("loads");
    assert_eq!(config.maintenance.interval_ms, 1_000);
}

/// The default configuration, with a handler for [`QUEUE`], changed by `set`.
fn with(set: impl FnOnce(&mut HostConfig)) -> HostConfig {
    let mut config = HostConfig::default();
    set(&mut config);
    config
}

fn queue(set: impl FnOnce(&mut QueueConfig)) -> HostConfig {
    with(|c| {
        let mut q = QueueConfig::default();
        set(&mut q);
        c.queues.insert(QUEUE.to_owned(), q);
    })
}

#[test]
fn one_bad_key_is_one_problem_naming_it() {
    let ms = Duration::from_millis;
    let cases: Vec<(&str, HostConfig)> = vec![
        (
            "queues.emails.concurrency",
            queue(|q| q.concurrency = Some(0)),
        ),
        (
            "queues.emails.concurrency",
            queue(|q| q.concurrency = Some(1_000_001)),
        ),
        (
            "queues.emails.concurrency",
            queue(|q| q.concurrency = Some(usize::MAX)),
        ),
        (
            "queues.emails.backoff_cap_ms",
            queue(|q| q.backoff_cap_ms = Some(MAX_SCHEDULE_AHEAD.as_millis() as u64 + 1)),
        ),
        (
            "queues.emails.backoff_cap_ms",
            queue(|q| q.backoff_cap_ms = Some(u64::MAX)),
        ),
        (
            "queues.emails.max_running",
            queue(|q| q.max_running = Some(0)),
        ),
        (
            "queues.emails.max_running",
            queue(|q| q.max_running = Some(1_000_001)),
        ),
        (
            "queues.emails.rate_period_ms",
            queue(|q| q.rate_limit = Some(10)),
        ),
        (
            "queues.emails.rate_limit",
            queue(|q| q.rate_period_ms = Some(1_000)),
        ),
        (
            "queues.emails.rate_limit",
            queue(|q| {
                q.rate_limit = Some(0);
                q.rate_period_ms = Some(1_000);
            }),
        ),
        (
            "queues.emails.rate_period_ms",
            queue(|q| {
                q.rate_limit = Some(5);
                q.rate_period_ms = Some(0);
            }),
        ),
        (
            "queues.emails.rate_period_ms",
            queue(|q| {
                q.rate_limit = Some(5);
                q.rate_period_ms = Some(86_400_001);
            }),
        ),
        (
            "lease.channel_capacity",
            with(|c| c.lease.channel_capacity = 0),
        ),
        (
            "lease.channel_capacity",
            with(|c| c.lease.channel_capacity = 1_000_001),
        ),
        (
            "lease.channel_capacity",
            with(|c| c.lease.channel_capacity = usize::MAX),
        ),
        (
            "liveness.stale_after_ms",
            with(|c| c.liveness.stale_after = Duration::ZERO),
        ),
        (
            "liveness.stale_after_ms",
            with(|c| c.liveness.stale_after = ms(999)),
        ),
        (
            "liveness.stale_after_ms",
            with(|c| c.liveness.stale_after = ms(86_400_001)),
        ),
        (
            "liveness.stale_after_ms",
            with(|c| c.liveness.stale_after = ms(19_999)),
        ),
        (
            "liveness.dead_after_ms",
            with(|c| c.liveness.dead_after = Some(ms(1_999))),
        ),
        (
            "liveness.dead_after_ms",
            with(|c| c.liveness.dead_after = Some(ms(86_400_001))),
        ),
        (
            "liveness.dead_after_ms",
            with(|c| c.liveness.dead_after = Some(ms(120_000))),
        ),
        (
            "liveness.lock_grace_ms",
            with(|c| c.liveness.lock_grace = Some(ms(499))),
        ),
        (
            "liveness.lock_grace_ms",
            with(|c| c.liveness.lock_grace = Some(ms(86_400_001))),
        ),
        (
            "heartbeat.fast_interval_ms",
            with(|c| c.heartbeat.fast_interval_ms = 0),
        ),
        (
            "heartbeat.slow_interval_ms",
            with(|c| c.heartbeat.slow_interval_ms = 0),
        ),
        (
            "maintenance.evicted_retention_ms",
            with(|c| c.maintenance.evicted_retention_ms = 299_999),
        ),
    ];
    for (key, config) in cases {
        let problems = config.validate([QUEUE]);
        assert_eq!(problems.len(), 1, "{key}: {problems:#?}");
        assert_eq!(problems[0].setting, key, "{problems:#?}");
        assert!(!problems[0].reason.is_empty());
    }
}

#[test]
fn the_cadence_rules_name_the_liveness_key_they_bind() {
    let config = with(|c| c.heartbeat.fast_interval_ms = 20_000);
    let problems = config.validate([QUEUE]);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].setting, "liveness.stale_after_ms");
    for part in ["heartbeat.fast_interval_ms", "30000", "20000"] {
        assert!(problems[0].reason.contains(part), "{}", problems[0].reason);
    }
    let config = with(|c| c.heartbeat.slow_interval_ms = 150_000);
    let problems = config.validate([QUEUE]);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].setting, "liveness.dead_after_ms");
    assert!(problems[0].reason.contains("heartbeat.slow_interval_ms"));
    // The same slow cadence is fine without the alive-lock, or without the bypass.
    let table_only = with(|c| {
        c.heartbeat.slow_interval_ms = 150_000;
        c.heartbeat.liveness = workpump_host::LivenessMode::HeartbeatTableOnly;
    });
    assert!(table_only.validate([QUEUE]).is_empty());
    let no_bypass = with(|c| {
        c.heartbeat.slow_interval_ms = 150_000;
        c.liveness.dead_after = None;
    });
    assert!(no_bypass.validate([QUEUE]).is_empty());
}
