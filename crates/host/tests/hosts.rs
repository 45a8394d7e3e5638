//! End-to-end: several hosts in one test process on the throwaway PostgreSQL, each built
//! with `Host::builder()` the way a service embeds it. (Hosts in separate processes, killed
//! and terminated, are tested in `examples/tests/processes.rs`, where the worker binary is.)

mod support;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use sqlx::types::Uuid;
use tokio_util::sync::CancellationToken;
use workpump_coordinator::{CancelReason, ConfigProblem, WorkerError};
use workpump_host::{
    handler_fn, Host, HostConfig, HostError, HostHandle, Job, JobError, NewWork, QueueConfig,
    Worker,
};

use support::{
    count_state, database, fast_config, outcome_writers, recorded_twice, seasoned_judge, wait_until,
};

/// Handlers that were cancelled: (item, why).
type Cancelled = Arc<Mutex<Vec<(i64, Option<CancelReason>)>>>;

/// Who ran what: (queue, item, instance), one entry per handler run.
type Runs = Arc<Mutex<Vec<(String, i64, Uuid)>>>;

fn recording(runs: &Runs) -> impl workpump_host::Handler<Payload = serde_json::Value> {
    let runs = runs.clone();
    handler_fn(move |job: Job<serde_json::Value>| {
        let runs = runs.clone();
        async move {
            runs.lock()
                .expect("runs")
                .push((job.queue().to_owned(), job.id(), job.instance().0));
            Ok(())
        }
    })
}

async fn wait_ready(host: &HostHandle) {
    wait_until(Duration::from_secs(15), "the host is ready", || async {
        host.health().ready
    })
    .await;
}

#[tokio::test]
async fn several_hosts_in_one_process_share_the_work_and_record_each_outcome_once() {
    let (db, pool) = database().await;
    let runs: Runs = Arc::default();
    // Three hosts on one database, with different queues and flags: A serves both queues,
    // B only beta, C only alpha and does not LISTEN (it polls).
    let a = Host::builder()
        .config(fast_config())
        .database_url(db.url())
        .handler("alpha", recording(&runs))
        .handler("beta", recording(&runs))
        .start()
        .await
        .expect("host A starts");
    let b = Host::builder()
        .config(fast_config())
        .database_url(db.url())
        .handler("beta", recording(&runs))
        .start()
        .await
        .expect("host B starts");
    let mut polling = fast_config();
    polling.claim.listen = false;
    let c = Host::builder()
        .config(polling)
        .database_url(db.url())
        .handler("alpha", recording(&runs))
        .start()
        .await
        .expect("host C starts");
    for host in [&a, &b, &c] {
        wait_ready(host).await;
    }
    let instances: BTreeSet<Uuid> = [&a, &b, &c].iter().map(|h| h.instance().0).collect();
    assert_eq!(instances.len(), 3, "each host is an instance of its own");

    let items: Vec<NewWork> = (0..300)
        .map(|n| NewWork::new(if n % 2 == 0 { "alpha" } else { "beta" }, json!({ "n": n })))
        .collect();
    a.enqueue_many(items).await.expect("enqueue");
    wait_until(
        Duration::from_secs(30),
        "all 300 items completed",
        || async { count_state(&pool, "completed").await == 300 },
    )
    .await;

    let runs = runs.lock().expect("runs").clone();
    assert_eq!(runs.len(), 300, "each item's handler ran once");
    let (a_id, b_id, c_id) = (a.instance().0, b.instance().0, c.instance().0);
    for (queue, item, instance) in &runs {
        let allowed = if queue == "alpha" {
            [a_id, c_id]
        } else {
            [a_id, b_id]
        };
        assert!(
            allowed.contains(instance),
            "item {item} of {queue} ran on {instance}, which has no handler for it"
        );
    }
    assert_eq!(recorded_twice(&pool).await, 0);
    let writers = outcome_writers(&pool).await;
    assert_eq!(writers.len(), 300, "one recorded outcome per item");
    let ran_on: HashMap<i64, Uuid> = runs.iter().map(|(_, i, who)| (*i, *who)).collect();
    for (item, writer) in writers {
        assert_eq!(
            writer,
            ran_on.get(&item).copied(),
            "item {item}'s outcome was recorded by the instance that ran it"
        );
    }

    for host in [&a, &b, &c] {
        host.shutdown();
    }
    for host in [&a, &b, &c] {
        host.stopped().await.expect("a clean drain");
    }
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM workpump.instances")
        .fetch_one(&pool)
        .await
        .expect("count instances");
    assert_eq!(
        left, 0,
        "every host deleted its instance row on the way out"
    );
    pool.close().await;
    db.drop_database().await.expect("drop");
}

#[tokio::test]
async fn enqueue_right_after_start_on_a_fresh_database_waits_for_the_migrations() {
    // The quick start's order of calls: start, then enqueue at once, while the host is still
    // migrating the empty database in the background.
    let db = workpump_testdb::server()
        .await
        .expect("the test PostgreSQL")
        .create_database()
        .await
        .expect("a fresh database");
    let host = Host::builder()
        .config(fast_config())
        .database_url(db.url())
        .handler(
            "emails",
            handler_fn(|_job: Job<serde_json::Value>| async { Ok(()) }),
        )
        .start()
        .await
        .expect("start");
    let out = host
        .enqueue_many(vec![NewWork::new("emails", json!({ "to": "a@b.c" }))])
        .await
        .expect("the enqueue waits for the schema instead of failing");
    assert_eq!(out.items.len(), 1);
    let pool = db.pool().await.expect("pool");
    wait_until(Duration::from_secs(15), "the item completed", || async {
        count_state(&pool, "completed").await == 1
    })
    .await;
    host.shutdown();
    host.stopped().await.expect("a clean drain");
    pool.close().await;
    db.drop_database().await.expect("drop");
}

#[tokio::test]
async fn a_host_on_a_multi_host_url_whose_first_host_is_down_works_on_the_second() {
    let server = workpump_testdb::server()
        .await
        .expect("the test PostgreSQL");
    let Some(cluster) = server.cluster() else {
        eprintln!("skipped: DATABASE_URL is set, and its host list is its owner's");
        return;
    };
    let db = server.create_database().await.expect("a fresh database");
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let mut config = fast_config();
    config.database_url = Some(format!(
        "postgres://postgres@127.0.0.1:{down},127.0.0.1:{}/{}?target_session_attrs=read-write",
        cluster.port(),
        db.name()
    ));
    let host = Host::builder()
        .config(config)
        .handler(
            "emails",
            handler_fn(|_job: Job<serde_json::Value>| async { Ok(()) }),
        )
        .start()
        .await
        .expect("start");
    host.enqueue_many(vec![NewWork::new("emails", json!({ "to": "a@b.c" }))])
        .await
        .expect("enqueue");
    wait_ready(&host).await;
    let health = host.health();
    assert!(
        health.alive_lock_held && health.listener_healthy,
        "{health}"
    );
    let pool = db.pool().await.expect("pool");
    wait_until(Duration::from_secs(15), "the item completed", || async {
        count_state(&pool, "completed").await == 1
    })
    .await;
    host.shutdown();
    host.stopped().await.expect("a clean drain");
    pool.close().await;
    db.drop_database().await.expect("drop");
}

#[tokio::test]
async fn a_malformed_or_read_only_database_url_is_refused_at_start_naming_the_setting() {
    for (url, reason) in [
        (
            "postgres://app@10.0.0.1:5432,10.0.0.2:x/app?target_session_attrs=read-write",
            "host 2 of 2 (\"10.0.0.2:x\"): the port \"x\" is not a number from 1 to 65535",
        ),
        (
            "postgres://app@10.0.0.1,10.0.0.2/app?target_session_attrs=readwrite",
            "target_session_attrs=\"readwrite\" is not one of any, read-write",
        ),
        (
            "postgres://app@10.0.0.1,10.0.0.2/app?target_session_attrs=standby",
            "target_session_attrs=standby reaches servers whose sessions are read-only",
        ),
    ] {
        // From the configuration, and from the builder.
        let config = HostConfig {
            database_url: Some(url.to_owned()),
            ..HostConfig::default()
        };
        for builder in [
            Host::builder().config(config),
            Host::builder().database_url(url),
        ] {
            let result = builder
                .handler(
                    "emails",
                    handler_fn(|_job: Job<serde_json::Value>| async { Ok(()) }),
                )
                .start()
                .await;
            let Err(HostError::Config(problems)) = result else {
                panic!("{url} must be refused at start");
            };
            assert_eq!(problems.len(), 1, "{problems:#?}");
            assert_eq!(problems[0].setting, "database_url");
            assert!(problems[0].reason.contains(reason), "{problems:#?}");
        }
    }
}

/// A host that does not claim — claiming switched off (an enqueue-only service), or no
/// handlers at all (maintenance only) — is ready once its store is migrated and its
/// heartbeat answers: there is no claim registration to wait for.
#[tokio::test]
async fn a_host_that_does_not_claim_is_ready_once_its_store_is_migrated_and_reachable() {
    let db = workpump_testdb::server()
        .await
        .expect("the test PostgreSQL")
        .create_database()
        .await
        .expect("a fresh database");
    let mut enqueue_only = fast_config();
    enqueue_only.claim.enabled = false;
    let a = Host::builder()
        .config(enqueue_only)
        .database_url(db.url())
        .handler(
            "emails",
            handler_fn(|_job: Job<serde_json::Value>| async { Ok(()) }),
        )
        .start()
        .await
        .expect("the enqueue-only host starts");
    let b = Host::builder()
        .config(fast_config())
        .database_url(db.url())
        .start()
        .await
        .expect("the host without handlers starts");
    for host in [&a, &b] {
        wait_ready(host).await;
        let health = host.health();
        assert!(
            health.schema_ready && health.heartbeat_fresh && !health.stopping,
            "{health:?}"
        );
    }
    let out = a
        .enqueue_many(vec![NewWork::new("emails", json!({ "to": "a@b.c" }))])
        .await
        .expect("enqueue");
    let pool = db.pool().await.expect("pool");
    assert_eq!(count_state(&pool, "available").await, 1);
    assert!(out.items[0].inserted);
    for host in [&a, &b] {
        host.shutdown();
        host.stopped().await.expect("a clean stop");
    }
    pool.close().await;
    db.drop_database().await.expect("drop");
}

/// With its heartbeat switched off an instance never registers, so it is never ready and
/// claims nothing (the heartbeat killswitch's documented meaning): host A runs without a
/// heartbeat beside host B, both handling one queue; every item is run by B, although A's
/// claim loop polled all along (A is started first and the work lasts many of its polls).
#[tokio::test]
async fn a_host_with_its_heartbeat_switched_off_is_never_ready_and_claims_nothing() {
    let (db, pool) = database().await;
    let runs: Runs = Arc::default();
    let mut silent = fast_config();
    silent.heartbeat.enabled = false;
    let a = Host::builder()
        .config(silent)
        .database_url(db.url())
        .handler("alpha", recording(&runs))
        .start()
        .await
        .expect("host A starts");
    wait_until(
        Duration::from_secs(15),
        "host A's schema is ready",
        || async { a.health().schema_ready },
    )
    .await;

    let mut one_at_a_time = fast_config();
    one_at_a_time.queues.insert(
        "alpha".to_owned(),
        QueueConfig {
            concurrency: Some(1),
            ..QueueConfig::default()
        },
    );
    let slow_runs = runs.clone();
    let b = Host::builder()
        .config(one_at_a_time)
        .database_url(db.url())
        .handler(
            "alpha",
            handler_fn(move |job: Job<serde_json::Value>| {
                let runs = slow_runs.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    runs.lock().expect("runs").push((
                        job.queue().to_owned(),
                        job.id(),
                        job.instance().0,
                    ));
                    Ok(())
                }
            }),
        )
        .start()
        .await
        .expect("host B starts");
    wait_ready(&b).await;
    let items = 60;
    b.enqueue_many((0..items).map(|i| NewWork::new("alpha", json!({ "i": i }))))
        .await
        .expect("enqueue");
    wait_until(Duration::from_secs(30), "every item completed", || async {
        count_state(&pool, "completed").await == items
    })
    .await;

    let runs = runs.lock().expect("runs").clone();
    assert_eq!(runs.len(), items as usize, "{runs:?}");
    let b_instance = b.health().instance.0;
    assert!(
        runs.iter().all(|(_, _, instance)| *instance == b_instance),
        "only B runs items: {runs:?}"
    );
    let health = a.health();
    assert!(health.schema_ready && !health.ready, "{health:?}");
    let registered: i64 =
        sqlx::query_scalar("SELECT count(*) FROM workpump.instances WHERE instance_id = $1")
            .bind(health.instance.0)
            .fetch_one(&pool)
            .await
            .expect("count");
    assert_eq!(registered, 0, "A never registered");
    for host in [&a, &b] {
        host.shutdown();
        host.stopped().await.expect("a clean stop");
    }
    pool.close().await;
    db.drop_database().await.expect("drop");
}

/// A maintenance worker that panics on its first `panics` runs, then runs until shutdown.
struct PanicsFirst {
    runs: AtomicU32,
    panics: u32,
}

#[async_trait]
impl Worker for PanicsFirst {
    fn name(&self) -> &str {
        "maintenance"
    }

    async fn run(&self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        if run <= self.panics {
            panic!("planned panic in run {run}");
        }
        shutdown.cancelled().await;
        Ok(())
    }
}

#[tokio::test]
async fn a_worker_that_panics_is_restarted_and_the_host_keeps_processing() {
    let (db, pool) = database().await;
    let worker = Arc::new(PanicsFirst {
        runs: AtomicU32::new(0),
        panics: 3,
    });
    let mut config = fast_config();
    // Long enough restart delays (300, 600, 1200 ms ± 20 %) to see the worker down.
    config.supervision.restart_base_ms = 300;
    config.supervision.restart_max_ms = 2_000;
    let host = Host::builder()
        .config(config)
        .database_url(db.url())
        .handler(
            "work",
            handler_fn(|_job: Job<serde_json::Value>| async { Ok(()) }),
        )
        .maintenance_worker({
            let worker = worker.clone();
            move |_ctx| worker as Arc<dyn Worker>
        })
        .start()
        .await
        .expect("start");
    let worker_running = |host: &HostHandle, name: &str| {
        host.health()
            .workers
            .iter()
            .find(|w| w.name == name)
            .map(|w| w.running)
    };
    wait_until(
        Duration::from_secs(10),
        "the workers are up but maintenance is down between restarts",
        || async {
            host.health().schema_ready
                && worker_running(&host, "claim") == Some(true)
                && worker_running(&host, "maintenance") == Some(false)
        },
    )
    .await;
    let health = host.health();
    assert!(
        !health.ready,
        "not ready while a worker restarts: {health:?}"
    );

    // Work enqueued meanwhile is done meanwhile.
    let items = (0..50).map(|n| NewWork::new("work", json!({ "n": n })));
    host.enqueue_many(items).await.expect("enqueue");
    wait_until(Duration::from_secs(15), "50 items completed", || async {
        count_state(&pool, "completed").await == 50
    })
    .await;

    wait_until(
        Duration::from_secs(15),
        "the fourth run of the maintenance worker is up and the host ready",
        || async {
            worker.runs.load(Ordering::SeqCst) == 4
                && worker_running(&host, "maintenance") == Some(true)
                && host.health().ready
        },
    )
    .await;
    host.shutdown();
    host.stopped()
        .await
        .expect("three panics stay under max_consecutive_failures: a clean stop");
    pool.close().await;
    db.drop_database().await.expect("drop");
}

#[tokio::test]
async fn an_invalid_configuration_is_refused_with_every_violated_setting_named() {
    // Several mistakes at once, set in code (the last layer); the URL is never dialled.
    let mut config = HostConfig {
        max_connections: 0,
        ..HostConfig::default()
    };
    config.liveness.stale_after = Duration::from_secs(1); // under 2 × fast_interval_ms (10 s)
    config.lease.lease_ms = 1_000;
    config.lease.renewal_interval_ms = Some(2_000); // not shorter than the lease
    config.claim.poll_base_ms = 0;
    config.supervision.max_consecutive_failures = 0;
    config.queues.insert(
        "emails".into(),
        QueueConfig {
            concurrency: Some(0),
            ..QueueConfig::default()
        },
    );
    config
        .queues
        .insert("ghosts".into(), QueueConfig::default()); // no handler
    let problems = refused_at_start(config).await;
    let settings: BTreeSet<&str> = problems.iter().map(|p| p.setting.as_str()).collect();
    for expected in [
        "max_connections",
        "liveness.stale_after_ms",
        "lease.renewal_interval_ms",
        "claim.poll_base_ms",
        "supervision.max_consecutive_failures",
        "queues.emails.concurrency",
        "queues.ghosts",
    ] {
        assert!(
            settings.contains(expected),
            "{expected} is named; the problems: {problems:#?}"
        );
    }
    let message = HostError::Config(problems.clone()).to_string();
    for p in &problems {
        assert!(
            message.contains(&p.setting),
            "the message lists {}",
            p.setting
        );
    }
}

#[tokio::test]
async fn a_configuration_file_is_layered_and_refused_with_its_settings_named() {
    let dir = std::env::temp_dir().join(format!("workpump-host-test-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // A typo is refused when the file is read, naming the key.
    let typo = dir.join("typo.toml");
    std::fs::write(&typo, "[claim]\npoll_bse_ms = 100\n").expect("write");
    let error = HostConfig::load(Some(&typo)).expect_err("an unknown key is refused");
    assert!(
        matches!(&error, HostError::ConfigLoad(m) if m.to_string().contains("poll_bse_ms")),
        "{error}"
    );
    // Values that read fine but break the rules are refused at start, all of them.
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[heartbeat]\nfast_interval_ms = 20000\n\n[maintenance]\ninterval_ms = 0\n",
    )
    .expect("write");
    let config = HostConfig::load(Some(&bad)).expect("the file reads");
    assert_eq!(
        config.heartbeat.fast_interval_ms, 20_000,
        "the file's layer"
    );
    assert_eq!(config.lease.lease_ms, 60_000, "the defaults' layer");
    let problems = refused_at_start(config).await;
    let settings: BTreeSet<&str> = problems.iter().map(|p| p.setting.as_str()).collect();
    assert!(
        settings.contains("liveness.stale_after_ms")
            && settings.contains("maintenance.interval_ms"),
        "{problems:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_evicted_host_cancels_its_handlers_records_nothing_for_them_and_registers_afresh() {
    let (db, pool) = database().await;
    // First attempts hold on until cancelled and report why; later attempts complete.
    let cancelled: Cancelled = Arc::default();
    let started = Arc::new(AtomicU32::new(0));
    let handler = {
        let (cancelled, started) = (cancelled.clone(), started.clone());
        handler_fn(move |job: Job<serde_json::Value>| {
            let (cancelled, started) = (cancelled.clone(), started.clone());
            async move {
                if job.attempt() > 1 {
                    return Ok(());
                }
                started.fetch_add(1, Ordering::SeqCst);
                job.cancellation_token().cancelled().await;
                cancelled
                    .lock()
                    .expect("cancelled")
                    .push((job.id(), job.cancel_reason()));
                Err(JobError::retry("stopped: cancelled"))
            }
        })
    };
    // A 60 s lease is renewed every 20 s: the heartbeat (every 400 ms) learns of the
    // eviction long before a renewal could.
    let host = Host::builder()
        .config(fast_config())
        .database_url(db.url())
        .handler("held", handler)
        .start()
        .await
        .expect("start");
    wait_ready(&host).await;
    let before = host.instance();
    let items = (0..3).map(|n| NewWork::new("held", json!({ "n": n })));
    host.enqueue_many(items).await.expect("enqueue");
    wait_until(Duration::from_secs(10), "3 handlers run", || async {
        started.load(Ordering::SeqCst) == 3
    })
    .await;

    // A peer's sweep reaps it while it is alive: its heartbeat is made older than the
    // definitive-dead cutoff, and the sweep runs in the same transaction (so no beat of the
    // host's can refresh the row in between). Its leases are released, its row deleted, a
    // tombstone written.
    let (_judge_session, judge) = seasoned_judge(db.url()).await;
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query(
        "UPDATE workpump.instances SET last_heartbeat_at = now() - interval '1 hour'
         WHERE instance_id = $1",
    )
    .bind(before.0)
    .execute(&mut *tx)
    .await
    .expect("age the heartbeat");
    let reaped: Vec<Uuid> = sqlx::query_scalar(
        "SELECT instance_id FROM workpump.cleanup_stale_instances($1, interval '30 seconds', interval '5 minutes', NULL)",
    )
    .bind(judge)
    .fetch_all(&mut *tx)
    .await
    .expect("the sweep");
    tx.commit().await.expect("commit");
    assert_eq!(reaped, vec![before.0]);

    wait_until(
        Duration::from_secs(10),
        "the host registers afresh and completes the items under its new id",
        || async {
            host.instance() != before
                && host.health().ready
                && count_state(&pool, "completed").await == 3
        },
    )
    .await;
    let after = host.instance();
    let reasons = cancelled.lock().expect("cancelled").clone();
    assert_eq!(
        reasons.len(),
        3,
        "every handler of the old id was cancelled"
    );
    for (item, reason) in &reasons {
        assert_eq!(
            *reason,
            Some(CancelReason::Evicted),
            "item {item} was cancelled because of the eviction"
        );
    }
    // Nothing the cancelled handlers returned was recorded: no failed attempt, no outcome
    // written under the old id; each item's one outcome is the new id's.
    let failures: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM workpump_audit WHERE error IS NOT NULL AND to_state <> 'running'",
    )
    .fetch_one(&pool)
    .await
    .expect("count failures");
    assert_eq!(failures, 0, "the cancelled attempts recorded no failure");
    assert_eq!(recorded_twice(&pool).await, 0);
    for (item, writer) in outcome_writers(&pool).await {
        assert_eq!(
            writer,
            Some(after.0),
            "item {item} was completed by the new id"
        );
    }
    let registered: Vec<Uuid> =
        sqlx::query_scalar("SELECT instance_id FROM workpump.instances WHERE instance_id <> $1")
            .bind(judge)
            .fetch_all(&pool)
            .await
            .expect("instances");
    assert_eq!(
        registered,
        vec![after.0],
        "registered afresh under the new id only"
    );

    host.shutdown();
    host.stopped().await.expect("a clean drain");
    pool.close().await;
    db.drop_database().await.expect("drop");
}

#[test]
fn a_drain_with_a_handler_in_flight_ends_on_a_current_thread_runtime() {
    // The host runs on a one-thread runtime of its own, its drain included, so nothing of it
    // may spin while it drains; this thread only watches the clock, so a drain that never
    // ends fails the test instead of hanging it.
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let _ = done.send(runtime.block_on(drain_with_a_handler_in_flight()));
    });
    let (state, attempt) = ended
        .recv_timeout(Duration::from_secs(30))
        .expect("the drain ends");
    // The drain released the item for a peer, its attempt not counted.
    assert_eq!((state.as_str(), attempt), ("available", 0));
}

/// Starts a host, waits until its handler runs, drains it; the item's state and attempt.
async fn drain_with_a_handler_in_flight() -> (String, i32) {
    let (db, pool) = database().await;
    let started = Arc::new(AtomicU32::new(0));
    let handler = {
        let started = started.clone();
        handler_fn(move |job: Job<serde_json::Value>| {
            let started = started.clone();
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                job.cancellation_token().cancelled().await;
                Err(JobError::cancelled("stopped by the drain"))
            }
        })
    };
    let host = Host::builder()
        .config(fast_config())
        .database_url(db.url())
        .handler("held", handler)
        .start()
        .await
        .expect("start");
    host.enqueue_many(vec![NewWork::new("held", json!({}))])
        .await
        .expect("enqueue");
    wait_until(Duration::from_secs(10), "the handler runs", || async {
        started.load(Ordering::SeqCst) == 1
    })
    .await;
    host.shutdown();
    host.stopped().await.expect("a clean drain");
    let item = sqlx::query_as("SELECT state::text, attempt FROM workpump.work_all")
        .fetch_one(&pool)
        .await
        .expect("the item");
    pool.close().await;
    db.drop_database().await.expect("drop");
    item
}

/// Starts a host with `config` and a handler for `emails` against a database nobody listens
/// on: it must refuse the configuration before connecting. What it refused.
async fn refused_at_start(config: HostConfig) -> Vec<ConfigProblem> {
    let result = Host::builder()
        .config(config)
        .database_url("postgres://nobody@127.0.0.1:1/nothing")
        .handler(
            "emails",
            handler_fn(|_job: Job<serde_json::Value>| async { Ok(()) }),
        )
        .start()
        .await;
    let Err(HostError::Config(problems)) = result else {
        panic!("the host must refuse to start with a config error");
    };
    problems
}
