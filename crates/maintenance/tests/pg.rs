//! The MaintenanceWorker against a real server: a fresh database per test, rows moved in time
//! with an UPDATE, waits on conditions with a deadline.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::postgres::PgPool;
use tokio_util::sync::CancellationToken;
use workpump_coordinator::testing::{
    fresh_store, lower_vacuum_threshold, seasoned_judge, wait_for_dead_rows, FreshStore,
};
use workpump_coordinator::{
    AliveLockReport, ClaimWorkParams, EnqueueWorkParams, Identity, InstanceId, Liveness, NewWork,
    PgCoordinator, RecordHeartbeatParams, RegisterQueueParams, TakeAliveLockOutcome,
    WorkCoordinator, Worker,
};
use workpump_maintenance::{MaintenanceConfig, MaintenanceWorker, SweepReport};
use workpump_testdb::TestDatabase;

struct Store {
    pool: PgPool,
    coordinator: Arc<PgCoordinator>,
    _db: TestDatabase,
}

async fn store() -> Store {
    let FreshStore {
        coordinator,
        pool,
        db,
    } = fresh_store().await;
    Store {
        coordinator: Arc::new(coordinator),
        pool,
        _db: db,
    }
}

impl Store {
    async fn queue(&self, name: &str, max_attempts: i32) {
        self.coordinator
            .register_queue(RegisterQueueParams {
                ordering_dead_head: Default::default(),
                max_running: None,
                rate_limit: None,
                name: name.into(),
                max_attempts,
                owner: None,
            })
            .await
            .expect("register");
    }

    async fn enqueue(&self, q: &str, n: usize) -> Vec<i64> {
        let items = (0..n).map(|i| NewWork::new(q, json!({ "n": i }))).collect();
        self.coordinator
            .enqueue_work(EnqueueWorkParams { items })
            .await
            .expect("enqueue")
            .items
            .iter()
            .map(|e| e.id)
            .collect()
    }

    async fn instance(&self) -> InstanceId {
        let me = InstanceId::new();
        self.coordinator
            .record_heartbeat(RecordHeartbeatParams {
                instance: me,
                host: "test".into(),
                metadata: json!({}),
                stale_after: Duration::from_secs(30),
                dead_after: Some(Duration::from_secs(300)),
                lock_grace: None,
                alive_lock: AliveLockReport::Unreported,
                registering: true,
            })
            .await
            .expect("heartbeat");
        me
    }

    /// A registered instance that holds its alive-lock and has watched the store for an
    /// hour: its sweeps may judge by every rule (`cleanup_stale_instances`).
    async fn judge(&self) -> (InstanceId, TakeAliveLockOutcome) {
        let me = self.instance().await;
        (me, seasoned_judge(&self.coordinator, &self.pool, me).await)
    }

    async fn claim_all(&self, q: &str) -> Vec<i64> {
        let me = self.instance().await;
        let mut ids = Vec::new();
        loop {
            let out = self
                .coordinator
                .claim_work(ClaimWorkParams {
                    instance: me,
                    queues: vec![q.into()],
                    max_items: 10_000,
                    lease: Duration::from_secs(60),
                    async_commit: false,
                })
                .await
                .expect("claim");
            if out.items.is_empty() {
                return ids;
            }
            ids.extend(out.items.iter().map(|c| c.fence.id));
        }
    }

    async fn exec(&self, sql: &str, ids: &[i64]) {
        sqlx::query(sql)
            .bind(ids)
            .execute(&self.pool)
            .await
            .expect(sql);
    }

    /// Makes the items of `q` scheduled and due a second ago.
    async fn make_due_scheduled(&self, ids: &[i64]) {
        self.exec(
            "UPDATE workpump.work SET state = 'scheduled', run_at = now() - interval '1 second'
             WHERE id = ANY ($1)",
            ids,
        )
        .await;
    }

    /// Expires the leases of these running items.
    async fn expire_leases(&self, ids: &[i64]) {
        self.exec(
            "UPDATE workpump.work SET lease_expiry = now() - interval '1 second'
             WHERE id = ANY ($1) AND instance_id IS NOT NULL",
            ids,
        )
        .await;
    }

    /// Marks these waiting items completed two days ago.
    async fn complete_long_ago(&self, ids: &[i64]) {
        self.exec(
            "WITH gone AS (DELETE FROM workpump.work WHERE id = ANY ($1) RETURNING *)
             INSERT INTO workpump.work_history
                 (id, queue, priority, attempt, max_attempts, run_at, claim_token, renewals,
                  cancel_requested, payload, errors, created_at, finished_at)
             SELECT id, queue, priority, 1, max_attempts, run_at,
                    nextval('workpump.claim_token_seq'), 0, false, payload, errors, created_at,
                    now() - interval '2 days'
             FROM gone",
            ids,
        )
        .await;
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&self.pool)
            .await
            .expect(sql)
    }

    /// How many items are in each state, by state name.
    async fn states(&self) -> Vec<(String, i64)> {
        sqlx::query_as(
            "SELECT state::text, count(*) FROM workpump.work_all GROUP BY state ORDER BY state",
        )
        .fetch_all(&self.pool)
        .await
        .expect("states")
    }
}

fn config() -> MaintenanceConfig {
    MaintenanceConfig {
        // A sweep of the real server per call: no cadence here.
        depth_sample_interval_ms: 1,
        ..MaintenanceConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_promotes_dead_letters_prunes_and_samples_on_a_real_server() {
    let s = store().await;
    s.queue("jobs", 1).await;
    let due = s.enqueue("jobs", 3).await;
    s.make_due_scheduled(&due).await;
    let later = s.enqueue("jobs", 1).await;
    s.exec(
        "UPDATE workpump.work SET state = 'scheduled', run_at = now() + interval '1 hour'
         WHERE id = ANY ($1)",
        &later,
    )
    .await;
    s.queue("held", 1).await;
    s.enqueue("held", 2).await;
    let running = s.claim_all("held").await;
    s.expire_leases(&running[..1]).await;
    s.queue("old", 10).await;
    let old = s.enqueue("old", 4).await;
    s.complete_long_ago(&old[..3]).await;
    let (fresh_instance, _lock) = s.judge().await;

    let w = MaintenanceWorker::new(s.coordinator.clone(), config(), Liveness::default())
        .with_judge(Identity::with_instance(fresh_instance));
    let report = w.run_once().await.expect("sweep");
    let depth = report.depth.clone().expect("sampled");
    assert_eq!(
        report,
        SweepReport {
            reaped_instances: 0,
            released_leases: 0,
            released_lapsed: 1,
            dead_lettered: 1,
            cancelled: 0,
            promoted: 3,
            pruned_completed: 3,
            pruned_dead: 0,
            pruned_cancelled: 0,
            // A fresh store's first sweep attaches the history's partitions: now()'s window
            // (24 h retention: 1 h) and those up to 3 windows ahead.
            history_partitions_created: s
                .count("SELECT count(*) FROM workpump.history_partitions")
                .await as u64,
            history_partitions_dropped: 0,
            pruned_tombstones: 0,
            // A few dead rows, far below the work table's vacuum threshold.
            vacuumed_work: false,
            ordering_repairs: 0,
            depth: Some(depth.clone()),
            notification_queue_usage: report.notification_queue_usage,
            dead_peer_pending: false,
        }
    );
    assert!(
        report.history_partitions_created >= 3,
        "partitions up to 3 windows ahead: {report:?}"
    );
    let states = s.states().await;
    assert_eq!(
        states,
        vec![
            ("available".to_string(), 4),
            ("dead".to_string(), 1),
            ("running".to_string(), 1),
            ("scheduled".to_string(), 1),
        ]
    );
    let n = |q: &str, st: &str| {
        depth
            .iter()
            .find(|d| d.queue == q && d.state.as_str() == st)
            .map(|d| d.items)
    };
    assert_eq!(n("jobs", "available"), Some(3));
    assert_eq!(n("jobs", "scheduled"), Some(1));
    assert_eq!(n("held", "running"), Some(1));
    assert_eq!(n("old", "available"), Some(1));
    assert_eq!(depth.len(), 12, "three queues × four states");

    // Nothing is left for a second sweep.
    let again = w.run_once().await.expect("sweep");
    assert_eq!(
        (again.promoted, again.dead_lettered, again.pruned_completed),
        (0, 0, 0)
    );
    // The instance that claimed "held" goes silent: the next sweep reaps it and releases its
    // lease; the fresh instance stays.
    sqlx::query(
        "UPDATE workpump.instances SET last_heartbeat_at = now() - interval '1 minute'
         WHERE instance_id <> $1",
    )
    .bind(fresh_instance.0)
    .execute(&s.pool)
    .await
    .expect("age the other instances");
    let reaped = w.run_once().await.expect("sweep");
    assert_eq!((reaped.reaped_instances, reaped.released_leases), (1, 1));
    assert_eq!(
        s.count("SELECT count(*) FROM workpump.instances").await,
        1,
        "only the fresh instance is left"
    );
    // The released lease was on its last attempt: the same sweep made it a dead letter.
    assert_eq!(reaped.dead_lettered, 1);
    assert_eq!(
        s.count("SELECT count(*) FROM workpump.work_all WHERE state = 'dead'")
            .await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_sweeping_one_database_at_once_never_error_and_touch_each_row_once() {
    const DUE: usize = 3_000;
    const ORPHANS: usize = 600;
    const OLD: usize = 3_000;
    let s = store().await;
    s.queue("due", 10).await;
    s.queue("last", 1).await;
    s.queue("old", 10).await;
    let due = s.enqueue("due", DUE).await;
    s.make_due_scheduled(&due).await;
    s.enqueue("last", ORPHANS).await;
    let orphans = s.claim_all("last").await;
    assert_eq!(orphans.len(), ORPHANS);
    s.expire_leases(&orphans).await;
    let old = s.enqueue("old", OLD).await;
    s.complete_long_ago(&old).await;

    // Small batches and few of them, so both workers keep meeting on the same rows.
    let config = MaintenanceConfig {
        batch_limit: 100,
        max_batches_per_sweep: 3,
        depth_sample_interval_ms: 0,
        ..MaintenanceConfig::default()
    };
    let sweeper = |w: Arc<MaintenanceWorker>| {
        tokio::spawn(async move {
            let mut total = SweepReport::default();
            let mut sweeps = 0;
            loop {
                let r = w.run_once().await.expect("a sweep never errors");
                sweeps += 1;
                total.promoted += r.promoted;
                total.dead_lettered += r.dead_lettered;
                total.pruned_completed += r.pruned_completed;
                if r.promoted + r.dead_lettered + r.pruned_completed == 0 {
                    return (total, sweeps);
                }
            }
        })
    };
    let a = sweeper(Arc::new(MaintenanceWorker::new(
        s.coordinator.clone(),
        config.clone(),
        Liveness::default(),
    )));
    let b = sweeper(Arc::new(MaintenanceWorker::new(
        s.coordinator.clone(),
        config,
        Liveness::default(),
    )));
    let (a, a_sweeps) = a.await.expect("worker a");
    let (b, b_sweeps) = b.await.expect("worker b");
    assert_eq!(a.promoted + b.promoted, DUE as u64);
    assert_eq!(a.dead_lettered + b.dead_lettered, ORPHANS as u64);
    assert_eq!(a.pruned_completed + b.pruned_completed, OLD as u64);
    assert!(a_sweeps > 1 && b_sweeps > 1);
    assert_eq!(
        s.states().await,
        vec![
            ("available".to_string(), DUE as i64),
            ("dead".to_string(), ORPHANS as i64),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotion_wakes_a_listener_on_a_real_server() {
    let s = store().await;
    s.queue("jobs", 10).await;
    let due = s.enqueue("jobs", 1).await;
    s.make_due_scheduled(&due).await;
    let mut listener = s
        .coordinator
        .listen(Default::default())
        .await
        .expect("listen");
    assert_eq!(
        listener.next_event().await.expect("connected"),
        workpump_coordinator::ListenEvent::Connected
    );
    let w = MaintenanceWorker::new(s.coordinator.clone(), config(), Liveness::default());
    assert_eq!(w.run_once().await.expect("sweep").promoted, 1);
    let event = tokio::time::timeout(Duration::from_secs(10), listener.next_event())
        .await
        .expect("a wake within 10 s")
        .expect("event");
    assert_eq!(
        event,
        workpump_coordinator::ListenEvent::Wake {
            queue: "jobs".into()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_starts_sweeps_stops_and_starts_again_many_times() {
    let s = store().await;
    s.queue("jobs", 10).await;
    let w = Arc::new(MaintenanceWorker::new(
        s.coordinator.clone(),
        MaintenanceConfig {
            interval_ms: 20,
            ..MaintenanceConfig::default()
        },
        Liveness::default(),
    ));
    for round in 0..20 {
        // Each round, one due item that only a sweep makes available.
        let due = s.enqueue("jobs", 1).await;
        s.make_due_scheduled(&due).await;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let w = w.clone();
            let shutdown = shutdown.clone();
            async move { w.run(shutdown).await }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while s
            .count("SELECT count(*) FROM workpump.work_all WHERE state = 'scheduled'")
            .await
            > 0
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: no sweep promoted the item"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("run returns promptly after shutdown")
            .expect("no panic")
            .expect("Ok on shutdown");
    }
    assert_eq!(
        s.count("SELECT count(*) FROM workpump.work_all WHERE state = 'available'")
            .await,
        20
    );
}

/// The sweep counts the history's rotation in
/// `workpump_maintenance_history_partitions_total{action}`: the partitions a fresh store's
/// first sweep attaches (`created`), a rotation that could not lock the history's bookkeeping
/// while another held it (`busy`), and a partition past the retention dropped whole the next
/// time (`dropped`), at the default retention (24 h).
#[tokio::test]
async fn a_sweep_counts_the_history_partitions_it_attaches_drops_and_cannot_lock() {
    use workpump_coordinator::RecordedMetrics;
    use workpump_maintenance::metrics as m;
    let recorder = RecordedMetrics::default();
    let _guard = recorder.set_local();
    let s = store().await;
    let (judge, _lock) = s.judge().await;
    let w = MaintenanceWorker::new(s.coordinator.clone(), config(), Liveness::default())
        .with_judge(Identity::with_instance(judge));
    let counted =
        |action: &str| recorder.counter(m::HISTORY_PARTITIONS_TOTAL, &[(m::ACTION, action)]);

    let first = w.run_once().await.expect("sweep");
    assert!(first.history_partitions_created >= 3, "{first:?}");
    assert_eq!(counted("created"), first.history_partitions_created);

    // A partition whose window ended two days ago, attached as rotate_history would have.
    sqlx::raw_sql(
        "CREATE TABLE workpump.work_history_old (LIKE workpump.work_history);
         ALTER TABLE workpump.work_history ATTACH PARTITION workpump.work_history_old
             FOR VALUES FROM (now() - interval '3 days') TO (now() - interval '2 days');
         INSERT INTO workpump.history_partitions (name, from_at, to_at)
             VALUES ('work_history_old', now() - interval '3 days', now() - interval '2 days');",
    )
    .execute(&s.pool)
    .await
    .expect("a partition past the retention");
    let mut rotating = s.pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE workpump.history_partitions IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *rotating)
        .await
        .expect("another instance's rotation");
    let blocked = w.run_once().await.expect("sweep");
    assert_eq!(blocked.history_partitions_dropped, 0);
    assert_eq!(counted("busy"), 1);
    rotating.rollback().await.expect("rollback");

    let then = w.run_once().await.expect("sweep");
    assert_eq!(then.history_partitions_dropped, 1);
    assert_eq!(counted("dropped"), 1);
    assert_eq!(counted("busy"), 1);
}

#[tokio::test]
async fn a_sweep_vacuums_the_work_table_past_its_threshold_and_skips_a_held_one_quietly() {
    let logs = workpump_coordinator::testing::Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let s = store().await;
    // A threshold of 100 dead rows instead of a fresh store's 20 000; autovacuum of the table
    // off, so that only the sweeps vacuum it.
    lower_vacuum_threshold(&s.pool, 100).await;
    let dead = || s.count("SELECT pg_stat_get_dead_tuples('workpump.work'::regclass)");
    let vacuums = || {
        s.count(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'workpump.work'::regclass",
        )
    };
    s.queue("jobs", 1).await;
    s.enqueue("jobs", 50).await;
    s.claim_all("jobs").await;
    let w = MaintenanceWorker::new(s.coordinator.clone(), config(), Liveness::default());
    // 50 dead row versions (the claimed items' available ones): not due.
    wait_for_dead_rows(&s.pool, 50).await;
    assert!(!w.run_once().await.expect("sweep").vacuumed_work);
    s.enqueue("jobs", 100).await;
    s.claim_all("jobs").await;
    wait_for_dead_rows(&s.pool, 150).await;
    // Another vacuum holds the table (here: its lock): the sweep's VACUUM skips it at once,
    // without the WARNING PostgreSQL sends about it reaching the log.
    let mut holder = s.pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE workpump.work IN SHARE UPDATE EXCLUSIVE MODE")
        .execute(&mut *holder)
        .await
        .expect("lock");
    assert!(w.run_once().await.expect("sweep").vacuumed_work);
    assert_eq!(vacuums().await, 0, "skipped");
    holder.rollback().await.expect("rollback");
    assert!(w.run_once().await.expect("sweep").vacuumed_work);
    assert_eq!(vacuums().await, 1);
    assert!(dead().await < 100, "the vacuum removed the dead rows");
    assert!(
        !w.run_once().await.expect("sweep").vacuumed_work,
        "not due again"
    );
    let text = logs.text();
    assert!(!text.contains("skipping vacuum"), "{text}");
    assert!(!text.contains("WARN"), "{text}");
    // The vacuums' sessions were closed, not pooled again with their quiet setting: every
    // session of the pool (all held at once) hears warnings.
    let mut held = Vec::new();
    for _ in 0..s.pool.size() {
        held.push(s.pool.acquire().await.expect("acquire"));
    }
    for conn in &mut held {
        let level: String = sqlx::query_scalar("SHOW client_min_messages")
            .fetch_one(&mut **conn)
            .await
            .expect("show");
        assert_eq!(level, "notice");
    }
}
