//! Periodic jobs end to end on the throwaway PostgreSQL: several hosts with the same schedule
//! enqueue each fire time exactly once, a stopped fleet misfires as configured, and a changed
//! schedule takes effect without duplicates. Items are counted by the unique key each one
//! carries (`periodic:<name>:<fire time>`); the handler completes them at once, so the unique
//! key alone could not keep a fire time from being enqueued twice.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgPool;
use workpump_host::{handler_fn, Host, HostHandle, Job, Misfire, NewWork, PeriodicJob};
use workpump_scheduler::fire_key;

use support::{database, fast_config, wait_until};

const QUEUE: &str = "ticks";
const NAME: &str = "tick";

fn job(interval: Duration, misfire: Misfire) -> PeriodicJob {
    PeriodicJob::every(
        NAME,
        interval,
        NewWork::new(QUEUE, json!({"from": "periodic"})),
    )
    .expect("a valid job")
    .misfire(misfire)
}

async fn host(url: &str, job: PeriodicJob) -> HostHandle {
    Host::builder()
        .config(fast_config())
        .database_url(url)
        .handler(
            QUEUE,
            handler_fn(|_job: Job<serde_json::Value>| async move { Ok(()) }),
        )
        .periodic(job)
        .start()
        .await
        .expect("the host starts")
}

async fn stop(hosts: &[HostHandle]) {
    for h in hosts {
        h.shutdown();
    }
    for h in hosts {
        h.stopped().await.expect("a clean stop");
    }
}

async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .expect("the database's now")
}

/// Unique key → how many items carry it, every item of the queue counted (finished or not).
async fn items_by_key(pool: &PgPool) -> BTreeMap<String, i64> {
    let rows: Vec<(Option<String>, i64)> = sqlx::query_as(
        "SELECT unique_key, count(*) FROM workpump.work_all WHERE queue = $1 GROUP BY unique_key",
    )
    .bind(QUEUE)
    .fetch_all(pool)
    .await
    .expect("count the items");
    rows.into_iter()
        .map(|(k, n)| (k.expect("a periodic item has a unique key"), n))
        .collect()
}

/// The fire time a key names.
fn fire_time(key: &str) -> DateTime<Utc> {
    let at = key
        .strip_prefix(&format!("periodic:{NAME}:"))
        .unwrap_or_else(|| panic!("a periodic key: {key}"));
    DateTime::parse_from_rfc3339(at)
        .expect("an RFC 3339 time")
        .with_timezone(&Utc)
}

/// The keys of `job`'s fire times in `(after, until]`.
fn keys_between(job: &PeriodicJob, after: DateTime<Utc>, until: DateTime<Utc>) -> Vec<String> {
    job.fire_times(after, until)
        .map(|t| fire_key(job.name(), t))
        .collect()
}

/// Items whose fire time is later than `after`.
async fn fired_after(pool: &PgPool, after: DateTime<Utc>) -> usize {
    items_by_key(pool)
        .await
        .keys()
        .filter(|k| fire_time(k) > after)
        .count()
}

fn assert_each_once(items: &BTreeMap<String, i64>) {
    let doubled: Vec<_> = items.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        doubled.is_empty(),
        "fire times enqueued more than once: {doubled:?}"
    );
}

#[tokio::test]
async fn three_hosts_with_a_one_second_schedule_enqueue_each_fire_time_exactly_once() {
    let (db, pool) = database().await;
    let job = job(Duration::from_secs(1), Misfire::Skip);
    let hosts = vec![
        host(db.url(), job.clone()).await,
        host(db.url(), job.clone()).await,
        host(db.url(), job.clone()).await,
    ];
    let start = db_now(&pool).await;
    let end = start + chrono::Duration::seconds(20);
    wait_until(
        Duration::from_secs(60),
        "20 s of the database's clock",
        || async { db_now(&pool).await >= end },
    )
    .await;
    stop(&hosts).await;
    let items = items_by_key(&pool).await;
    assert_each_once(&items);
    let first = items.keys().map(|k| fire_time(k)).min().expect("items");
    let last = items.keys().map(|k| fire_time(k)).max().expect("items");
    // None missing between the first and the last.
    let want = keys_between(&job, first - chrono::Duration::milliseconds(1), last);
    assert_eq!(items.keys().cloned().collect::<Vec<_>>(), want);
    assert!(
        (19..=23).contains(&items.len()),
        "about one item a second for 20 s: {}",
        items.len()
    );
    assert!(
        first <= start + chrono::Duration::seconds(2),
        "started at once: {first}"
    );
}

/// Runs two hosts until two items exist, stops them across at least three fire times of a
/// 2 s schedule, starts two again early in a period, and returns the fire-time keys missed
/// while stopped and the keys in the store.
async fn stop_the_fleet_across_fire_times(
    misfire: Misfire,
) -> (Vec<String>, BTreeMap<String, i64>) {
    let (db, pool) = database().await;
    let job = job(Duration::from_secs(2), misfire);
    let fleet = vec![
        host(db.url(), job.clone()).await,
        host(db.url(), job.clone()).await,
    ];
    wait_until(
        Duration::from_secs(30),
        "two fire times enqueued",
        || async { items_by_key(&pool).await.len() >= 2 },
    )
    .await;
    stop(&fleet).await;
    let last = items_by_key(&pool)
        .await
        .keys()
        .map(|k| fire_time(k))
        .max()
        .expect("items");
    // Stopped for three fire times or more; restart 50 to 500 ms into a period, so the
    // restarted fleet's first look at the store is in the same period as `restarted`.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let restarted = loop {
        let now = db_now(&pool).await;
        let phase = now.timestamp_millis().rem_euclid(2_000);
        if now >= last + chrono::Duration::seconds(7) && (50..500).contains(&phase) {
            break now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for three fire times later, early in a period"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let fleet = vec![
        host(db.url(), job.clone()).await,
        host(db.url(), job.clone()).await,
    ];
    wait_until(
        Duration::from_secs(30),
        "two fire times after the restart",
        || async { fired_after(&pool, restarted).await >= 2 },
    )
    .await;
    stop(&fleet).await;
    let missed = keys_between(&job, last, restarted);
    assert!(missed.len() >= 3, "{missed:?}");
    let items = items_by_key(&pool).await;
    assert_each_once(&items);
    (missed, items)
}

#[tokio::test]
async fn a_stopped_fleet_with_misfire_skip_enqueues_none_of_the_missed_fire_times() {
    let (missed, items) = stop_the_fleet_across_fire_times(Misfire::Skip).await;
    let run: Vec<&String> = missed.iter().filter(|k| items.contains_key(*k)).collect();
    assert!(run.is_empty(), "missed fire times were enqueued: {run:?}");
}

#[tokio::test]
async fn a_stopped_fleet_with_misfire_run_once_enqueues_exactly_the_latest_missed_fire_time() {
    let (missed, items) = stop_the_fleet_across_fire_times(Misfire::RunOnce).await;
    let run: Vec<&String> = missed.iter().filter(|k| items.contains_key(*k)).collect();
    assert_eq!(run, vec![missed.last().expect("missed")], "{items:?}");
}

#[tokio::test]
async fn a_changed_schedule_takes_effect_without_duplicates_through_a_rolling_deploy() {
    let (db, pool) = database().await;
    let old = job(Duration::from_secs(2), Misfire::RunOnce);
    let new = job(Duration::from_secs(1), Misfire::RunOnce);
    let a = host(db.url(), old.clone()).await;
    wait_until(
        Duration::from_secs(30),
        "two fire times of the old schedule",
        || async { items_by_key(&pool).await.len() >= 2 },
    )
    .await;
    // The rolling deploy: a new instance beside the old one, then the old one stops.
    let b = host(db.url(), new.clone()).await;
    let deployed = db_now(&pool).await;
    wait_until(Duration::from_secs(30), "both run side by side", || async {
        fired_after(&pool, deployed).await >= 3
    })
    .await;
    stop(std::slice::from_ref(&a)).await;
    let old_gone = db_now(&pool).await;
    wait_until(
        Duration::from_secs(30),
        "the new schedule alone",
        || async { fired_after(&pool, old_gone).await >= 3 },
    )
    .await;
    stop(std::slice::from_ref(&b)).await;

    let items = items_by_key(&pool).await;
    assert_each_once(&items);
    let times: Vec<DateTime<Utc>> = items.keys().map(|k| fire_time(k)).collect();
    // Before the deploy: the old schedule's fire times (even seconds only).
    assert!(times
        .iter()
        .filter(|t| **t <= deployed)
        .all(|t| t.timestamp_millis() % 2_000 == 0));
    // After it: every second, none missing, from the first fire time after the deploy.
    let first_new = *times
        .iter()
        .find(|t| **t > deployed)
        .expect("new fire times");
    let last = *times.last().expect("items");
    let want = keys_between(&new, first_new - chrono::Duration::milliseconds(1), last);
    let got: Vec<String> = items
        .keys()
        .filter(|k| fire_time(k) >= first_new)
        .cloned()
        .collect();
    assert_eq!(got, want);
    assert!(times
        .iter()
        .any(|t| *t > deployed && t.timestamp_millis() % 2_000 != 0));
    let fingerprint: String =
        sqlx::query_scalar("SELECT fingerprint FROM workpump.periodic_schedules WHERE name = $1")
            .bind(NAME)
            .fetch_one(&pool)
            .await
            .expect("the schedule's row");
    assert_eq!(fingerprint, new.fingerprint());
}

#[tokio::test]
async fn a_bad_periodic_declaration_is_refused_at_start_naming_the_setting() {
    let mut config = fast_config();
    config.periodic.insert(
        "bad-cron".into(),
        workpump_host::PeriodicConfig {
            queue: Some(QUEUE.into()),
            cron: Some("0 25 * * *".into()),
            ..Default::default()
        },
    );
    config.periodic.insert(
        "bad-zone".into(),
        workpump_host::PeriodicConfig {
            queue: Some(QUEUE.into()),
            cron: Some("0 3 * * *".into()),
            timezone: Some("Europe/Atlantis".into()),
            ..Default::default()
        },
    );
    config.periodic.insert(
        "elsewhere".into(),
        workpump_host::PeriodicConfig {
            queue: Some("nobody-declares-this".into()),
            interval_ms: Some(60_000),
            ..Default::default()
        },
    );
    config.periodic.insert(
        NAME.into(),
        workpump_host::PeriodicConfig {
            queue: Some(QUEUE.into()),
            interval_ms: Some(60_000),
            ..Default::default()
        },
    );
    let err = Host::builder()
        .config(config)
        .database_url("postgres://nobody@127.0.0.1:1/never")
        .handler(
            QUEUE,
            handler_fn(|_job: Job<serde_json::Value>| async move { Ok(()) }),
        )
        // The same name in code and in [periodic.tick].
        .periodic(job(Duration::from_secs(1), Misfire::Skip))
        // A queue this host does not declare.
        .periodic(
            PeriodicJob::every(
                "orphan",
                Duration::from_secs(5),
                NewWork::new("other", json!({})),
            )
            .expect("valid"),
        )
        .start()
        .await
        .err()
        .expect("refused");
    let workpump_host::HostError::Config(problems) = err else {
        panic!("a configuration error, got {err}");
    };
    let text: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
    let has = |prefix: &str, needle: &str| {
        assert!(
            text.iter()
                .any(|t| t.starts_with(prefix) && t.contains(needle)),
            "no problem {prefix} … {needle} in {text:#?}"
        )
    };
    has("periodic.bad-cron.cron: ", "cron expression \"0 25 * * *\"");
    has(
        "periodic.bad-zone.timezone: ",
        "unknown time zone \"Europe/Atlantis\"",
    );
    has(
        "periodic.elsewhere.queue: ",
        "\"nobody-declares-this\" is not declared by this host",
    );
    has("periodic.tick: ", "declared more than once");
    has(
        "periodic(\"orphan\").queue: ",
        "\"other\" is not declared by this host",
    );
    assert_eq!(problems.len(), 5, "{text:#?}");
}
