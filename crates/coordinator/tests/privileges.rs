//! The least privileges of docs/privileges.md, proven: a migrator role with nothing but
//! CONNECT and CREATE on the database migrates and runs `sql/grants.sql`; a runtime role with
//! nothing but what that script grants runs the whole API (queues, enqueue in its own
//! transaction, heartbeat with the alive-lock, claim, renew, checkpoint, the outcomes, the
//! fenced transaction, LISTEN/NOTIFY, the operator calls and every maintenance step); and the
//! runtime role can change no schema object, nor can a role without the grants call a
//! function.
//!
//! Roles are cluster-wide, so their names carry the test database's name, and they are
//! dropped at the end whatever happened. The test needs a user that may create roles: the
//! throwaway server's `postgres`, or a `DATABASE_URL` user with CREATEROLE.

use std::time::Duration;

use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::Connection;
use workpump_coordinator::*;

const QUEUE: &str = "emails";
const LEASE: Duration = Duration::from_secs(60);
const STALE: Duration = Duration::from_secs(30);

fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `sql/grants.sql` with its psql variables filled in, as `workpump grants` prints it.
fn grants(schema: &str, runtime: &str) -> String {
    workpump_coordinator::grants_sql(schema, runtime).expect("valid names")
}

struct Roles {
    migrator: String,
    runtime: String,
    outsider: String,
    password: String,
}

impl Roles {
    fn all(&self) -> String {
        [&self.migrator, &self.runtime, &self.outsider]
            .map(|r| ident(r))
            .join(", ")
    }
}

/// The SQLSTATE of a failed statement.
fn sqlstate<T: std::fmt::Debug>(r: std::result::Result<T, sqlx::Error>) -> String {
    match r {
        Err(sqlx::Error::Database(d)) => d.code().map(|c| c.into_owned()).unwrap_or_default(),
        other => panic!("expected a database error, got {other:?}"),
    }
}

async fn creates_roles(admin: &PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT rolsuper OR rolcreaterole FROM pg_catalog.pg_roles WHERE rolname = current_user",
    )
    .fetch_one(admin)
    .await
    .expect("read the current user's attributes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_role_with_only_the_documented_grants_runs_the_whole_api_and_changes_no_schema() {
    let db = workpump_testdb::server()
        .await
        .expect("a PostgreSQL server")
        .create_database()
        .await
        .expect("a fresh database");
    let admin = db.pool().await.expect("connect as the admin");
    assert!(
        creates_roles(&admin).await,
        "this test creates roles: run it as a user with CREATEROLE (or unset DATABASE_URL to \
         use the throwaway server, whose user is a superuser)"
    );
    let roles = Roles {
        migrator: format!("wpmig_{}", db.name()),
        runtime: format!("wprun_{}", db.name()),
        outsider: format!("wpout_{}", db.name()),
        password: uuid::Uuid::new_v4().simple().to_string(),
    };
    let database = ident(db.name());
    let setup = format!(
        "CREATE ROLE {m} LOGIN PASSWORD '{pw}';
         CREATE ROLE {r} LOGIN PASSWORD '{pw}';
         CREATE ROLE {o} LOGIN PASSWORD '{pw}';
         GRANT {m}, {r}, {o} TO CURRENT_USER;
         REVOKE ALL ON DATABASE {database} FROM PUBLIC;
         GRANT CONNECT, CREATE ON DATABASE {database} TO {m};
         GRANT CONNECT ON DATABASE {database} TO {r}, {o};",
        m = ident(&roles.migrator),
        r = ident(&roles.runtime),
        o = ident(&roles.outsider),
        pw = roles.password,
    );
    sqlx::raw_sql(&setup)
        .execute(&admin)
        .await
        .expect("create the roles");

    // The body runs in a task of its own, so that the roles are dropped even when it panics.
    let body = {
        let (admin, options) = (admin.clone(), db.connect_options());
        let roles = Roles {
            migrator: roles.migrator.clone(),
            runtime: roles.runtime.clone(),
            outsider: roles.outsider.clone(),
            password: roles.password.clone(),
        };
        let db_name = db.name().to_owned();
        tokio::spawn(async move { run(admin, options, &db_name, &roles).await })
    };
    let outcome = body.await;

    let teardown = format!(
        "DROP OWNED BY {all}; DROP ROLE IF EXISTS {all};",
        all = roles.all()
    );
    // Sessions of the roles (a pool not yet closed by a panicking body) would keep
    // DROP ROLE from succeeding; end them first.
    let _ = sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE usename = ANY ($1) AND pid <> pg_backend_pid()",
    )
    .bind(vec![
        roles.migrator.clone(),
        roles.runtime.clone(),
        roles.outsider.clone(),
    ])
    .execute(&admin)
    .await;
    let dropped = sqlx::raw_sql(&teardown).execute(&admin).await;
    admin.close().await;
    let dropped_db = db.drop_database().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic.into_panic());
    }
    dropped.expect("drop the roles");
    dropped_db.expect("drop the database");
}

async fn run(admin: PgPool, options: PgConnectOptions, db_name: &str, roles: &Roles) {
    // --- The migrator: migrate, then grant the runtime role what docs/privileges.md says.
    let as_role = |role: &str| {
        options
            .clone()
            .username(role)
            .password(&roles.password)
            .database(db_name)
    };
    let migrator = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(as_role(&roles.migrator))
        .await
        .expect("connect as the migrator");
    migrate(&migrator, DEFAULT_SCHEMA)
        .await
        .expect("the migrator migrates with CREATE on the database");
    sqlx::raw_sql(&grants(DEFAULT_SCHEMA, &roles.runtime))
        .execute(&migrator)
        .await
        .expect("the migrator runs sql/grants.sql");
    // Idempotent: again after a (no-op) migrate.
    migrate(&migrator, DEFAULT_SCHEMA)
        .await
        .expect("migrate again");
    sqlx::raw_sql(&grants(DEFAULT_SCHEMA, &roles.runtime))
        .execute(&migrator)
        .await
        .expect("sql/grants.sql again");

    // A business table for the fenced transaction, the application's own (the admin's).
    sqlx::raw_sql(&format!(
        "CREATE TABLE public.sent (item bigint PRIMARY KEY);
         GRANT SELECT, INSERT ON public.sent TO {};",
        ident(&roles.runtime)
    ))
    .execute(&admin)
    .await
    .expect("a business table");

    // --- The runtime role: the whole API.
    let runtime = PgPoolOptions::new()
        .max_connections(6)
        .connect_with(as_role(&roles.runtime))
        .await
        .expect("connect as the runtime role");
    let c = PgCoordinator::new(runtime.clone());
    runtime_api(&c, &runtime, &admin).await;

    // --- What the runtime role must not do.
    for (what, statement) in [
        ("drop a table", "DROP TABLE workpump.work"),
        ("truncate a table", "TRUNCATE workpump.work"),
        ("alter a table", "ALTER TABLE workpump.work ADD COLUMN x int"),
        ("create a table in the schema", "CREATE TABLE workpump.evil (i int)"),
        (
            "drop a partition of the history",
            "DROP TABLE workpump.work_history_default",
        ),
        (
            "attach a partition to the history",
            "CREATE TABLE workpump.work_history_evil PARTITION OF workpump.work_history
             FOR VALUES FROM ('2100-01-01') TO ('2100-01-02')",
        ),
        (
            "create a function in the schema",
            "CREATE FUNCTION workpump.evil() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        ),
        (
            "replace a function",
            "CREATE OR REPLACE FUNCTION workpump.queue_depth(interval) RETURNS int LANGUAGE sql AS 'SELECT 1'",
        ),
        ("create a schema", "CREATE SCHEMA evil"),
        ("delete a queue", "DELETE FROM workpump.queues"),
        ("read the migration history", "SELECT * FROM workpump._sqlx_migrations"),
        ("drop the schema", "DROP SCHEMA workpump CASCADE"),
    ] {
        let r = sqlx::query(statement).execute(&runtime).await;
        assert_eq!(sqlstate(r), "42501", "the runtime role could {what}");
    }
    match migrate(&runtime, DEFAULT_SCHEMA).await {
        Err(e @ Error::Database { .. }) => {
            assert!(e.to_string().contains("permission denied"), "{e}")
        }
        other => panic!("the runtime role migrated: {other:?}"),
    }

    // --- A role with CONNECT and USAGE but no grant on the functions: EXECUTE is no longer
    // PUBLIC's.
    sqlx::raw_sql(&format!(
        "GRANT USAGE ON SCHEMA workpump TO {}",
        ident(&roles.outsider)
    ))
    .execute(&migrator)
    .await
    .expect("usage for the outsider");
    let outsider = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(as_role(&roles.outsider))
        .await
        .expect("connect as the outsider");
    for statement in [
        "SELECT * FROM workpump.queue_depth('0')",
        "SELECT workpump.alive_lock_key(gen_random_uuid())",
        "SELECT count(*) FROM workpump.work_all",
    ] {
        let r = sqlx::query(statement).execute(&outsider).await;
        assert_eq!(sqlstate(r), "42501", "the outsider ran {statement}");
    }
    outsider.close().await;
    runtime.close().await;
    migrator.close().await;
}

fn heartbeat(instance: InstanceId) -> RecordHeartbeatParams {
    RecordHeartbeatParams {
        instance,
        host: "privileges".into(),
        metadata: json!({"pid": 1}),
        stale_after: STALE,
        dead_after: Some(Duration::from_secs(300)),
        lock_grace: Some(Duration::from_secs(3)),
        alive_lock: AliveLockReport::Unreported,
        registering: true,
    }
}

async fn claim(c: &PgCoordinator, me: InstanceId, max_items: u32) -> Vec<ClaimedWork> {
    c.claim_work(ClaimWorkParams {
        instance: me,
        queues: vec![QUEUE.into()],
        max_items,
        lease: LEASE,
        async_commit: false,
    })
    .await
    .expect("claim")
    .items
}

async fn admin_exec(admin: &PgPool, statement: &str, id: WorkId) {
    sqlx::query(statement)
        .bind(id)
        .execute(admin)
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}

async fn runtime_api(c: &PgCoordinator, runtime: &PgPool, admin: &PgPool) {
    c.register_queue(RegisterQueueParams::new(QUEUE))
        .await
        .expect("register_queue");
    c.register_queue(RegisterQueueParams {
        max_attempts: 3,
        ..RegisterQueueParams::new(QUEUE)
    })
    .await
    .expect("register_queue again, other settings");

    // Heartbeat with the alive-lock.
    let me = InstanceId::new();
    let lock = c
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("take_alive_lock");
    assert!(lock.held, "the alive-lock is held");
    let beat = c
        .record_heartbeat(RecordHeartbeatParams {
            alive_lock: AliveLockReport::Session(lock.session.session_id().expect("a pid")),
            ..heartbeat(me)
        })
        .await
        .expect("heartbeat");
    assert!(!beat.evicted);
    assert!(
        c.is_instance_alive(IsInstanceAliveParams { instance: me })
            .await
            .expect("is_instance_alive")
            .alive
    );

    // LISTEN, then an enqueue wakes it (NOTIFY on commit).
    let mut listener = c.listen(ListenParams {}).await.expect("listen");
    assert_eq!(
        listener.next_event().await.expect("connected"),
        ListenEvent::Connected
    );
    let out = c
        .enqueue_work(EnqueueWorkParams {
            items: (0..4)
                .map(|i| NewWork::new(QUEUE, json!({ "i": i })))
                .chain([
                    NewWork::new(QUEUE, json!("later")).run_after(Duration::from_secs(3600)),
                    NewWork::new(QUEUE, json!("once")).unique_key("k"),
                    NewWork::new(QUEUE, json!("twice")).unique_key("k"),
                ])
                .collect(),
        })
        .await
        .expect("enqueue_work");
    assert_eq!(out.items.len(), 7);
    assert!(!out.items[6].inserted, "the unique key deduplicates");
    let woken = tokio::time::timeout(Duration::from_secs(10), listener.next_event())
        .await
        .expect("a wake within 10 s")
        .expect("an event");
    assert_eq!(
        woken,
        ListenEvent::Wake {
            queue: QUEUE.into()
        }
    );
    let scheduled = out.items[4].id;

    // Enqueue inside the caller's own transaction.
    let mut tx = runtime.begin().await.expect("begin");
    c.enqueue_with(
        &mut tx,
        EnqueueWorkParams {
            items: vec![NewWork::new(QUEUE, json!("in my transaction"))],
        },
    )
    .await
    .expect("enqueue_with");
    tx.commit().await.expect("commit");

    // Claim, renew, checkpoint, and each outcome.
    let items = claim(c, me, 100).await;
    assert_eq!(items.len(), 6, "four, the unique one and the transaction's");
    let fences: Vec<Fence> = items.iter().map(|i| i.fence).collect();
    let renewed = c
        .renew_leases(RenewLeasesParams {
            instance: me,
            leases: fences.clone(),
            lease: LEASE,
        })
        .await
        .expect("renew_leases");
    assert!(renewed
        .items
        .iter()
        .all(|r| r.status == RenewalStatus::Renewed));
    c.checkpoint_work(CheckpointWorkParams {
        instance: me,
        fence: fences[0],
        checkpoint: json!({"cursor": 7}),
    })
    .await
    .expect("checkpoint_work");
    c.complete_work(CompleteWorkParams {
        instance: me,
        items: vec![fences[0]],
        hand_off: Vec::new(),
    })
    .await
    .expect("complete_work")
    .all_recorded()
    .expect("recorded");
    let failed = c
        .fail_work(FailWorkParams {
            instance: me,
            items: vec![
                Failure {
                    fence: fences[1],
                    error: "rejected".into(),
                    disposition: FailDisposition::DeadLetter,
                },
                Failure {
                    fence: fences[2],
                    error: "try again".into(),
                    disposition: FailDisposition::RetryAfter(Duration::from_secs(3600)),
                },
            ],
        })
        .await
        .expect("fail_work");
    assert_eq!(failed.items[0].state, Some(WorkState::Dead));
    assert_eq!(failed.items[1].state, Some(WorkState::Scheduled));
    let released = c
        .release_work(ReleaseWorkParams {
            instance: me,
            items: vec![fences[3]],
            consume_attempt: false,
        })
        .await
        .expect("release_work");
    assert_eq!(released.items[0].state, Some(WorkState::Available));

    // The fenced transaction: a business write and the completion commit together.
    let mut fenced = c.begin_fenced(me, fences[4]).await.expect("begin_fenced");
    sqlx::query("INSERT INTO public.sent (item) VALUES ($1)")
        .bind(fences[4].id)
        .execute(fenced.connection())
        .await
        .expect("the business write");
    fenced.complete().await.expect("the fenced completion");
    let sent: i64 = sqlx::query_scalar("SELECT count(*) FROM public.sent")
        .fetch_one(runtime)
        .await
        .expect("read the business table");
    assert_eq!(sent, 1);

    // Operator calls: cancel (available, then running), retry a dead letter, discard.
    let cancel = |id| c.cancel_work(CancelWorkParams { id });
    assert_eq!(
        cancel(fences[3].id).await.expect("cancel").cancellation,
        Cancellation::Cancelled
    );
    assert_eq!(
        c.discard_work(DiscardWorkParams { id: fences[3].id })
            .await
            .expect("discard_work")
            .state,
        WorkState::Cancelled
    );
    assert_eq!(
        cancel(fences[5].id).await.expect("cancel").cancellation,
        Cancellation::Requested
    );
    let renewed = c
        .renew_leases(RenewLeasesParams {
            instance: me,
            leases: vec![fences[5]],
            lease: LEASE,
        })
        .await
        .expect("renew");
    assert!(renewed.items[0].cancel_requested);
    c.fail_work(FailWorkParams {
        instance: me,
        items: vec![Failure {
            fence: fences[5],
            error: "cancelled".into(),
            disposition: FailDisposition::Cancelled,
        }],
    })
    .await
    .expect("fail_work, cancelled");
    assert_eq!(
        c.retry_dead_work(RetryDeadWorkParams { id: fences[1].id })
            .await
            .expect("retry_dead_work")
            .queue,
        QUEUE
    );

    // The operations API: reads, pausing, bulk actions, queue settings.
    let page = c
        .list_work(ListWorkParams {
            filter: WorkFilter::new().queue(QUEUE).error_contains("cancelled"),
            ..Default::default()
        })
        .await
        .expect("list_work");
    assert!(!page.items.is_empty());
    c.get_work(GetWorkParams { id: fences[1].id })
        .await
        .expect("get_work");
    let overview = c
        .queue_overview(QueueOverviewParams {})
        .await
        .expect("queue_overview");
    assert!(overview.get(QUEUE).is_some());
    let instances = c
        .list_instances(ListInstancesParams {})
        .await
        .expect("list_instances");
    assert!(instances.instances.iter().any(|i| i.instance == me));
    c.pause_queue(PauseQueueParams {
        queue: QUEUE.into(),
    })
    .await
    .expect("pause_queue");
    c.resume_queue(ResumeQueueParams {
        queue: QUEUE.into(),
    })
    .await
    .expect("resume_queue");
    // (On no item: privileges are checked for every table a statement names, rows or not.)
    for action in [
        BulkAction::Retry,
        BulkAction::Cancel,
        BulkAction::Discard,
        BulkAction::RunNow,
    ] {
        let out = c
            .bulk_work(BulkWorkParams {
                action,
                ids: vec![987_654_321],
            })
            .await
            .expect("bulk_work");
        assert_eq!(out.items[0].result, BulkResult::NotFound);
        c.bulk_work_matching(BulkWorkMatchingParams::new(
            action,
            WorkFilter::new().queue("no-such-queue"),
        ))
        .await
        .expect("bulk_work_matching");
    }
    c.set_queue_settings(SetQueueSettingsParams {
        ordering_dead_head: None,
        max_running: None,
        rate_limit: None,
        queue: QUEUE.into(),
        max_attempts: None,
        owner: Some(Some("ops".into())),
    })
    .await
    .expect("set_queue_settings");
    // A claim of a queue with flow limits locks the queue's row and debits its bucket.
    c.set_queue_settings(SetQueueSettingsParams {
        max_running: Some(Some(5)),
        rate_limit: Some(Some(RateLimit::new(10, Duration::from_secs(1)))),
        ..SetQueueSettingsParams::new(QUEUE)
    })
    .await
    .expect("set the flow limits");
    c.enqueue_work(EnqueueWorkParams {
        items: vec![NewWork::new(QUEUE, serde_json::json!({"limited": true}))],
    })
    .await
    .expect("enqueue to a limited queue");
    let limited = c
        .claim_work(ClaimWorkParams {
            instance: me,
            queues: vec![QUEUE.into()],
            max_items: 1,
            lease: Duration::from_secs(60),
            async_commit: false,
        })
        .await
        .expect("claim of a limited queue");
    assert_eq!(limited.items.len(), 1, "{:?}", limited.throttles);
    c.complete_work(CompleteWorkParams {
        instance: me,
        items: limited.items.iter().map(|i| i.fence).collect(),
        hand_off: Vec::new(),
    })
    .await
    .expect("complete");
    c.set_queue_settings(SetQueueSettingsParams {
        max_running: Some(None),
        rate_limit: Some(None),
        ..SetQueueSettingsParams::new(QUEUE)
    })
    .await
    .expect("remove the flow limits");

    // Maintenance: promotion, expired orphans, retention, stale peers and their tombstones.
    admin_exec(
        admin,
        "UPDATE workpump.work SET run_at = now() - interval '1 s' WHERE id = $1",
        scheduled,
    )
    .await;
    let promoted = c
        .promote_scheduled(PromoteScheduledParams { limit: 100 })
        .await
        .expect("promote_scheduled");
    assert_eq!(promoted.promoted(), 1);
    let retried = claim(c, me, 1).await;
    admin_exec(
        admin,
        "UPDATE workpump.work SET max_attempts = attempt, lease_expiry = now() - interval '1 s'
         WHERE id = $1",
        retried[0].fence.id,
    )
    .await;
    let ended = c
        .dead_letter_expired(DeadLetterExpiredParams { limit: 100 })
        .await
        .expect("dead_letter_expired");
    assert_eq!(ended.dead_lettered(), 1);
    for table in ["work", "work_history"] {
        admin_exec(
            admin,
            &format!(
                "UPDATE workpump.{table} SET finished_at = finished_at - interval '30 days'
                 WHERE finished_at IS NOT NULL AND id <> $1"
            ),
            0,
        )
        .await;
    }
    let pruned = c
        .prune_finished(PruneFinishedParams {
            completed_retention: Duration::from_secs(86_400),
            dead_retention: Duration::from_secs(86_400),
            limit: 100,
        })
        .await
        .expect("prune_finished");
    assert!(pruned.pruned() >= 3, "{pruned:?}");
    // The runtime role rotates the history's partitions through the definer function: the
    // first prune attached them (created as the migrator), and one listed as past the
    // retention (its window moved back by hand) is dropped by the next.
    assert!(pruned.partitions_created >= 3, "{pruned:?}");
    let oldest: String =
        sqlx::query_scalar("SELECT name FROM workpump.history_partitions ORDER BY from_at LIMIT 1")
            .fetch_one(runtime)
            .await
            .expect("the runtime role reads history_partitions");
    sqlx::query(
        "UPDATE workpump.history_partitions
         SET from_at = from_at - interval '10 days', to_at = to_at - interval '10 days'
         WHERE name = $1",
    )
    .bind(&oldest)
    .execute(admin)
    .await
    .expect("move the oldest window back");
    let rotated = c
        .prune_finished(PruneFinishedParams {
            completed_retention: Duration::from_secs(86_400),
            dead_retention: Duration::from_secs(86_400),
            limit: 100,
        })
        .await
        .expect("prune_finished drops a partition");
    assert_eq!(
        (rotated.partitions_dropped, rotated.partitions_busy),
        (1, false),
        "{rotated:?}"
    );
    let gone: bool = sqlx::query_scalar("SELECT to_regclass('workpump.' || $1) IS NULL")
        .bind(&oldest)
        .fetch_one(admin)
        .await
        .expect("to_regclass");
    assert!(gone, "{oldest} was dropped");

    // The work table's vacuum needs its owner's privileges: the runtime role is never due one
    // (nor warned about one it may not run), the migrator is, for the same dead rows.
    workpump_coordinator::testing::lower_vacuum_threshold(admin, 0).await;
    workpump_coordinator::testing::wait_for_dead_rows(admin, 1).await;
    let vacuumed = c
        .vacuum_work(VacuumWorkParams {})
        .await
        .expect("vacuum_work as the runtime role");
    assert!(!vacuumed.vacuumed, "the runtime role may not vacuum work");
    let owner = PgCoordinator::new(admin.clone());
    let vacuumed = owner
        .vacuum_work(VacuumWorkParams {})
        .await
        .expect("vacuum_work as the migrator");
    assert!(vacuumed.vacuumed, "the table's owner vacuums it");

    let peer = InstanceId::new();
    c.record_heartbeat(heartbeat(peer))
        .await
        .expect("the peer's heartbeat");
    sqlx::query(
        "UPDATE workpump.instances SET last_heartbeat_at = now() - interval '1 hour'
         WHERE instance_id = $1",
    )
    .bind(peer.0)
    .execute(admin)
    .await
    .expect("age the peer");
    // `me` judges: it holds its lock, and has watched the store for an hour.
    let aged = sqlx::query(
        "UPDATE workpump.instances SET lock_since = lock_since - interval '1 hour'
         WHERE instance_id = $1 AND lock_since IS NOT NULL",
    )
    .bind(me.0)
    .execute(admin)
    .await
    .expect("age the judge's watch");
    assert_eq!(
        aged.rows_affected(),
        1,
        "the heartbeat credited the lock session"
    );
    let status = c
        .server_status(ServerStatusParams {})
        .await
        .expect("server_status");
    assert!(status.notification_queue_usage < 0.5, "{status:?}");
    // A lease held, so that the call looks for lapsed leases on the fleet's turn (locking and
    // updating `lapsed_look`).
    c.enqueue_work(EnqueueWorkParams {
        items: vec![NewWork::new(QUEUE, json!("held"))],
    })
    .await
    .expect("enqueue");
    assert_eq!(claim(c, me, 1).await.len(), 1, "a lease held");
    let due = c
        .maintenance_due(MaintenanceDueParams {
            judge: Some(me),
            stale_after: STALE,
            dead_after: Some(Duration::from_secs(300)),
            lock_grace: Some(Duration::from_secs(3)),
            completed_retention: Duration::from_secs(86_400),
            dead_retention: Duration::from_secs(86_400),
            evicted_retention: Duration::from_secs(86_400),
            lapsed_look_every: Duration::ZERO,
        })
        .await
        .expect("maintenance_due");
    assert!(due.instances, "{due:?}");
    // It looked for lapsed leases on the fleet's turn: locked and updated `lapsed_look`.
    let looked: bool =
        sqlx::query_scalar("SELECT looked_at > '-infinity' FROM workpump.lapsed_look")
            .fetch_one(admin)
            .await
            .expect("the lapsed-lease turn");
    assert!(
        looked,
        "the call took the lapsed-lease turn as the runtime role"
    );
    let reaped = c
        .cleanup_stale_instances(CleanupStaleInstancesParams {
            judge: Some(me),
            stale_after: STALE,
            dead_after: Some(Duration::from_secs(300)),
            lock_grace: Some(Duration::from_secs(3)),
        })
        .await
        .expect("cleanup_stale_instances");
    assert_eq!(
        reaped.reaped.iter().map(|r| r.instance).collect::<Vec<_>>(),
        vec![peer]
    );
    assert!(
        c.record_heartbeat(heartbeat(peer))
            .await
            .expect("the reaped peer's heartbeat")
            .evicted
    );
    sqlx::query(
        "UPDATE workpump.evicted_instances SET evicted_at = now() - interval '30 days'
         WHERE instance_id = $1",
    )
    .bind(peer.0)
    .execute(admin)
    .await
    .expect("age the tombstone");
    let tombstones = c
        .prune_evicted_instances(PruneEvictedInstancesParams {
            retention: Duration::from_secs(86_400),
            limit: 100,
        })
        .await
        .expect("prune_evicted_instances");
    assert_eq!(tombstones.pruned, 1);
    let depth = c
        .queue_depth(QueueDepthParams::default())
        .await
        .expect("queue_depth");
    assert!(depth.depths.iter().any(|d| d.queue == QUEUE), "{depth:?}");
    // It counted, so it took the fleet's turn and stored the sample (the UPDATE grant).
    let stored: bool = sqlx::query_scalar(
        "SELECT $1 = ANY (queues) AND sampled_at > now() - interval '1 minute'
         FROM workpump.depth_sample",
    )
    .bind(QUEUE)
    .fetch_one(admin)
    .await
    .expect("read the depth sample");
    assert!(
        stored,
        "the runtime role's count was not stored as the fleet's sample"
    );

    // A periodic job's fire time: read the state, then claim and enqueue in one transaction.
    let periodic = |fire: Option<PeriodicFire>| FirePeriodicParams {
        name: "nightly".into(),
        fingerprint: "every 60000 ms".into(),
        fire,
    };
    let state = c
        .fire_periodic(periodic(None))
        .await
        .expect("fire_periodic (state)");
    let fired = c
        .fire_periodic(periodic(Some(PeriodicFire {
            fire_at: state.db_now - chrono::Duration::seconds(1),
            next_fire_at: None,
            work: NewWork::new(QUEUE, json!("periodic")),
        })))
        .await
        .expect("fire_periodic");
    assert!(matches!(fired.result, FireResult::Fired(_)), "{fired:?}");

    // Ordering keys: a keyed batch (the key's lock, its order from ordering_seq), the next
    // item promoted when the head is cancelled, the repair, the held keys.
    let keyed = c
        .enqueue_work(EnqueueWorkParams {
            items: (0..3)
                .map(|i| NewWork::new(QUEUE, json!({ "k": i })).ordering_key("customer-1"))
                .collect(),
        })
        .await
        .expect("a keyed enqueue_work");
    c.cancel_work(CancelWorkParams {
        id: keyed.items[0].id,
    })
    .await
    .expect("cancel the head");
    let next = c
        .get_work(GetWorkParams {
            id: keyed.items[1].id,
        })
        .await
        .expect("get_work");
    assert_eq!(next.item.state, WorkState::Available);
    c.ordering_repair(OrderingRepairParams {
        limit: 100,
        every: Duration::ZERO,
    })
    .await
    .expect("ordering_repair");
    // An item still waits behind its key's head, so the call checked and took the fleet's
    // turn (the UPDATE grant on ordering_check).
    let checked: bool = sqlx::query_scalar(
        "SELECT checked_at > now() - interval '1 minute' FROM workpump.ordering_check",
    )
    .fetch_one(admin)
    .await
    .expect("read the ordering check");
    assert!(checked, "the runtime role's check took no turn");
    c.list_held_keys(ListHeldKeysParams::default())
        .await
        .expect("list_held_keys");

    // The end of a drain.
    c.deregister_instance(DeregisterInstanceParams { instance: me })
        .await
        .expect("deregister_instance");
    drop(lock);
    drop(listener);
    let mut conn = runtime.acquire().await.expect("a connection");
    conn.ping()
        .await
        .expect("the runtime role's session is fine");
}

/// A DBA may create the schema for the migrator and withhold CREATE on the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrator_that_owns_an_existing_schema_needs_no_create_on_the_database() {
    let db = workpump_testdb::server()
        .await
        .expect("a PostgreSQL server")
        .create_database()
        .await
        .expect("a fresh database");
    let admin = db.pool().await.expect("connect as the admin");
    assert!(
        creates_roles(&admin).await,
        "this test creates roles: run it as a user with CREATEROLE (or unset DATABASE_URL)"
    );
    let role = format!("wpown_{}", db.name());
    let password = uuid::Uuid::new_v4().simple().to_string();
    let database = ident(db.name());
    sqlx::raw_sql(&format!(
        "CREATE ROLE {r} LOGIN PASSWORD '{password}';
         REVOKE ALL ON DATABASE {database} FROM PUBLIC;
         GRANT CONNECT ON DATABASE {database} TO {r};
         CREATE SCHEMA owned AUTHORIZATION {r};",
        r = ident(&role)
    ))
    .execute(&admin)
    .await
    .expect("set up the role and its schema");
    let options = db.connect_options();
    let as_role = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.username(&role).password(&password))
        .await
        .expect("connect as the schema's owner");
    let migrated = migrate(&as_role, "owned").await;
    let elsewhere = migrate(&as_role, "other").await;
    as_role.close().await;
    let _ = sqlx::raw_sql(&format!(
        "DROP SCHEMA owned CASCADE; DROP OWNED BY {r}; DROP ROLE {r};",
        r = ident(&role)
    ))
    .execute(&admin)
    .await;
    admin.close().await;
    let _ = db.drop_database().await;
    migrated.expect("migrating the existing schema needs no database privilege");
    let err = elsewhere.expect_err("creating a new schema needs CREATE on the database");
    assert!(err.to_string().contains("permission denied"), "{err}");
}
