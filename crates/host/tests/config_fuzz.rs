//! Bad configuration: arbitrary numbers for every numeric setting, arbitrary queue names as
//! keys of `[queues]`, and TOML values of the wrong type. `validate()` names every setting it
//! refuses, loading names the field it could not read, nothing panics, a host refuses to
//! start with every problem listed, and a configuration that validates does run: the host
//! starts on the in-memory store, keeps every worker running, and drains.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestCaseResult, TestRunner};
use serde_json::Value;
use workpump_coordinator::{FakeCoordinator, MAX_SCHEDULE_AHEAD};
use workpump_host::{handler_fn, Host, HostConfig, HostError, Job, QueueConfig};

/// The queue the tests' host has a handler for.
const QUEUE: &str = "emails";

/// The numeric settings of the default configuration, as dotted paths (`claim.poll_base_ms`),
/// plus every optional one and the per-queue overrides (absent from the defaults).
fn numeric_settings() -> Vec<String> {
    fn walk(prefix: &str, v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Number(_) => out.push(prefix.to_owned()),
            Value::Object(map) => {
                for (k, v) in map {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&path, v, out);
                }
            }
            _ => {}
        }
    }
    let defaults = serde_json::to_value(HostConfig::default()).expect("serialisable");
    let mut out = Vec::new();
    walk("", &defaults, &mut out);
    for optional in [
        "lease.renewal_interval_ms",
        "lease.grace_ms",
        "lease.max_renewals",
        "lease.max_duration_ms",
        "lease.flush_at",
        "claim.notify_healthy_base_ms",
        "liveness.dead_after_ms",
        "liveness.lock_grace_ms",
    ] {
        if !out.iter().any(|p| p == optional) {
            out.push(optional.to_owned());
        }
    }
    for field in [
        "concurrency",
        "max_attempts",
        "backoff_base_ms",
        "backoff_cap_ms",
        "lease_ms",
        "renewal_interval_ms",
        "grace_ms",
        "max_renewals",
        "max_duration_ms",
        "max_running",
        "rate_limit",
        "rate_period_ms",
    ] {
        out.push(format!("queues.{QUEUE}.{field}"));
    }
    out.sort();
    out
}

/// The default configuration with `path` set to `n`, or the reason serde could not take it
/// (a number too large for the field's type).
fn with_setting(path: &str, n: u64) -> Result<HostConfig, String> {
    let mut v = serde_json::to_value(HostConfig::default()).expect("serialisable");
    let mut at = &mut v;
    let parts: Vec<&str> = path.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        at = at
            .as_object_mut()
            .expect("a table")
            .entry(part.to_string())
            .or_insert_with(|| Value::Object(Default::default()));
    }
    at.as_object_mut()
        .expect("a table")
        .insert(parts[parts.len() - 1].to_owned(), Value::from(n));
    serde_json::from_value(v).map_err(|e| e.to_string())
}

fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => prop::sample::select(vec![
            0,
            1,
            2,
            999,
            1_000,
            60_000,
            86_400_000,
            86_400_001,
            MAX_SCHEDULE_AHEAD.as_millis() as u64,
            MAX_SCHEDULE_AHEAD.as_millis() as u64 + 1,
            i32::MAX as u64,
            u32::MAX as u64,
            u32::MAX as u64 + 1,
            i64::MAX as u64,
            u64::MAX,
        ]),
        1 => any::<u64>(),
        1 => 0u64..100_000,
    ]
}

/// Settings where zero is refused (a few, like `maintenance.depth_sample_interval_ms`, take 0
/// as "off").
const ZERO_REFUSED: &[&str] = &[
    "max_connections",
    "shutdown_timeout_ms",
    "claim.poll_base_ms",
    "claim.poll_max_ms",
    "claim.notify_healthy_base_ms",
    "claim.max_items_per_claim",
    "claim.outcome_batch",
    "lease.lease_ms",
    "lease.renewal_interval_ms",
    "lease.grace_ms",
    "lease.max_renewals",
    "lease.max_batch",
    "lease.window_ms",
    "lease.flush_at",
    "lease.channel_capacity",
    "heartbeat.fast_interval_ms",
    "heartbeat.slow_interval_ms",
    "liveness.stale_after_ms",
    "liveness.dead_after_ms",
    "liveness.lock_grace_ms",
    "maintenance.interval_ms",
    "maintenance.batch_limit",
    "maintenance.max_batches_per_sweep",
    "maintenance.completed_retention_ms",
    "maintenance.dead_retention_ms",
    "maintenance.evicted_retention_ms",
    "maintenance.call_timeout_ms",
    "supervision.restart_base_ms",
    "supervision.max_consecutive_failures",
];

/// Whether a problem's setting is one a user can find: a real path, or a queue's resolved
/// setting.
fn known_setting(setting: &str, settings: &[String]) -> bool {
    settings.iter().any(|s| s == setting)
        || setting == "schema"
        || setting == "handler"
        || setting.starts_with(&format!("queues.{QUEUE}."))
        || setting.starts_with("queues.")
}

#[test]
fn every_numeric_setting_takes_any_number_without_a_panic_and_refusals_name_it() {
    let settings = numeric_settings();
    assert!(
        settings.len() > 40,
        "the walk found the settings: {settings:?}"
    );
    let strategy = (prop::sample::select(settings.clone()), number());
    let mut runner = TestRunner::new(Config {
        cases: 2_000,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |(path, n)| {
        let config = match with_setting(&path, n) {
            Ok(config) => config,
            // Too large for the field's type: serde says so (figment adds the path; see
            // wrong_types_in_a_toml_file_are_refused_naming_the_field).
            Err(e) => {
                prop_assert!(e.contains("invalid value"), "{path} = {n}: {e}");
                return Ok(());
            }
        };
        let problems = config.validate([QUEUE]);
        for p in &problems {
            prop_assert!(
                known_setting(&p.setting, &settings),
                "{path} = {n}: a problem names an unknown setting: {p:?}"
            );
            prop_assert!(!p.reason.is_empty(), "{p:?} has no reason");
        }
        if n == 0 && ZERO_REFUSED.contains(&path.as_str()) {
            prop_assert!(
                problems.iter().any(|p| p.setting == path),
                "{path} = 0 was not refused by name: {problems:?}"
            );
        }
        if n == 0 && path == format!("queues.{QUEUE}.concurrency") {
            prop_assert!(problems.iter().any(|p| p.setting == path), "{problems:?}");
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// A host on a fresh fake store with a handler for [`QUEUE`].
async fn start(config: HostConfig) -> Result<workpump_host::HostHandle, HostError> {
    Host::builder()
        .config(config)
        .coordinator(Arc::new(FakeCoordinator::new()))
        .handler(QUEUE, handler_fn(|_job: Job<Value>| async move { Ok(()) }))
        .start()
        .await
}

/// One case of [`a_configuration_that_validates_runs_and_one_that_does_not_is_refused`].
async fn start_or_refuse(path: String, n: u64) -> TestCaseResult {
    let Ok(config) = with_setting(&path, n) else {
        return Ok(());
    };
    let problems = config.validate([QUEUE]);
    match start(config).await {
        Err(HostError::Config(refused)) => {
            prop_assert!(
                !problems.is_empty(),
                "{path} = {n}: refused, validate() found nothing"
            );
            prop_assert_eq!(
                refused,
                problems,
                "start lists every problem validate() finds"
            );
            Ok(())
        }
        Err(e) => Err(TestCaseError::fail(format!("{path} = {n}: {e}"))),
        Ok(host) => {
            prop_assert!(
                problems.is_empty(),
                "{path} = {n} started despite {problems:?}"
            );
            // Ten seconds of (paused) time: every worker keeps running; a worker that fails
            // or panics on a setting that validated is restarting, and not live.
            tokio::time::sleep(Duration::from_secs(10)).await;
            let health = host.health();
            prop_assert!(
                health.live,
                "{path} = {n} validated, but a worker is not running: {:?}",
                health.workers
            );
            // And it drains (in paused time: the shutdown timeout may be anything it allows).
            host.shutdown();
            let stopped =
                tokio::time::timeout(Duration::from_secs(366 * 86_400), host.stopped()).await;
            prop_assert!(
                matches!(stopped, Ok(Ok(()))),
                "{path} = {n}: the drain ended with {stopped:?}"
            );
            Ok(())
        }
    }
}

#[test]
fn a_configuration_that_validates_runs_and_one_that_does_not_is_refused_at_start() {
    let settings = numeric_settings();
    let strategy = (prop::sample::select(settings), number());
    let mut runner = TestRunner::new(Config {
        cases: 768,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |(path, n)| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        rt.block_on(start_or_refuse(path, n))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Queue names as keys of [queues]

fn queue_key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9][A-Za-z0-9_.:-]{0,20}",
        prop::collection::vec(any::<char>(), 0..40).prop_map(String::from_iter),
        Just(String::new()),
        Just("a b".to_owned()),
        Just("x".repeat(129)),
        Just(QUEUE.to_owned()),
    ]
}

fn queue_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"_.:-".contains(c))
}

#[test]
fn settings_for_an_unknown_or_malformed_queue_name_are_refused_naming_the_queue() {
    let mut runner = TestRunner::new(Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&queue_key(), |key| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        let mut config = HostConfig::default();
        config.queues.insert(
            key.clone(),
            QueueConfig {
                concurrency: Some(2),
                ..QueueConfig::default()
            },
        );
        let problems = config.validate([QUEUE]);
        let prefix = format!("queues.{key}");
        if key == QUEUE {
            prop_assert!(problems.is_empty(), "{problems:?}");
        } else {
            prop_assert!(
                problems
                    .iter()
                    .any(|p| p.setting == prefix && p.reason.contains("no handler")),
                "{key:?}: {problems:?}"
            );
            if !queue_name_ok(&key) {
                prop_assert!(
                    problems
                        .iter()
                        .any(|p| p.setting == prefix && p.reason.contains("queue name")),
                    "{key:?}: {problems:?}"
                );
            }
        }
        // A handler registered under the key itself: a malformed name is refused at start.
        let refused = rt.block_on(async {
            Host::builder()
                .config(HostConfig::default())
                .coordinator(Arc::new(FakeCoordinator::new()))
                .handler(
                    key.clone(),
                    handler_fn(|_job: Job<Value>| async move { Ok(()) }),
                )
                .start()
                .await
        });
        match refused {
            Ok(host) => {
                prop_assert!(queue_name_ok(&key), "a handler for {key:?} started");
                host.shutdown();
                rt.block_on(host.stopped())
                    .map_err(|e| TestCaseError::fail(format!("{key:?}: the drain: {e}")))?;
            }
            Err(HostError::Config(problems)) => {
                prop_assert!(!queue_name_ok(&key), "{key:?} refused: {problems:?}");
                prop_assert!(
                    problems
                        .iter()
                        .any(|p| p.setting == "handler" && p.reason.contains("queue name")),
                    "{problems:?}"
                );
            }
            Err(e) => return Err(TestCaseError::fail(format!("{key:?}: {e}"))),
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// TOML values of the wrong type, through figment

static FILES: AtomicU64 = AtomicU64::new(0);

/// Loads `toml` as the configuration file (defaults, then the file, then the environment).
fn load(toml: &str) -> Result<HostConfig, HostError> {
    let path: PathBuf = std::env::temp_dir().join(format!(
        "workpump-config-fuzz-{}-{}.toml",
        std::process::id(),
        FILES.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, toml).expect("write the config file");
    let loaded = HostConfig::load(Some(&path));
    let _ = std::fs::remove_file(&path);
    loaded
}

/// `section.field = value` as TOML.
fn toml_setting(path: &str, value: &str) -> String {
    match path.rsplit_once('.') {
        Some((section, field)) => format!("[{section}]\n{field} = {value}\n"),
        None => format!("{path} = {value}\n"),
    }
}

#[test]
fn wrong_types_in_a_toml_file_are_refused_naming_the_field() {
    let settings = numeric_settings();
    let wrong = vec![
        "\"fast\"",
        "-1",
        "1.5",
        "true",
        "[1, 2]",
        "{ a = 1 }",
        "1979-05-27T07:32:00Z",
        "-9223372036854775808",
    ];
    let strategy = (prop::sample::select(settings), prop::sample::select(wrong));
    let mut runner = TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |(path, value)| {
        // max_attempts is signed: -1 has the right type (and validate() refuses it).
        if path.ends_with("max_attempts") && value.starts_with('-') {
            return Ok(());
        }
        let field = path.rsplit('.').next().unwrap_or(&path).to_owned();
        match load(&toml_setting(&path, value)) {
            Err(HostError::ConfigLoad(msg)) => {
                let msg = msg.to_string();
                prop_assert!(msg.contains(&field), "{path} = {value}: {msg}");
                Ok(())
            }
            other => Err(TestCaseError::fail(format!(
                "{path} = {value} loaded: {other:?}"
            ))),
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    for (toml, field) in [
        ("[claim]\npoll_bas_ms = 1\n", "poll_bas_ms"),
        ("max_conections = 4\n", "max_conections"),
        ("[queues.emails]\nconcurency = 4\n", "concurency"),
        ("[queues]\nemails = 3\n", "emails"),
        ("[heartbeat]\nliveness = \"sometimes\"\n", "liveness"),
        ("[metrics]\nlisten = \"not an address\"\n", "listen"),
        ("schema = 5\n", "schema"),
        (
            "[lease]\nmax_duration_ms = \"forever\"\n",
            "max_duration_ms",
        ),
        ("max_connections = 4294967296\n", "max_connections"),
        (
            "[claim]\nmax_items_per_claim = 4294967296\n",
            "max_items_per_claim",
        ),
    ] {
        match load(toml) {
            Err(HostError::ConfigLoad(msg)) => {
                let msg = msg.to_string();
                assert!(msg.contains(field), "{toml:?}: {msg}");
            }
            other => panic!("{toml:?} loaded: {other:?}"),
        }
    }
}

#[test]
fn arbitrary_text_as_the_configuration_file_never_panics() {
    let strategy = prop_oneof![
        prop::collection::vec(any::<char>(), 0..200).prop_map(String::from_iter),
        "(\\[[a-z.]{1,20}\\]\n)?[a-z_]{1,20} = [-0-9a-z\"\\[\\]{}.]{0,20}\n",
    ];
    let mut runner = TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |text| {
        match load(&text) {
            Ok(config) => {
                // Whatever loaded is then validated, without a panic either.
                let _problems = config.validate([QUEUE]);
            }
            Err(HostError::ConfigLoad(msg)) => {
                let msg = msg.to_string();
                prop_assert!(!msg.is_empty())
            }
            Err(e) => return Err(TestCaseError::fail(format!("{text:?}: {e}"))),
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Regressions: one deterministic test per bug the properties found

/// Was: accepted; the claim worker then panicked making a semaphore with more permits than
/// tokio allows, on every restart, until the host gave up.
#[test]
fn a_queue_concurrency_beyond_the_limit_is_refused_at_start() {
    for n in [u64::MAX, (usize::MAX >> 3) as u64 + 1, 1_000_001] {
        let config = with_setting(&format!("queues.{QUEUE}.concurrency"), n).expect("a usize");
        let problems = config.validate([QUEUE]);
        assert!(
            problems
                .iter()
                .any(|p| p.setting == format!("queues.{QUEUE}.concurrency")),
            "{n}: {problems:?}"
        );
    }
    let config = with_setting(&format!("queues.{QUEUE}.concurrency"), 1_000_000).expect("ok");
    assert!(config.validate([QUEUE]).is_empty());
}

/// Was: accepted; every retry after a failure then asked fail_work for a delay beyond 100
/// years, which the store refuses, so no failure of the queue was ever recorded.
#[test]
fn a_backoff_cap_beyond_100_years_is_refused_at_start() {
    let limit = MAX_SCHEDULE_AHEAD.as_millis() as u64;
    for n in [u64::MAX, limit + 1] {
        let config = with_setting(&format!("queues.{QUEUE}.backoff_cap_ms"), n).expect("a u64");
        let problems = config.validate([QUEUE]);
        assert!(
            problems
                .iter()
                .any(|p| p.setting == format!("queues.{QUEUE}.backoff_cap_ms")),
            "{n}: {problems:?}"
        );
    }
    let config = with_setting(&format!("queues.{QUEUE}.backoff_cap_ms"), limit).expect("ok");
    assert!(config.validate([QUEUE]).is_empty());
}

/// Was: accepted, and then `start` itself panicked: the renewal channel of that capacity is
/// more than tokio's semaphore allows.
#[test]
fn a_renewal_channel_capacity_beyond_the_limit_is_refused_at_start() {
    for n in [u64::MAX, (usize::MAX >> 3) as u64 + 1, 1_000_001] {
        let config = with_setting("lease.channel_capacity", n).expect("a usize");
        let problems = config.validate([QUEUE]);
        assert!(
            problems
                .iter()
                .any(|p| p.setting == "lease.channel_capacity"),
            "{n}: {problems:?}"
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        match rt.block_on(start(config)) {
            Err(HostError::Config(refused)) => assert_eq!(refused, problems),
            other => panic!("{n}: {:?}", other.map(|_| "started")),
        }
    }
    let config = with_setting("lease.channel_capacity", 1_000_000).expect("ok");
    assert!(config.validate([QUEUE]).is_empty());
}
