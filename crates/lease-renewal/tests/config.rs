//! The lease settings and the `[lease]` config: defaults, parsing and refusals.

use std::time::Duration;

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use workpump_lease_renewal::{LeaseConfig, LeaseSettings};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The settings each problem names.
fn refused(problems: &[workpump_coordinator::ConfigProblem]) -> Vec<&str> {
    problems.iter().map(|p| p.setting.as_str()).collect()
}

#[test]
fn defaults_derive_from_the_lease() {
    let s = LeaseSettings::from_lease(Duration::from_secs(60));
    assert_eq!(s.renewal_interval, Duration::from_secs(20));
    assert_eq!(s.grace, Duration::from_secs(10));
    assert_eq!(s.max_renewals, None);
    assert_eq!(s.max_duration, Some(Duration::from_secs(1800)));
    assert_eq!(LeaseSettings::default(), s);
    let c = LeaseConfig::default();
    assert_eq!(c.settings(), s);
    assert_eq!(
        (c.max_batch, c.window_ms, c.flush_at, c.channel_capacity),
        (200, 200, None, 5000)
    );
    assert!(c.validate("lease").is_empty());
    let short = LeaseConfig {
        lease_ms: 600,
        ..LeaseConfig::default()
    }
    .settings();
    assert_eq!((short.renewal_interval, short.grace), (ms(200), ms(100)));
}

#[test]
fn each_refused_setting_is_named() {
    let ok = LeaseSettings::default();
    let cases: Vec<(LeaseSettings, &str)> = vec![
        (
            LeaseSettings {
                lease: Duration::ZERO,
                ..ok
            },
            "lease.lease_ms",
        ),
        (
            LeaseSettings {
                lease: Duration::from_secs(25 * 3600),
                ..ok
            },
            "lease.lease_ms",
        ),
        (
            LeaseSettings {
                renewal_interval: Duration::ZERO,
                ..ok
            },
            "lease.renewal_interval_ms",
        ),
        (
            LeaseSettings {
                renewal_interval: Duration::from_secs(60),
                ..ok
            },
            "lease.renewal_interval_ms",
        ),
        (
            LeaseSettings {
                grace: Duration::ZERO,
                ..ok
            },
            "lease.grace_ms",
        ),
        (
            // 60 s − 20 s leaves 40 s; a 40 s grace fires the fence as the first renewal goes.
            LeaseSettings {
                grace: Duration::from_secs(40),
                ..ok
            },
            "lease.grace_ms",
        ),
        (
            LeaseSettings {
                max_renewals: Some(0),
                ..ok
            },
            "lease.max_renewals",
        ),
        (
            LeaseSettings {
                max_duration: Some(Duration::ZERO),
                ..ok
            },
            "lease.max_duration_ms",
        ),
    ];
    for (settings, setting) in cases {
        let problems = settings.validate("lease");
        assert_eq!(refused(&problems), vec![setting], "{settings:?}");
        assert!(!problems[0].reason.is_empty());
    }
    // Just inside every bound.
    let edge = LeaseSettings {
        grace: Duration::from_secs(40) - ms(1),
        max_renewals: Some(1),
        max_duration: None,
        ..ok
    };
    assert!(edge.validate("lease").is_empty());
    assert_eq!(
        refused(
            &LeaseSettings {
                grace: Duration::from_secs(40),
                ..ok
            }
            .validate("queues.mail")
        ),
        vec!["queues.mail.grace_ms"]
    );
}

#[test]
fn the_flusher_bounds_are_checked_and_named() {
    let ok = LeaseConfig::default();
    let cases: Vec<(LeaseConfig, &str)> = vec![
        (
            LeaseConfig {
                max_batch: 0,
                flush_at: Some(0),
                ..ok.clone()
            },
            "lease.max_batch",
        ),
        (
            LeaseConfig {
                max_batch: 10_001,
                ..ok.clone()
            },
            "lease.max_batch",
        ),
        (
            LeaseConfig {
                flush_at: Some(0),
                ..ok.clone()
            },
            "lease.flush_at",
        ),
        (
            LeaseConfig {
                flush_at: Some(201),
                ..ok.clone()
            },
            "lease.flush_at",
        ),
        (
            LeaseConfig {
                channel_capacity: 0,
                ..ok.clone()
            },
            "lease.channel_capacity",
        ),
        (
            LeaseConfig {
                window_ms: 0,
                ..ok.clone()
            },
            "lease.window_ms",
        ),
        (
            // 20 s + 30 s reaches the 50 s fence: a request could wait past it.
            LeaseConfig {
                window_ms: 30_000,
                ..ok.clone()
            },
            "lease.window_ms",
        ),
        (
            LeaseConfig {
                renewal_interval_ms: Some(60_000),
                ..ok.clone()
            },
            "lease.renewal_interval_ms",
        ),
    ];
    for (config, setting) in cases {
        let problems = config.validate("lease");
        assert!(
            refused(&problems).first() == Some(&setting),
            "{setting}: {problems:?}"
        );
    }
    // The threshold follows max_batch unless set: lowering max_batch alone is not refused.
    let smaller = LeaseConfig {
        max_batch: 50,
        ..ok.clone()
    };
    assert_eq!(smaller.validate("lease"), Vec::new(), "max_batch 50 alone");
    // Every problem at once.
    let bad = LeaseConfig {
        lease_ms: 0,
        max_renewals: Some(0),
        channel_capacity: 0,
        ..ok
    };
    let problems = bad.validate("lease");
    for setting in [
        "lease.lease_ms",
        "lease.max_renewals",
        "lease.channel_capacity",
    ] {
        assert!(refused(&problems).contains(&setting), "{problems:?}");
    }
}

#[test]
fn the_config_reads_from_toml_with_none_for_max_duration_and_refuses_unknown_keys() {
    let config: LeaseConfig = Figment::from(Serialized::defaults(LeaseConfig::default()))
        .merge(Toml::string(
            r#"
            lease_ms = 600
            renewal_interval_ms = 200
            max_renewals = 6
            max_duration_ms = "none"
            window_ms = 20
            "#,
        ))
        .extract()
        .expect("a valid config");
    assert_eq!(config.max_duration_ms, None);
    let s = config.settings();
    assert_eq!(
        (
            s.lease,
            s.renewal_interval,
            s.grace,
            s.max_renewals,
            s.max_duration
        ),
        (ms(600), ms(200), ms(100), Some(6), None)
    );
    assert!(config.validate("lease").is_empty());

    let defaults: LeaseConfig = Figment::from(Serialized::defaults(LeaseConfig::default()))
        .extract()
        .expect("defaults round-trip");
    assert_eq!(defaults, LeaseConfig::default());
    let none = LeaseConfig {
        max_duration_ms: None,
        ..LeaseConfig::default()
    };
    let round: LeaseConfig = Figment::from(Serialized::defaults(none.clone()))
        .extract()
        .expect("none round-trips");
    assert_eq!(round, none);

    let unknown = Figment::new()
        .merge(Toml::string("lease_secs = 60"))
        .extract::<LeaseConfig>()
        .expect_err("unknown key");
    assert!(unknown.to_string().contains("lease_secs"), "{unknown}");
    let bad = Figment::new()
        .merge(Toml::string(r#"max_duration_ms = "forever""#))
        .extract::<LeaseConfig>()
        .expect_err("bad duration");
    assert!(bad.to_string().contains("none"), "{bad}");
}
