//! The hot path's SQL against PostgreSQL, where only a real server can show it: row locks held
//! by a claim in flight, a sweep and a heartbeat beside it, every row a function returns (not
//! just what `PgCoordinator` makes of them), forced interleavings of two sessions, a caller's
//! temporary tables, the server ending an idle fenced transaction, and migrating a store that
//! holds rows written before a fix.

use std::time::Duration;

use serde_json::json;
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::Connection;
use tokio::time::Instant;
use workpump_coordinator::testing::{
    fresh_database as fresh, fresh_store_with_queue, seasoned_judge,
};
use workpump_coordinator::*;
use workpump_testdb::TestDatabase;

const LEASE: Duration = Duration::from_secs(60);

async fn migrated() -> (TestDatabase, PgPool, PgCoordinator) {
    fresh_store_with_queue("q").await
}

fn heartbeat(me: InstanceId) -> RecordHeartbeatParams {
    RecordHeartbeatParams {
        instance: me,
        host: "test".into(),
        metadata: json!({}),
        stale_after: Duration::from_secs(30),
        dead_after: Some(Duration::from_secs(300)),
        lock_grace: None,
        alive_lock: AliveLockReport::Unreported,
        registering: true,
    }
}

/// A peer that may judge by every rule (`cleanup_stale_instances`): registered,
/// holding its alive-lock, and watching the store for an hour.
async fn judge(c: &PgCoordinator, pool: &PgPool) -> (InstanceId, TakeAliveLockOutcome) {
    let me = registered(c).await;
    (me, seasoned_judge(c, pool, me).await)
}

/// A session of its own (a pooled one may have planned or run the statements already) whose
/// statements `pg_stat_statements` counts, nested ones included, from zero; `settings` are
/// run first.
async fn counted_session(pool: &PgPool, settings: &[&str]) -> PgConnection {
    let mut conn = PgConnection::connect_with(&pool.connect_options())
        .await
        .expect("connection");
    let tracking = [
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
        "SET pg_stat_statements.track = 'all'",
    ];
    for sql in tracking
        .iter()
        .chain(settings)
        .chain(&["SELECT pg_stat_statements_reset()"])
    {
        sqlx::query(sql).execute(&mut conn).await.expect(sql);
    }
    conn
}

async fn registered(c: &PgCoordinator) -> InstanceId {
    let me = InstanceId::new();
    c.record_heartbeat(heartbeat(me)).await.expect("heartbeat");
    me
}

async fn enqueue(c: &PgCoordinator, items: Vec<NewWork>) -> Vec<Enqueued> {
    c.enqueue_work(EnqueueWorkParams { items })
        .await
        .expect("enqueue")
        .items
}

async fn enqueue_n(c: &PgCoordinator, n: usize) -> Vec<WorkId> {
    enqueue(c, (0..n).map(|i| NewWork::new("q", json!(i))).collect())
        .await
        .iter()
        .map(|e| e.id)
        .collect()
}

async fn claim(
    c: &PgCoordinator,
    me: InstanceId,
    max_items: u32,
    lease: Duration,
) -> ClaimWorkOutcome {
    c.claim_work(ClaimWorkParams {
        instance: me,
        queues: vec!["q".into()],
        max_items,
        lease,
        async_commit: false,
    })
    .await
    .expect("claim")
}

/// Expires item `id`'s lease and runs the maintenance sweep's release of lapsed leases, so
/// that the next claim reclaims it.
async fn expire(pool: &PgPool, id: WorkId) {
    sqlx::query("UPDATE workpump.work SET lease_expiry = now() - interval '1 s' WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .expect("expire the lease");
    sqlx::query("SELECT * FROM workpump.dead_letter_expired(1000)")
        .execute(pool)
        .await
        .expect("release the lapsed lease");
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
}

/// Waits until `check` holds, looking every 20 ms; panics naming `what` after `within`.
async fn wait_until<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The SQLSTATE of a coordinator error that came from the database.
fn sqlstate(err: &Error) -> Option<String> {
    match err {
        Error::Database { source, .. } => source
            .downcast_ref::<sqlx::Error>()
            .and_then(|e| e.as_database_error())
            .and_then(|d| d.code())
            .map(|c| c.into_owned()),
        _ => None,
    }
}

// -- 1. a sweep racing a claim ------------------------------------------------------------------

/// A claim in flight holds its instance's row (FOR KEY SHARE) until it commits: a sweep that
/// would reap the instance skips it meanwhile (a lease minted for an instance being tombstoned
/// would never be released), and the instance's heartbeat is not blocked. Once the claim has
/// committed, the next sweep reaps the instance and releases the lease it just took.
#[tokio::test]
async fn a_claim_in_flight_keeps_its_instance_from_the_sweep_and_never_blocks_its_heartbeat() {
    let (_db, pool, c) = migrated().await;
    let me = registered(&c).await;
    let id = enqueue_n(&c, 1).await[0];
    let age = "UPDATE workpump.instances SET last_heartbeat_at = now() - interval '1 hour'
               WHERE instance_id = $1";

    let mut claimer = pool.begin().await.expect("begin");
    let claimed: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM workpump.claim_work($1, ARRAY['q'], 10, interval '60 s')",
    )
    .bind(me.0)
    .fetch_all(&mut *claimer)
    .await
    .expect("claim");
    assert_eq!(claimed, vec![id]);

    // The instance's own heartbeat (a plain UPDATE of its row) goes through, and so does any
    // other update of the row that leaves its key alone.
    tokio::time::timeout(Duration::from_secs(10), c.record_heartbeat(heartbeat(me)))
        .await
        .expect("the heartbeat is not blocked by the claim in flight")
        .expect("heartbeat");
    tokio::time::timeout(
        Duration::from_secs(10),
        sqlx::query(age).bind(me.0).execute(&pool),
    )
    .await
    .expect("an update of the instance row is not blocked")
    .expect("age the heartbeat");

    let (judge, _judge_lock) = judge(&c, &pool).await;
    let sweep = CleanupStaleInstancesParams {
        judge: Some(judge),
        stale_after: Duration::from_secs(30),
        dead_after: None,
        lock_grace: None,
    };
    let reaped = c.cleanup_stale_instances(sweep).await.expect("sweep");
    assert!(
        reaped.reaped.is_empty(),
        "the sweep reaped an instance whose claim was in flight: {reaped:?}"
    );

    claimer.commit().await.expect("commit the claim");
    let reaped = c.cleanup_stale_instances(sweep).await.expect("sweep");
    assert_eq!(
        reaped.reaped,
        vec![ReapedInstance {
            instance: me,
            released: 1
        }]
    );
    let owner: Option<uuid::Uuid> =
        sqlx::query_scalar("SELECT instance_id FROM workpump.work_all WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .expect("owner");
    assert_eq!(owner, None, "the lease the claim took was released");
}

/// The instance lock is taken only by a claim that leases something: a row lock needs a
/// transaction id, and an empty poll — most polls of an idle fleet — must stay read-only (no
/// transaction id, no WAL, no commit flush).
#[tokio::test]
async fn an_empty_claim_stays_read_only_and_a_claim_that_leases_holds_its_instance() {
    let (_db, pool, c) = migrated().await;
    let me = registered(&c).await;
    let held = "SELECT count(*) FROM pg_locks l JOIN pg_class r ON r.oid = l.relation
                WHERE r.relname = 'instances' AND l.mode = 'RowShareLock' AND l.pid = pg_backend_pid()";
    let mut tx = pool.begin().await.expect("begin");
    let claimed: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM workpump.claim_work($1, ARRAY['q'], 10, interval '60 s')",
    )
    .bind(me.0)
    .fetch_all(&mut *tx)
    .await
    .expect("claim");
    assert!(claimed.is_empty());
    let xid: Option<i64> = sqlx::query_scalar("SELECT txid_current_if_assigned()")
        .fetch_one(&mut *tx)
        .await
        .expect("xid");
    assert_eq!(xid, None, "an empty poll took a transaction id");
    tx.rollback().await.expect("rollback");

    enqueue_n(&c, 1).await;
    let mut tx = pool.begin().await.expect("begin");
    let claimed: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM workpump.claim_work($1, ARRAY['q'], 10, interval '60 s')",
    )
    .bind(me.0)
    .fetch_all(&mut *tx)
    .await
    .expect("claim");
    assert_eq!(claimed.len(), 1);
    let locking: i64 = sqlx::query_scalar(held)
        .fetch_one(&mut *tx)
        .await
        .expect("locks");
    assert_eq!(
        locking, 1,
        "the claim that leased holds a row lock on instances"
    );
    // The row lock itself: a FOR UPDATE NOWAIT of the instance row (what a sweep would take,
    // without SKIP LOCKED) is refused while the claim's transaction is open.
    let err =
        sqlx::query("SELECT 1 FROM workpump.instances WHERE instance_id = $1 FOR UPDATE NOWAIT")
            .bind(me.0)
            .execute(&pool)
            .await
            .expect_err("the instance row is locked");
    let code = err
        .as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("55P03"), "{err}");
    tx.commit().await.expect("commit");
}

/// What the race left behind before the fix — an instance deleted and tombstoned while a
/// lease is still fenced to it — answers `evicted` to every renewal, renews nothing, and the
/// instance can claim no more.
#[tokio::test]
async fn renewals_of_an_instance_reaped_while_it_still_held_a_lease_answer_evicted() {
    let (_db, pool, c) = migrated().await;
    let me = registered(&c).await;
    enqueue_n(&c, 1).await;
    let item = claim(&c, me, 1, LEASE).await.items.remove(0);
    sqlx::query(
        "WITH gone AS (DELETE FROM workpump.instances WHERE instance_id = $1 RETURNING instance_id)
         INSERT INTO workpump.evicted_instances (instance_id) SELECT instance_id FROM gone",
    )
    .bind(me.0)
    .execute(&pool)
    .await
    .expect("reap the instance, leaving its lease");
    let out = c
        .renew_leases(RenewLeasesParams {
            instance: me,
            leases: vec![item.fence],
            lease: LEASE,
        })
        .await
        .expect("renew");
    let statuses: Vec<RenewalStatus> = out.items.iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![RenewalStatus::Evicted]);
    let renewals: i32 = sqlx::query_scalar("SELECT renewals FROM workpump.work_all WHERE id = $1")
        .bind(item.fence.id)
        .fetch_one(&pool)
        .await
        .expect("renewals");
    assert_eq!(renewals, 0, "an evicted instance renews nothing");
    let err = c
        .claim_work(ClaimWorkParams {
            instance: me,
            queues: vec!["q".into()],
            max_items: 1,
            lease: LEASE,
            async_commit: false,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotRegistered(i) if i == me), "{err}");
}

// -- 2. repeated pairs, as the functions return them ------------------------------------------

/// Every fenced batch function returns one row per distinct (id, token) pair, whatever
/// `PgCoordinator` would make of the rows.
#[tokio::test]
async fn the_fenced_batch_functions_return_one_row_per_distinct_pair() {
    let (_db, pool, c) = migrated().await;
    let me = registered(&c).await;
    enqueue_n(&c, 4).await;
    let f: Vec<Fence> = claim(&c, me, 4, LEASE)
        .await
        .items
        .iter()
        .map(|i| i.fence)
        .collect();
    let rows = |sql: &'static str, pair: Fence, other: Fence| {
        let pool = pool.clone();
        async move {
            let ids = vec![pair.id, other.id, pair.id, pair.id];
            let tokens = vec![pair.token, other.token, pair.token, pair.token];
            let got: Vec<i64> = sqlx::query_scalar(sql)
                .bind(me.0)
                .bind(ids)
                .bind(tokens)
                .fetch_all(&pool)
                .await
                .expect(sql);
            (sql, got)
        }
    };
    for (sql, got) in [
        rows(
            "SELECT id FROM workpump.renew_leases($1, $2, $3, interval '60 s')",
            f[0],
            f[1],
        )
        .await,
        rows(
            "SELECT id FROM workpump.fail_work($1, $2, $3, ARRAY['x', 'y', 'z', 'w'],
                                              ARRAY[NULL, NULL, NULL, NULL]::interval[],
                                              ARRAY[false, false, false, false])",
            f[0],
            f[1],
        )
        .await,
        rows(
            "SELECT id FROM workpump.release_work($1, $2, $3, false)",
            f[2],
            f[3],
        )
        .await,
    ] {
        assert_eq!(got.len(), 2, "{sql}: {got:?}");
    }
    // complete_work of items that are finished by now: fenced out, one row per pair still.
    let (sql, got) = rows(
        "SELECT id FROM workpump.complete_work($1, $2, $3)",
        f[0],
        f[1],
    )
    .await;
    assert_eq!(got, vec![f[0].id, f[1].id], "{sql}");
}

// -- 3. a cancel lost to a retry or a release ----------------------------------------------------

/// A waiting item never carries a cancel request (the constraint that makes the lost cancel
/// impossible), so claim_work cannot hand one out.
#[tokio::test]
async fn a_waiting_item_cannot_carry_a_cancel_request() {
    let (_db, pool, c) = migrated().await;
    let now = enqueue_n(&c, 1).await[0];
    let later = enqueue(
        &c,
        vec![NewWork::new("q", json!(1)).run_after(Duration::from_secs(3600))],
    )
    .await[0]
        .id;
    for id in [now, later] {
        let err = sqlx::query("UPDATE workpump.work SET cancel_requested = true WHERE id = $1")
            .bind(id)
            .execute(&pool)
            .await
            .expect_err("a waiting item with a cancel request");
        let db = err.as_database_error().expect("a database error");
        assert_eq!(
            db.constraint(),
            Some("work_waiting_is_not_cancel_requested"),
            "{db}"
        );
    }
}

// -- 4. an enqueue racing the end of its unique key's holder ------------------------------------

/// Makes every later INSERT statement into `workpump.work` wait, between its insert and
/// whatever comes next in its statement's function, until the test releases advisory lock
/// `GATE`; returns the connection that holds it.
const GATE: i64 = 4_242_042;

async fn gate_enqueues(pool: &PgPool) -> PgConnection {
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION public.wait_at_gate() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM pg_advisory_lock({GATE});
             PERFORM pg_advisory_unlock({GATE});
             RETURN NULL;
         END $$;
         CREATE TRIGGER wait_at_gate AFTER INSERT ON workpump.work
             FOR EACH STATEMENT EXECUTE FUNCTION public.wait_at_gate();"
    ))
    .execute(pool)
    .await
    .expect("the gate trigger");
    let mut gate = PgConnection::connect_with(&pool.connect_options())
        .await
        .expect("connect the gate");
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(GATE)
        .execute(&mut gate)
        .await
        .expect("close the gate");
    gate
}

/// Waits until an enqueue of this test's database waits at the gate. pg_locks shows the whole
/// cluster, where the other gate tests' databases take the same key, so it counts only this one.
async fn wait_at_gate(pool: &PgPool) {
    wait_until(
        Duration::from_secs(20),
        "the enqueue waits at the gate",
        || async {
            count(
                pool,
                &format!(
                    "SELECT count(*) FROM pg_locks
                 WHERE locktype = 'advisory' AND NOT granted AND classid = 0 AND objid = {GATE}
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                ),
            )
            .await
                == 1
        },
    )
    .await;
}

/// Closes the gate and starts a batch (a plain item, then one with unique key `k`) that is
/// stopped there, between its insert and its lookup of the key's holder; returns the gate and
/// the enqueue's task.
async fn enqueue_at_the_gate(
    c: &PgCoordinator,
    pool: &PgPool,
) -> (
    PgConnection,
    tokio::task::JoinHandle<Result<EnqueueWorkOutcome>>,
) {
    let gate = gate_enqueues(pool).await;
    let enqueuing = tokio::spawn({
        let c = c.clone();
        async move {
            c.enqueue_work(EnqueueWorkParams {
                items: vec![
                    NewWork::new("q", json!("plain")),
                    NewWork::new("q", json!("keyed")).unique_key("k"),
                ],
            })
            .await
        }
    });
    wait_at_gate(pool).await;
    (gate, enqueuing)
}

async fn open_gate(mut gate: PgConnection) {
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(GATE)
        .execute(&mut gate)
        .await
        .expect("open the gate");
    gate.close().await.expect("close");
}

/// The holder of an item's unique key finishes (an operator cancels it) between the
/// enqueue's insert, which the key stopped, and its lookup of the holder: the enqueue still
/// answers with the holder's id, and the whole batch commits.
#[tokio::test]
async fn an_enqueue_whose_unique_key_holder_finishes_meanwhile_answers_with_the_holder() {
    let (_db, pool, c) = migrated().await;
    let holder = enqueue(&c, vec![NewWork::new("q", json!("holder")).unique_key("k")]).await[0];
    assert!(holder.inserted);
    let (gate, enqueuing) = enqueue_at_the_gate(&c, &pool).await;
    let cancelled = c
        .cancel_work(CancelWorkParams { id: holder.id })
        .await
        .expect("cancel the holder");
    assert_eq!(cancelled.cancellation, Cancellation::Cancelled);
    open_gate(gate).await;
    let out = enqueuing
        .await
        .expect("the enqueue task")
        .expect("the enqueue succeeds");
    assert!(out.items[0].inserted);
    assert_eq!(
        out.items[1],
        Enqueued {
            id: holder.id,
            inserted: false
        }
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM workpump.work_all").await,
        2
    );
}

/// The same with a holder that completes in between, and so leaves `work` for
/// `work_history`: the enqueue finds it there.
#[tokio::test]
async fn an_enqueue_whose_unique_key_holder_completes_meanwhile_answers_with_the_holder() {
    let (_db, pool, c) = migrated().await;
    let me = registered(&c).await;
    let holder = enqueue(&c, vec![NewWork::new("q", json!("holder")).unique_key("k")]).await[0];
    let (gate, enqueuing) = enqueue_at_the_gate(&c, &pool).await;
    let claimed = claim(&c, me, 1, LEASE).await.items;
    assert_eq!(claimed[0].fence.id, holder.id);
    let done = c
        .complete_work(CompleteWorkParams {
            instance: me,
            items: vec![claimed[0].fence],
            hand_off: Vec::new(),
        })
        .await
        .expect("complete the holder");
    assert!(done.all_recorded().is_ok());
    open_gate(gate).await;
    let out = enqueuing
        .await
        .expect("the enqueue task")
        .expect("the enqueue succeeds");
    assert!(out.items[0].inserted);
    assert_eq!(
        out.items[1],
        Enqueued {
            id: holder.id,
            inserted: false
        }
    );
}

/// The holder finishes and is deleted in between: no holder can be named, so the whole batch
/// is refused with a retryable SQLSTATE (40001) and a message saying nothing was enqueued —
/// and indeed nothing was, not even the batch's other items.
#[tokio::test]
async fn an_enqueue_whose_unique_key_holder_vanishes_meanwhile_is_refused_whole_and_retryable() {
    let (_db, pool, c) = migrated().await;
    let holder = enqueue(&c, vec![NewWork::new("q", json!("holder")).unique_key("k")]).await[0];
    let (gate, enqueuing) = enqueue_at_the_gate(&c, &pool).await;
    c.cancel_work(CancelWorkParams { id: holder.id })
        .await
        .expect("cancel the holder");
    c.discard_work(DiscardWorkParams { id: holder.id })
        .await
        .expect("discard the holder");
    open_gate(gate).await;
    let err = enqueuing
        .await
        .expect("the enqueue task")
        .expect_err("no holder to name");
    assert_eq!(sqlstate(&err).as_deref(), Some("40001"), "{err}");
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains("nothing was enqueued"), "{err}");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM workpump.work_all").await,
        0,
        "nothing of the batch was written"
    );
}

// -- 5. a caller's temporary tables ---------------------------------------------------------------

/// A caller's temporary table named `queues` does not shadow the store's: an unregistered
/// queue is still refused, and a registered one still accepted, on that very session.
#[tokio::test]
async fn a_callers_temporary_queues_table_does_not_let_an_unregistered_queue_in() {
    let (_db, pool, c) = migrated().await;
    let mut conn = PgConnection::connect_with(&pool.connect_options())
        .await
        .expect("connect");
    sqlx::raw_sql(
        "CREATE TEMPORARY TABLE queues (
             name text PRIMARY KEY,
             max_attempts integer NOT NULL DEFAULT 10,
             paused boolean NOT NULL DEFAULT false);
         INSERT INTO queues (name) VALUES ('ghost'), ('q');",
    )
    .execute(&mut conn)
    .await
    .expect("a temporary queues table");
    let err = c
        .enqueue_with(
            &mut conn,
            EnqueueWorkParams {
                items: vec![NewWork::new("ghost", json!(1))],
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownQueue(q) if q == "ghost"),
        "{err}"
    );
    c.enqueue_with(
        &mut conn,
        EnqueueWorkParams {
            items: vec![NewWork::new("q", json!(2))],
        },
    )
    .await
    .expect("a registered queue");
    conn.close().await.expect("close");
    let queues: Vec<String> = sqlx::query_scalar("SELECT queue FROM workpump.work_all ORDER BY id")
        .fetch_all(&pool)
        .await
        .expect("queues");
    assert_eq!(queues, vec!["q"]);
}

/// Every function of the store searches its own schema, then `pg_temp` last (and
/// `pg_catalog` first, implicitly): each captures the migrating session's path.
#[tokio::test]
async fn every_function_of_the_store_searches_pg_temp_last() {
    let (_db, pool) = fresh().await;
    for schema in [DEFAULT_SCHEMA, "tenant_two"] {
        migrate(&pool, schema).await.expect("migrate");
        let rows: Vec<(String, Option<String>)> = sqlx::query_as(
            "SELECT p.oid::regprocedure::text,
                    (SELECT c FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%')
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = $1 ORDER BY 1",
        )
        .bind(schema)
        .fetch_all(&pool)
        .await
        .expect("functions");
        assert!(rows.len() >= 25, "{schema}: {} functions", rows.len());
        let want = format!("search_path={schema}, pg_temp");
        for (function, path) in rows {
            assert_eq!(
                path.as_deref(),
                Some(want.as_str()),
                "{function} in {schema}"
            );
        }
    }
}

// -- 6. claim_work of a paused queue --------------------------------------------------------------

/// A paused queue yields nothing and is no error (an unknown one is refused: see the
/// conformance suite).
#[tokio::test]
async fn a_paused_queue_yields_nothing_without_an_error() {
    let (_db, pool, c) = migrated().await;
    let me = registered(&c).await;
    enqueue_n(&c, 1).await;
    sqlx::query("UPDATE workpump.queues SET paused = true WHERE name = 'q'")
        .execute(&pool)
        .await
        .expect("pause");
    assert!(claim(&c, me, 10, LEASE).await.items.is_empty());
    sqlx::query("UPDATE workpump.queues SET paused = false WHERE name = 'q'")
        .execute(&pool)
        .await
        .expect("resume");
    assert_eq!(claim(&c, me, 10, LEASE).await.items.len(), 1);
}

// -- 7. the drain hint on every row ---------------------------------------------------------------

async fn claim_rows(pool: &PgPool, me: InstanceId, max_items: i32) -> Vec<(i64, bool, bool)> {
    sqlx::query_as(
        "SELECT id, reclaimed, has_more FROM workpump.claim_work($1, ARRAY['q'], $2, interval '60 s')",
    )
    .bind(me.0)
    .bind(max_items)
    .fetch_all(pool)
    .await
    .expect("claim")
}

/// Every row of one claim carries the same drain hint, reclaimed orphans and new items alike.
#[tokio::test]
async fn every_row_of_one_claim_carries_the_same_drain_hint() {
    let (_db, pool, c) = migrated().await;
    let a = registered(&c).await;
    let b = registered(&c).await;
    let orphan = enqueue_n(&c, 1).await[0];
    claim(&c, a, 1, LEASE).await;
    expire(&pool, orphan).await;
    enqueue_n(&c, 5).await;

    // One orphan and two new items, with three new items left over.
    let rows = claim_rows(&pool, b, 3).await;
    assert_eq!(rows.len(), 3);
    assert_eq!(rows.iter().filter(|r| r.1).count(), 1, "{rows:?}");
    assert!(rows.iter().all(|r| r.2), "more were left: {rows:?}");

    // One orphan and the last three new items: nothing left over.
    expire(&pool, rows[1].0).await;
    let rows = claim_rows(&pool, b, 10).await;
    assert_eq!(rows.len(), 4);
    assert_eq!(rows.iter().filter(|r| r.1).count(), 1, "{rows:?}");
    assert!(rows.iter().all(|r| !r.2), "none were left: {rows:?}");

    // Orphans alone fill the batch: more may be left.
    let all: Vec<i64> = sqlx::query_scalar("SELECT id FROM workpump.work_all ORDER BY id")
        .fetch_all(&pool)
        .await
        .expect("ids");
    for id in &all[..2] {
        expire(&pool, *id).await;
    }
    let rows = claim_rows(&pool, b, 1).await;
    assert_eq!(rows.len(), 1);
    assert!(rows[0].1 && rows[0].2, "{rows:?}");
}

// -- 8. a fenced transaction left idle --------------------------------------------------------

/// A process that freezes inside its fenced transaction (lock_lease taken, transaction open,
/// nothing sent) no longer keeps its row locked for as long as the server keeps the
/// connection: the server ends the session once it has been idle for the remaining lease, the
/// item is reclaimed, and the frozen transaction's business write never happened.
#[tokio::test]
async fn a_fenced_transaction_left_idle_is_ended_by_the_server_and_its_item_reclaimed() {
    let (_db, pool, c) = migrated().await;
    sqlx::query("CREATE TABLE effects (item bigint PRIMARY KEY)")
        .execute(&pool)
        .await
        .expect("table");
    let frozen = registered(&c).await;
    let peer = registered(&c).await;
    let id = enqueue_n(&c, 1).await[0];
    let item = claim(&c, frozen, 1, Duration::from_secs(2))
        .await
        .items
        .remove(0);
    let mut tx = c.begin_fenced(frozen, item.fence).await.expect("fenced tx");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(tx.connection())
        .await
        .expect("pid");
    sqlx::query("INSERT INTO effects VALUES ($1)")
        .bind(id)
        .execute(tx.connection())
        .await
        .expect("business write");
    let idle_since = Instant::now();

    // The process freezes here: the transaction stays open, idle.
    wait_until(
        Duration::from_secs(30),
        "the server ends the idle fenced transaction's session",
        || async {
            count(
                &pool,
                &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"),
            )
            .await
                == 0
        },
    )
    .await;
    assert!(
        idle_since.elapsed() >= Duration::from_millis(900),
        "ended after {:?}: sooner than the remaining lease",
        idle_since.elapsed()
    );

    // The sweep releases the lapsed lease (the row is no longer locked).
    c.dead_letter_expired(DeadLetterExpiredParams { limit: 100 })
        .await
        .expect("sweep");
    let taken = claim(&c, peer, 10, LEASE).await;
    assert_eq!(taken.items.len(), 1);
    assert_eq!(taken.items[0].fence.id, id);
    assert!(taken.items[0].reclaimed);
    assert_eq!(count(&pool, "SELECT count(*) FROM effects").await, 0);
    // The thawed process can commit nothing.
    assert!(tx.complete().await.is_err());
    assert_eq!(count(&pool, "SELECT count(*) FROM effects").await, 0);
}

/// The timeout is the transaction's own: the session's setting is back once it ends, and a
/// session's stricter setting is kept.
#[tokio::test]
async fn the_fenced_transactions_idle_timeout_is_its_own_and_never_looser_than_the_sessions() {
    let (_db, _pool, c) = migrated().await;
    let me = registered(&c).await;
    enqueue_n(&c, 2).await;
    let items = claim(&c, me, 2, LEASE).await.items;
    let setting = "SELECT setting::bigint FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'";

    let mut tx = c.begin_fenced(me, items[0].fence).await.expect("fenced tx");
    let inside: i64 = sqlx::query_scalar(setting)
        .fetch_one(tx.connection())
        .await
        .expect("setting");
    assert!(
        (50_000..=60_000).contains(&inside),
        "the remaining lease of about 60 s, got {inside} ms"
    );
    let mut conn = PgConnection::connect_with(&c.pool().connect_options())
        .await
        .expect("connect");
    sqlx::query("SET idle_in_transaction_session_timeout = 5000")
        .execute(&mut conn)
        .await
        .expect("a stricter session setting");
    sqlx::query("BEGIN")
        .execute(&mut conn)
        .await
        .expect("begin");
    let locked: bool = sqlx::query_scalar("SELECT workpump.lock_lease($1, $2, $3)")
        .bind(me.0)
        .bind(items[1].fence.id)
        .bind(items[1].fence.token)
        .fetch_one(&mut conn)
        .await
        .expect("lock_lease");
    assert!(locked);
    let stricter: i64 = sqlx::query_scalar(setting)
        .fetch_one(&mut conn)
        .await
        .expect("setting");
    assert_eq!(stricter, 5000);
    sqlx::query("COMMIT")
        .execute(&mut conn)
        .await
        .expect("commit");
    tx.rollback().await.expect("rollback");
    conn.close().await.expect("close");
    let mut conn = c.pool().acquire().await.expect("a pooled connection");
    let after: i64 = sqlx::query_scalar(setting)
        .fetch_one(&mut *conn)
        .await
        .expect("setting");
    assert_eq!(after, 0, "the pool's sessions keep their own setting");
}

/// An operator's cancel by filter never waits for an ordering key while it holds rows: an
/// item whose key another transaction holds (here an enqueue of the key, left open) is
/// skipped like a locked row, and taken by the next call once the key is free.
#[tokio::test]
async fn a_cancel_by_filter_skips_an_item_whose_key_is_busy_instead_of_waiting() {
    let (db, pool, c) = migrated().await;
    let keyed = |n: i64| NewWork::new("q", json!({ "n": n })).ordering_key("k");
    let ids: Vec<WorkId> = enqueue(&c, vec![keyed(0), keyed(1)])
        .await
        .iter()
        .map(|e| e.id)
        .collect();
    let mut open = PgConnection::connect(db.url()).await.expect("connect");
    sqlx::query("BEGIN")
        .execute(&mut open)
        .await
        .expect("begin");
    c.enqueue_with(
        &mut open,
        EnqueueWorkParams {
            items: vec![keyed(2)],
        },
    )
    .await
    .expect("an enqueue of the key, left open");
    let cancel = || {
        c.bulk_work_matching(BulkWorkMatchingParams {
            action: BulkAction::Cancel,
            filter: WorkFilter::new().queue("q").state(WorkState::Blocked),
            all: false,
            limit: 10,
        })
    };
    let skipped = tokio::time::timeout(Duration::from_secs(10), cancel())
        .await
        .expect("answered without waiting for the key")
        .expect("bulk");
    assert!(skipped.items.is_empty(), "{skipped:?}");
    sqlx::query("COMMIT")
        .execute(&mut open)
        .await
        .expect("commit");
    let done = cancel().await.expect("bulk");
    assert_eq!(
        done.items.len(),
        2,
        "the blocked item and the one enqueued meanwhile"
    );
    assert!(done.items.iter().any(|i| i.id == ids[1]));
    pool.close().await;
}

/// Ending a key's head finds whether the key has another head in one index entry
/// (`work_ordering_head`), not by reading the items waiting behind it: with 500 items of the
/// key waiting, a completion that hands the key on (`ordering_hand_off`) and one that
/// promotes the next (`ordering_advance`) each fetch a handful of rows through indexes.
/// When the probe shared an index with the waiting items, it fetched every one of them, so a
/// hot key's cost per item grew with its backlog (docs/performance.md, "Ordering keys").
#[tokio::test]
async fn ending_a_head_does_not_read_the_items_waiting_behind_it() {
    const WAITING: usize = 500;
    let (_db, pool, c) = migrated().await;
    let items = (0..=WAITING)
        .map(|n| NewWork::new("q", json!(n)).ordering_key("hot"))
        .collect();
    enqueue(&c, items).await;
    let me = registered(&c).await;
    let (mut id, mut token): (i64, i64) = sqlx::query_as(
        "SELECT id, claim_token FROM workpump.claim_work($1, ARRAY['q'], 10, interval '60 s')",
    )
    .bind(me.0)
    .fetch_one(&pool)
    .await
    .expect("the head, the only item a claim finds");
    // Rows fetched through indexes by this transaction so far (live rows, before any filter).
    let fetched = "SELECT coalesce(sum(idx_tup_fetch), 0)::bigint FROM pg_stat_xact_user_tables
                   WHERE schemaname = 'workpump' AND relname = 'work'";
    for hand_off in [true, false] {
        let mut tx = pool.begin().await.expect("begin");
        let before: i64 = sqlx::query_scalar(fetched)
            .fetch_one(&mut *tx)
            .await
            .expect("fetched");
        let (recorded, next_id, next_token): (bool, Option<i64>, Option<i64>) = sqlx::query_as(
            "SELECT recorded, next_id, next_claim_token FROM workpump.complete_work($1,
                 ARRAY[$2::bigint], ARRAY[$3::bigint], $4::text[], $5::text[]::interval[])",
        )
        .bind(me.0)
        .bind(id)
        .bind(token)
        .bind(hand_off.then(|| vec!["q"]))
        .bind(hand_off.then(|| vec!["60 s"]))
        .fetch_one(&mut *tx)
        .await
        .expect("complete");
        let after: i64 = sqlx::query_scalar(fetched)
            .fetch_one(&mut *tx)
            .await
            .expect("fetched");
        tx.commit().await.expect("commit");
        assert!(recorded, "hand_off {hand_off}");
        assert!(
            after - before < 20,
            "ending the head (hand_off {hand_off}) fetched {} rows through indexes with {WAITING} \
             items of its key waiting",
            after - before
        );
        if hand_off {
            id = next_id.expect("the key's next item, handed on");
            token = next_token.expect("its claim token");
        }
    }
    let promoted: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM workpump.work WHERE ordering_key = 'hot' AND state = 'available'",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(
        promoted, 1,
        "the completion without hand-off promoted the next item"
    );
    pool.close().await;
}

/// A keyed enqueue under a transaction snapshot could miss a head that finished while it
/// waited for the key's lock: refused, naming the isolation level, and nothing is written.
/// An unkeyed one is fine there.
#[tokio::test]
async fn a_keyed_enqueue_in_a_repeatable_read_transaction_is_refused_naming_it() {
    let (db, pool, c) = migrated().await;
    let mut conn = PgConnection::connect(db.url()).await.expect("connect");
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut conn)
        .await
        .expect("begin");
    let err = c
        .enqueue_with(
            &mut conn,
            EnqueueWorkParams {
                items: vec![NewWork::new("q", json!(1)).ordering_key("k")],
            },
        )
        .await
        .expect_err("refused");
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("READ COMMITTED") && m.contains("REPEATABLE READ")),
        "{err}"
    );
    sqlx::query("ROLLBACK")
        .execute(&mut conn)
        .await
        .expect("rollback");
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut conn)
        .await
        .expect("begin");
    c.enqueue_with(
        &mut conn,
        EnqueueWorkParams {
            items: vec![NewWork::new("q", json!(2))],
        },
    )
    .await
    .expect("an unkeyed enqueue");
    sqlx::query("COMMIT")
        .execute(&mut conn)
        .await
        .expect("commit");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM workpump.work_all").await,
        1
    );
    pool.close().await;
}

// -- flow control ---------------------------------------------------------------------------------

async fn limit(c: &PgCoordinator, max_running: Option<u32>, rate: Option<RateLimit>) {
    c.set_queue_settings(SetQueueSettingsParams {
        max_running: Some(max_running),
        rate_limit: Some(rate),
        ..SetQueueSettingsParams::new("q")
    })
    .await
    .expect("limit the queue");
}

/// "No running row holds this slot" is one lookup of the running slots per claim, whatever the
/// number of slots a claim walks: with 1 000 of a queue's 2 000 slots held, a 10-item claim
/// reads the indexes of running rows a number of times bounded by what it claims. A
/// correlated check (`NOT EXISTS`, as the planner ran it: a nested loop) read them once per
/// slot walked, about 1 000 times here, and cost 53.6 ms a claim. Both ways a limited claim
/// runs: a running limit alone (one statement) and with a rate.
#[tokio::test]
async fn a_limited_claim_looks_up_the_held_slots_once_not_once_per_slot() {
    let (_db, pool, c) = migrated().await;
    limit(&c, Some(2000), None).await;
    enqueue_n(&c, 1100).await;
    let me = registered(&c).await;
    assert_eq!(claim(&c, me, 1000, LEASE).await.items.len(), 1000);
    sqlx::query("ANALYZE workpump.work")
        .execute(&pool)
        .await
        .expect("analyze");
    for rate in [None, Some(RateLimit::new(1000, Duration::from_secs(1)))] {
        limit(&c, Some(2000), rate).await;
        let mut tx = pool.begin().await.expect("begin");
        let before = scans_of_running_rows(&mut tx).await;
        let claimed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workpump.claim_work($1, ARRAY['q'], 10, interval '60 s')
             WHERE id IS NOT NULL",
        )
        .bind(me.0)
        .fetch_one(&mut *tx)
        .await
        .expect("claim");
        let scans = scans_of_running_rows(&mut tx).await - before;
        tx.commit().await.expect("commit");
        assert_eq!(claimed, 10, "rate {rate:?}");
        // Measured: 0 (one statement; the held slots hashed from one read) and 11 (with a
        // rate: one probe per slot it fills, and one); the correlated check read 1 011.
        assert!(
            scans <= 3 * claimed,
            "rate {rate:?}: {scans} scans of the running rows' indexes for one claim of \
             {claimed}: once per slot walked, not once per claim"
        );
    }
}

/// A poll of a limited queue with nothing available takes no lock and stays read-only, like
/// an unlimited one; a throttled claim returns its status row (id NULL) after the items. Both
/// ways a limited claim runs: a running limit alone (one statement) and with a rate.
#[tokio::test]
async fn an_empty_poll_of_a_limited_queue_stays_read_only_and_a_throttle_is_a_status_row() {
    for rate in [None, Some(RateLimit::new(10, Duration::from_secs(1)))] {
        let (_db, pool, c) = migrated().await;
        limit(&c, Some(1), rate).await;
        let me = registered(&c).await;
        let mut tx = pool.begin().await.expect("begin");
        let rows: Vec<Option<i64>> = sqlx::query_scalar(
            "SELECT id FROM workpump.claim_work($1, ARRAY['q'], 10, interval '60 s')",
        )
        .bind(me.0)
        .fetch_all(&mut *tx)
        .await
        .expect("claim");
        assert!(rows.is_empty(), "nothing to claim, nothing throttled");
        let xid: Option<i64> = sqlx::query_scalar("SELECT txid_current_if_assigned()")
            .fetch_one(&mut *tx)
            .await
            .expect("xid");
        assert_eq!(
            xid, None,
            "an empty poll of a limited queue took a transaction id (rate {rate:?})"
        );
        tx.rollback().await.expect("rollback");

        enqueue_n(&c, 3).await;
        /// id, queue, throttle, throttle_wait.
        type Row = (Option<i64>, String, Option<String>, Option<f64>);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT id, queue, throttle, throttle_wait
             FROM workpump.claim_work($1, ARRAY['q'], 10, interval '60 s')",
        )
        .bind(me.0)
        .fetch_all(&pool)
        .await
        .expect("claim");
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert!(rows[0].0.is_some() && rows[0].2.is_none(), "{rows:?}");
        assert_eq!(
            (
                rows[1].0,
                rows[1].1.as_str(),
                rows[1].2.as_deref(),
                rows[1].3
            ),
            (None, "q", Some("running"), None),
            "the running limit binds (with a rate, both do: running is reported)"
        );
    }
}

/// `claimers` claimers, each an instance of its own, claiming `max_items` of queue `q` at a
/// time and completing what they got at once, until a claim finds nothing and is not
/// throttled: the items they completed and the claims a limit throttled, over all of them. A
/// failed claim or completion panics, and so does a queue not drained within 120 s.
async fn drain_with_claimers(c: &PgCoordinator, claimers: usize, max_items: u32) -> (usize, usize) {
    let claimers: Vec<_> = (0..claimers)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move {
                let me = registered(&c).await;
                let deadline = Instant::now() + Duration::from_secs(120);
                let (mut completed, mut throttled) = (0, 0);
                loop {
                    let out = claim(&c, me, max_items, LEASE).await;
                    throttled += usize::from(!out.throttles.is_empty());
                    if out.items.is_empty() && out.throttles.is_empty() {
                        return (completed, throttled);
                    }
                    assert!(
                        Instant::now() < deadline,
                        "the claimers did not drain the queue"
                    );
                    let fences: Vec<Fence> = out.items.iter().map(|i| i.fence).collect();
                    completed += fences.len();
                    if !fences.is_empty() {
                        tokio::task::yield_now().await;
                        c.complete_work(CompleteWorkParams {
                            instance: me,
                            items: fences,
                            hand_off: Vec::new(),
                        })
                        .await
                        .expect("complete");
                    }
                }
            })
        })
        .collect();
    let (mut completed, mut throttled) = (0, 0);
    for t in claimers {
        let (n, th) = t.await.expect("claimer");
        completed += n;
        throttled += th;
    }
    (completed, throttled)
}

/// Four claimers racing on a queue with `max_running` 5: a sampler reading the committed
/// running count never sees more than 5, it does see 5, and every item is completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_never_run_more_than_max_running() {
    const ITEMS: usize = 300;
    const LIMIT: i64 = 5;
    let (_db, pool, c) = migrated().await;
    limit(&c, Some(LIMIT as u32), None).await;
    enqueue_n(&c, ITEMS).await;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (pool, done) = (pool.clone(), done.clone());
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                samples.push(
                    count(
                        &pool,
                        "SELECT count(*) FROM workpump.work_all WHERE queue = 'q' AND state = 'running'",
                    )
                    .await,
                );
            }
            samples
        })
    };
    let (completed, throttled) = drain_with_claimers(&c, 4, 3).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let samples = sampler.await.expect("sampler");
    assert_eq!(completed, ITEMS, "every item ran once");
    let finished = count(
        &pool,
        "SELECT count(*) FROM workpump.work_all WHERE queue = 'q' AND state = 'completed'",
    )
    .await;
    assert_eq!(finished, ITEMS as i64);
    assert!(!samples.is_empty(), "the sampler read the running count");
    let highest = samples.iter().copied().max().unwrap_or_default();
    assert!(
        highest <= LIMIT,
        "{highest} running at once (limit {LIMIT})"
    );
    assert!(throttled > 0, "the claimers met the limit");
    assert_eq!(highest, LIMIT, "the limit was reached: {samples:?}");
}

/// Two claimers racing for the one slot of a queue with `max_running` 1, one item a claim,
/// each completing what it got at once: a claim whose snapshot predates the other's commit
/// must not take the slot that commit filled (claim_work, step 5a: the slot's new version
/// fails the check that its filler is visible). A trigger the test adds refuses any update of
/// `work` after which, in a snapshot taken then, two items of the queue run: the claim that
/// would break the limit fails instead of committing, and a sampler could miss it between
/// two reads. Without that check, or without the claim's new version of the slot, this
/// failed within about a thousand claims in each of 8 tries (pgbench, two sessions), and
/// this test in each of 15 runs (3 000 or 5 000 items, failing after 0.6 to 17 s of a run
/// that takes 12 to 19 s while another build shares the machine: the race is a matter of
/// chance, hence the many items).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_racing_for_the_last_slot_never_both_take_it() {
    const ITEMS: usize = 5000;
    let (_db, pool, c) = migrated().await;
    limit(&c, Some(1), None).await;
    enqueue_n(&c, ITEMS).await;
    sqlx::raw_sql(
        "CREATE FUNCTION workpump.refuse_two_running() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF (SELECT count(*) FROM workpump.work WHERE queue = 'q' AND state = 'running') > 1 THEN
                 RAISE EXCEPTION 'two items of q run at once (max_running 1)';
             END IF;
             RETURN NULL;
         END $$;
         CREATE TRIGGER refuse_two_running AFTER UPDATE ON workpump.work
             FOR EACH STATEMENT EXECUTE FUNCTION workpump.refuse_two_running();",
    )
    .execute(&pool)
    .await
    .expect("the trigger");
    let (completed, throttled) = drain_with_claimers(&c, 2, 1).await;
    assert_eq!(completed, ITEMS, "every item ran once");
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM workpump.work_all WHERE queue = 'q' AND state = 'completed'"
        )
        .await,
        ITEMS as i64
    );
    assert!(
        throttled > 0,
        "the claimers met the limit: they raced for the slot"
    );
}

/// A store whose `work` holds 3 000 dead letters ahead of 3 000 available ones in queue `q`,
/// analyzed: a sequential scan looking for a queue's first available row reads every
/// finished one. (Dead letters: completed items leave `work` for `work_history`.)
async fn behind_finished_rows() -> (TestDatabase, PgPool, PgCoordinator) {
    let (db, pool, c) = migrated().await;
    enqueue_n(&c, 3000).await;
    sqlx::query("UPDATE workpump.work SET state = 'dead', finished_at = now()")
        .execute(&pool)
        .await
        .expect("finish the first rows");
    enqueue_n(&c, 3000).await;
    sqlx::query("ANALYZE workpump.work")
        .execute(&pool)
        .await
        .expect("analyze");
    (db, pool, c)
}

/// The session's sequential scans of `work` not yet reported to the statistics (which may
/// include its earlier transactions'): compare before and after a call.
async fn seq_scans_of_work(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(seq_scan), 0)::bigint FROM pg_stat_xact_user_tables
         WHERE schemaname = 'workpump' AND relname = 'work'",
    )
    .fetch_one(&mut **tx)
    .await
    .expect("scans of work")
}

/// The session's row writes in this transaction, as (updates and deletes in `work`, inserts
/// into `work_history`'s partitions): compare before and after a call.
async fn row_writes(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT n_tup_upd FROM pg_stat_xact_user_tables
                 WHERE schemaname = 'workpump' AND relname = 'work'),
                (SELECT n_tup_del FROM pg_stat_xact_user_tables
                 WHERE schemaname = 'workpump' AND relname = 'work'),
                (SELECT coalesce(sum(n_tup_ins), 0)::int8 FROM pg_stat_xact_user_tables
                 WHERE schemaname = 'workpump' AND relname LIKE 'work\\_history%')",
    )
    .fetch_one(&mut **tx)
    .await
    .expect("row writes")
}

/// The session's scans of the indexes of running rows (`work_running_owner`,
/// `work_running_slot`) in this transaction: compare before and after a call.
async fn scans_of_running_rows(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>) -> i64 {
    sqlx::query_scalar(
        "SELECT pg_stat_get_xact_numscans('workpump.work_running_owner'::regclass)
              + pg_stat_get_xact_numscans('workpump.work_running_slot'::regclass)",
    )
    .fetch_one(&mut **tx)
    .await
    .expect("scans of the running rows' indexes")
}

/// A claim reads `work` through its indexes only, limited queue or not, reclaiming or not,
/// with its generic plans (claim_work forces them): with finished rows ahead of the queue's
/// first available one, a sequential scan (which the planner prefers for an `EXISTS` it expects
/// to match early) reads them all on every claim. The limited claim's "anything to claim?"
/// probe did, until it asked for the first row in `work_claim`'s order.
#[tokio::test]
async fn a_claim_reads_work_through_its_indexes_only_limited_or_not() {
    let (_db, pool, c) = behind_finished_rows().await;
    let me = registered(&c).await;
    let cases = [
        (None, false),
        (Some(50), false),
        (Some(1000), false),
        (None, true),
        (Some(1000), true),
    ];
    for (max_running, orphan) in cases {
        limit(&c, max_running, None).await;
        if orphan {
            // A released lease (as a reap or the sweep leaves one): the claim goes through its
            // orphan steps too.
            sqlx::query(
                "UPDATE workpump.work SET instance_id = NULL, lease_expiry = NULL
                 WHERE id = (SELECT min(id) FROM workpump.work_all WHERE state = 'running')",
            )
            .execute(&pool)
            .await
            .expect("release a lease");
        }
        let mut tx = pool.begin().await.expect("begin");
        let before = seq_scans_of_work(&mut tx).await;
        let ids: Vec<Option<i64>> = sqlx::query_scalar(
            "SELECT id FROM workpump.claim_work($1, ARRAY['q'], 10, interval '60 s')",
        )
        .bind(me.0)
        .fetch_all(&mut *tx)
        .await
        .expect("claim");
        assert_eq!(ids.iter().flatten().count(), 10, "{max_running:?}: {ids:?}");
        let after = seq_scans_of_work(&mut tx).await;
        assert_eq!(
            after - before,
            0,
            "a claim with max_running {max_running:?} (an orphan: {orphan}) scanned the whole work table"
        );
        tx.commit().await.expect("commit");
    }
}

/// A completion that meets its row locked by the holder's own renewal (a renewal batch and an
/// outcome of one worker cross all the time) waits for it and is then recorded on the renewed
/// row: the fence is instance, token and state, and a newer version of the row is no reason to
/// refuse. (Written by row version — a TID scan — the completion re-checked the version it had
/// found against the renewed one, and refused: the item re-ran when its lease lapsed.)
#[tokio::test]
async fn a_completion_waiting_on_its_own_renewal_is_recorded_when_the_renewal_commits() {
    let (_db, pool, c) = migrated().await;
    let me = registered(&c).await;
    enqueue_n(&c, 1).await;
    let item = claim(&c, me, 1, LEASE).await.items[0].clone();
    let mut renewal = pool.begin().await.expect("begin");
    let renewed: String = sqlx::query_scalar(
        "SELECT status FROM workpump.renew_leases($1, ARRAY[$2::int8], ARRAY[$3::int8], interval '60 s')",
    )
    .bind(me.0)
    .bind(item.fence.id)
    .bind(item.fence.token)
    .fetch_one(&mut *renewal)
    .await
    .expect("renew");
    assert_eq!(renewed, "renewed");
    let completing = tokio::spawn({
        let c = c.clone();
        async move {
            c.complete_work(CompleteWorkParams {
                instance: me,
                items: vec![item.fence],
                hand_off: Vec::new(),
            })
            .await
        }
    });
    wait_until(
        Duration::from_secs(20),
        "the completion waits for the renewal's row lock",
        || async {
            count(
                &pool,
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'
                   AND query LIKE '%complete_work%'",
            )
            .await
                == 1
        },
    )
    .await;
    renewal.commit().await.expect("commit the renewal");
    let done = completing
        .await
        .expect("the completion task")
        .expect("complete");
    assert_eq!(
        done.items[0].state,
        Some(WorkState::Completed),
        "the holder's completion is recorded, not fenced out"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM workpump.work_history").await,
        1
    );
}

/// A completion reaches `work` by primary key only, never through an index of running rows
/// nor sequentially, with a generic plan and statistics taken while nothing ran (they
/// estimate one running row; 6 000 rows, so that a sequential scan is not the cheapest plan
/// anyway): given the chance, the planner chose to scan every running row of
/// `work_running_lease` and filter them. Every pair is
/// answered, each once, a stale token refused. It writes no new row version in `work`: each
/// completed row is deleted there and appended to `work_history`.
#[tokio::test]
async fn a_completion_reads_work_by_primary_key_only() {
    let (_db, pool, c) = behind_finished_rows().await;
    let me = registered(&c).await;
    let claimed = claim(&c, me, 200, LEASE).await.items;
    assert_eq!(claimed.len(), 200);
    let mut ids: Vec<i64> = claimed.iter().map(|i| i.fence.id).collect();
    let mut tokens: Vec<i64> = claimed.iter().map(|i| i.fence.token).collect();
    // A repeated pair and a stale token.
    ids.extend([ids[0], ids[1]]);
    tokens.extend([tokens[0], tokens[1] + 1_000_000]);

    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("SET LOCAL plan_cache_mode = force_generic_plan")
        .execute(&mut *tx)
        .await
        .expect("generic plans");
    let (seq_before, idx_before, writes_before) = (
        seq_scans_of_work(&mut tx).await,
        scans_of_running_rows(&mut tx).await,
        row_writes(&mut tx).await,
    );
    let answers: Vec<(i64, i64, bool)> =
        sqlx::query_as("SELECT id, claim_token, recorded FROM workpump.complete_work($1, $2, $3)")
            .bind(me.0)
            .bind(&ids)
            .bind(&tokens)
            .fetch_all(&mut *tx)
            .await
            .expect("complete");
    let (seq_after, idx_after, writes_after) = (
        seq_scans_of_work(&mut tx).await,
        scans_of_running_rows(&mut tx).await,
        row_writes(&mut tx).await,
    );
    tx.commit().await.expect("commit");
    assert_eq!(
        (
            writes_after.0 - writes_before.0,
            writes_after.1 - writes_before.1,
            writes_after.2 - writes_before.2
        ),
        (0, 200, 200),
        "a completion deletes its row from work (no new version there) and appends it to \
         work_history: (updates, deletes, history inserts)"
    );
    assert_eq!(
        seq_after - seq_before,
        0,
        "the completion scanned work sequentially"
    );
    assert_eq!(
        idx_after - idx_before,
        0,
        "the completion scanned an index of running rows"
    );
    assert_eq!(answers.len(), 201, "each distinct pair once: {answers:?}");
    assert_eq!(answers.iter().filter(|a| a.2).count(), 200);
    assert_eq!(
        answers[200],
        (ids[1], tokens[1] + 1_000_000, false),
        "the stale token is refused"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM workpump.work_all WHERE state = 'completed'"
        )
        .await,
        200
    );
}

/// No statement of the hot path's functions (claim, renew, complete, fail, release,
/// enqueue with a unique or an ordering key) is JIT-compiled, whatever the server's JIT
/// settings: their estimated costs grow with the table (a generic plan's unknown LIMIT, a
/// unique key's lookup of finished rows), past `jit_above_cost` with a few million rows, and
/// compiling costs far more than the statement. Here every statement's cost is past the
/// threshold (`jit_above_cost = 0`), and `pg_stat_statements` (tracking nested statements)
/// counts what was compiled: a control query must be, the functions' statements must not.
#[tokio::test]
async fn no_statement_of_the_hot_path_is_jit_compiled() {
    let (_db, pool, c) = migrated().await;
    enqueue_n(&c, 20).await;
    let me = registered(&c).await;
    let mut conn = counted_session(&pool, &["SET jit = on", "SET jit_above_cost = 0"]).await;
    let compiled = "SELECT coalesce(sum(jit_functions), 0)::bigint,
                           coalesce(string_agg(left(query, 80), ' | '), '')
                    FROM pg_stat_statements
                    WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                      AND jit_functions > 0 AND toplevel = $1 AND query ILIKE $2";
    sqlx::query("SELECT count(*) FROM generate_series(1, 10) AS jit_control")
        .execute(&mut conn)
        .await
        .expect("control");
    let (control, _): (i64, String) = sqlx::query_as(compiled)
        .bind(true)
        .bind("%jit_control%")
        .fetch_one(&mut conn)
        .await
        .expect("control's JIT");
    assert!(
        control > 0,
        "this server compiled nothing with jit_above_cost = 0 (no JIT provider?): the check \
         below would prove nothing"
    );
    let mut batches = Vec::new();
    for limit_it in [false, true] {
        if limit_it {
            limit(&c, Some(50), None).await;
        }
        let rows: Vec<(Option<i64>, Option<i64>)> = sqlx::query_as(
            "SELECT id, claim_token FROM workpump.claim_work($1, ARRAY['q'], 5, interval '60 s')",
        )
        .bind(me.0)
        .fetch_all(&mut conn)
        .await
        .expect("claim");
        let (ids, tokens): (Vec<i64>, Vec<i64>) =
            rows.into_iter().filter_map(|(i, t)| i.zip(t)).unzip();
        assert_eq!(ids.len(), 5);
        batches.push((ids, tokens));
    }
    let calls = [
        "SELECT count(*) FROM workpump.renew_leases($1, $2, $3, interval '60 s')",
        "SELECT count(*) FROM workpump.complete_work($1, $2, $3)",
    ];
    for call in calls {
        let (ids, tokens) = &batches[0];
        sqlx::query(call)
            .bind(me.0)
            .bind(ids)
            .bind(tokens)
            .execute(&mut conn)
            .await
            .expect(call);
    }
    let (ids, tokens) = &batches[1];
    let (fail_ids, release_ids) = ids.split_at(2);
    let (fail_tokens, release_tokens) = tokens.split_at(2);
    sqlx::query(
        "SELECT count(*) FROM workpump.fail_work($1, $2, $3,
             ARRAY['boom', 'boom'], ARRAY[interval '1 s', interval '1 s'], ARRAY[false, false])",
    )
    .bind(me.0)
    .bind(fail_ids)
    .bind(fail_tokens)
    .execute(&mut conn)
    .await
    .expect("fail");
    sqlx::query("SELECT count(*) FROM workpump.release_work($1, $2, $3, false)")
        .bind(me.0)
        .bind(release_ids)
        .bind(release_tokens)
        .execute(&mut conn)
        .await
        .expect("release");
    for (unique_key, ordering_key) in [(Some("u1"), None), (None, Some("k1"))] {
        sqlx::query(
            "SELECT count(*) FROM workpump.enqueue_work(ARRAY['q'], ARRAY['{}'::jsonb],
                 ARRAY[0::smallint], ARRAY[NULL::interval], ARRAY[NULL::timestamptz],
                 ARRAY[$1::text], ARRAY[NULL::integer], ARRAY[NULL::text], ARRAY[NULL::jsonb],
                 ARRAY[$2::text], false)",
        )
        .bind(unique_key)
        .bind(ordering_key)
        .execute(&mut conn)
        .await
        .expect("enqueue");
    }
    let (nested, which): (i64, String) = sqlx::query_as(compiled)
        // The statements inside the functions (their calls, at the top, run under this
        // session's settings and may be compiled: that is the caller's choice).
        .bind(false)
        .bind("%")
        .fetch_one(&mut conn)
        .await
        .expect("the functions' JIT");
    assert_eq!(nested, 0, "JIT-compiled inside the hot path: {which}");
}

/// An enqueue reads `work` through its indexes only, with its generic plans (enqueue_work
/// forces them): one item or a hundred, plain, with a unique key (new, and one already
/// held) or an ordering key (a new key, and one with a head), over a table whose finished
/// rows a sequential scan would read at every call.
#[tokio::test]
async fn an_enqueue_reads_work_through_its_indexes_only() {
    let (_db, pool, _store) = behind_finished_rows().await;
    let keys = |prefix: &str, n: usize| -> Vec<Option<String>> {
        (0..n).map(|i| Some(format!("{prefix}{i}"))).collect()
    };
    let none = |n: usize| -> Vec<Option<String>> { vec![None; n] };
    /// What is enqueued, its unique keys and its ordering keys.
    type Case = (&'static str, Vec<Option<String>>, Vec<Option<String>>);
    let cases: Vec<Case> = vec![
        ("one item", none(1), none(1)),
        ("a new unique key", keys("u", 1), none(1)),
        ("a unique key already held", keys("u", 1), none(1)),
        ("a new ordering key", none(1), keys("k", 1)),
        ("an ordering key with a head", none(1), keys("k", 1)),
        ("a hundred items", none(100), none(100)),
        ("a hundred unique keys", keys("v", 100), none(100)),
        ("a hundred ordering keys", none(100), keys("k", 100)),
    ];
    for (what, unique_keys, ordering_keys) in cases {
        let n = unique_keys.len() as i32;
        let mut tx = pool.begin().await.expect("begin");
        let before = seq_scans_of_work(&mut tx).await;
        let answered: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workpump.enqueue_work(
                 array_fill('q'::text, ARRAY[$1]), array_fill('{}'::jsonb, ARRAY[$1]),
                 array_fill(0::smallint, ARRAY[$1]), array_fill(NULL::interval, ARRAY[$1]),
                 array_fill(NULL::timestamptz, ARRAY[$1]), $2::text[],
                 array_fill(NULL::integer, ARRAY[$1]), array_fill(NULL::text, ARRAY[$1]),
                 array_fill(NULL::jsonb, ARRAY[$1]), $3::text[], false)",
        )
        .bind(n)
        .bind(&unique_keys)
        .bind(&ordering_keys)
        .fetch_one(&mut *tx)
        .await
        .expect(what);
        assert_eq!(answered, i64::from(n), "{what}");
        let after = seq_scans_of_work(&mut tx).await;
        assert_eq!(
            after - before,
            0,
            "enqueueing {what} scanned the work table"
        );
        tx.commit().await.expect("commit");
    }
}

/// `claim_work` and `enqueue_work` plan each of their statements once per session, not at
/// every call (`plan_cache_mode = force_generic_plan` on the functions; docs/store.md,
/// "Generic plans, no JIT"). Left to choose, PL/pgSQL plans a statement afresh at each of its
/// first five executions and usually keeps doing so, which took a third of a small claim's
/// time. `pg_stat_statements` with planning tracked counts each statement's plans: over ten
/// calls on one connection, every statement of the two functions must have been planned at
/// most twice (once, plus an invalidation, e.g. by autovacuum's ANALYZE); custom plans would
/// count five or more.
#[tokio::test]
async fn claim_and_enqueue_plan_their_statements_once_per_session() {
    let (_db, pool, c) = migrated().await;
    enqueue_n(&c, 100).await;
    let me = registered(&c).await;
    let mut conn = counted_session(&pool, &["SET pg_stat_statements.track_planning = on"]).await;
    const CALLS: i64 = 10;
    for _ in 0..CALLS {
        let claimed: i64 = sqlx::query_scalar(
            "SELECT count(id) FROM workpump.claim_work($1, ARRAY['q'], 5, interval '60 s')",
        )
        .bind(me.0)
        .fetch_one(&mut conn)
        .await
        .expect("claim");
        assert_eq!(claimed, 5);
        sqlx::query(
            "SELECT count(*) FROM workpump.enqueue_work(ARRAY['q'], ARRAY['{}'::jsonb],
                 ARRAY[0::smallint], ARRAY[NULL::interval], ARRAY[NULL::timestamptz],
                 ARRAY[NULL::text], ARRAY[NULL::integer], ARRAY[NULL::text], ARRAY[NULL::jsonb],
                 ARRAY[NULL::text], false)",
        )
        .execute(&mut conn)
        .await
        .expect("enqueue");
    }
    // The statements run at every call of either function (nested, so not top level).
    let stats: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 90), calls, plans
         FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND NOT toplevel AND calls = $1
         ORDER BY query",
    )
    .bind(CALLS)
    .fetch_all(&mut conn)
    .await
    .expect("pg_stat_statements");
    let claim = stats
        .iter()
        .find(|(q, _, _)| q.starts_with("WITH candidates AS MATERIALIZED"))
        .expect("the claim's statement ran at every call");
    let insert = stats
        .iter()
        .find(|(q, _, _)| q.contains("INSERT INTO work"))
        .expect("the enqueue's INSERT ran at every call");
    assert!(
        claim.2 >= 1 && insert.2 >= 1,
        "planning is not counted (pg_stat_statements.track_planning): the check below would \
         prove nothing: {stats:?}"
    );
    let replanned: Vec<_> = stats.iter().filter(|(_, _, plans)| *plans > 2).collect();
    assert!(
        replanned.is_empty(),
        "statements planned at (nearly) every call, {CALLS} calls each: (statement, calls, \
         plans) {replanned:?}"
    );
}

/// An operator's cancel that waits on a claim in flight decides on the row the claim leased,
/// and writes that row. Under READ COMMITTED an UPDATE checks the table's constraints on the
/// row version in its snapshot before it finds the newer one: when bulk_work locked and
/// decided in the same statement, it read the claimed row ("running": requested) and checked
/// the available one with the request set, which work_waiting_is_not_cancel_requested
/// refuses (the chaos suite's keyed scenario hit it). Locking in a statement of its own first
/// gives the deciding statement a snapshot that has the claim in it.
#[tokio::test]
async fn a_cancel_that_waits_on_a_claim_in_flight_requests_the_cancel_of_the_leased_item() {
    let (_db, pool, c) = migrated().await;
    let me = registered(&c).await;
    let id = enqueue_n(&c, 1).await[0];

    // The claim, in a transaction held open.
    let mut claim = pool.begin().await.expect("begin");
    let leased: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM workpump.claim_work($1, '{q}', 1, interval '60 seconds') WHERE id IS NOT NULL",
    )
    .bind(me.0)
    .fetch_all(&mut *claim)
    .await
    .expect("claim");
    assert_eq!(leased, vec![id]);

    // The cancel, which must wait for the claim's row lock.
    let ops = c.clone();
    let cancel = tokio::spawn(async move { ops.cancel_work(CancelWorkParams { id }).await });
    wait_until(
        Duration::from_secs(30),
        "the cancel waits on the claim's row lock",
        || async {
            count(
                &pool,
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE '%cancel_work%'",
            )
            .await
                == 1
        },
    )
    .await;
    claim.commit().await.expect("commit the claim");

    let out = cancel.await.expect("join").expect("cancel");
    assert_eq!(out.cancellation, Cancellation::Requested);
    let (state, requested): (String, bool) =
        sqlx::query_as("SELECT state::text, cancel_requested FROM workpump.work_all WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .expect("row");
    assert_eq!((state.as_str(), requested), ("running", true));
}

/// A renewal changes no indexed column: no index of `work` reads `lease_expiry` or
/// `renewals` (in its key, its expressions or its predicate), so with room on the page a
/// renewal is a HOT update: one row version on its page and no index entry (docs/store.md,
/// "Leases that lapse"). With `lease_expiry` in an index, as before 2026-12-03, no renewal
/// was. How many are HOT depends on the room on the pages, i.e. on pruning, which any open
/// snapshot of the database holds back: alone, the first round after the claims found
/// 45–121 of 200, and from the fourth round on all 200; beside the rest of the test suite
/// 45–83 in every round. So the catalog is checked, and every round must have HOT updates.
/// A limited queue's rows (which carry a slot) are among them.
#[tokio::test]
async fn a_renewal_is_a_hot_update() {
    let (_db, pool, c) = migrated().await;
    let me = registered(&c).await;
    enqueue_n(&c, 100).await;
    let mut fences: Vec<Fence> = claim(&c, me, 100, LEASE)
        .await
        .items
        .iter()
        .map(|i| i.fence)
        .collect();
    c.register_queue(RegisterQueueParams {
        name: "limited".into(),
        max_attempts: 3,
        ordering_dead_head: Default::default(),
        max_running: Some(1000),
        rate_limit: None,
        owner: None,
    })
    .await
    .expect("queue");
    enqueue(
        &c,
        (0..100)
            .map(|i| NewWork::new("limited", json!(i)))
            .collect(),
    )
    .await;
    let limited = c
        .claim_work(ClaimWorkParams {
            instance: me,
            queues: vec!["limited".into()],
            max_items: 100,
            lease: LEASE,
            async_commit: false,
        })
        .await
        .expect("claim");
    assert_eq!(limited.items.len(), 100);
    fences.extend(limited.items.iter().map(|i| i.fence));
    let ids: Vec<i64> = fences.iter().map(|f| f.id).collect();
    let tokens: Vec<i64> = fences.iter().map(|f| f.token).collect();
    let mut hot_per_round = Vec::new();
    for _ in 0..4 {
        let mut tx = pool.begin().await.expect("begin");
        let counts = "SELECT pg_stat_get_xact_tuples_updated('workpump.work'::regclass),
                             pg_stat_get_xact_tuples_hot_updated('workpump.work'::regclass)";
        let (updated_before, hot_before): (i64, i64) = sqlx::query_as(counts)
            .fetch_one(&mut *tx)
            .await
            .expect("counts");
        let renewed: Vec<String> = sqlx::query_scalar(
            "SELECT status FROM workpump.renew_leases($1, $2, $3, interval '60 s')",
        )
        .bind(me.0)
        .bind(&ids)
        .bind(&tokens)
        .fetch_all(&mut *tx)
        .await
        .expect("renew");
        assert!(renewed.iter().all(|s| s == "renewed"), "{renewed:?}");
        let (updated, hot): (i64, i64) = sqlx::query_as(counts)
            .fetch_one(&mut *tx)
            .await
            .expect("counts");
        tx.commit().await.expect("commit");
        assert_eq!(updated - updated_before, 200);
        hot_per_round.push(hot - hot_before);
    }
    assert!(
        hot_per_round.iter().all(|&n| n > 0),
        "HOT per round: {hot_per_round:?}"
    );
    // The columns a renewal writes, in any index of work (key, expression or predicate).
    let indexed: Vec<String> = sqlx::query_scalar(
        "SELECT i.indexrelid::regclass::text
         FROM pg_index i
         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attname IN ('lease_expiry', 'renewals')
         WHERE i.indrelid = 'workpump.work'::regclass
           AND (a.attnum = ANY (i.indkey::int2[])
                OR pg_get_expr(i.indexprs, i.indrelid) LIKE '%' || a.attname || '%'
                OR pg_get_expr(i.indpred, i.indrelid) LIKE '%' || a.attname || '%')",
    )
    .fetch_all(&pool)
    .await
    .expect("indexes");
    assert!(
        indexed.is_empty(),
        "indexes reading what a renewal writes: {indexed:?}"
    );
}

/// The sweep finds lapsed leases through the running rows' index, not by reading `work`
/// whole: maintenance_due's look and the release read no row of `work` sequentially, with
/// many more waiting and finished rows than running ones.
#[tokio::test]
async fn the_sweep_finds_lapsed_leases_without_a_sequential_scan() {
    let (_db, pool, c) = behind_finished_rows().await;
    let me = registered(&c).await;
    claim(&c, me, 20, LEASE).await;
    sqlx::query("ANALYZE workpump.work")
        .execute(&pool)
        .await
        .expect("analyze");
    for lapsed in [false, true] {
        if lapsed {
            sqlx::query(
                "UPDATE workpump.work SET lease_expiry = now() - interval '1 s'
                 WHERE id = (SELECT min(id) FROM workpump.work WHERE state = 'running')",
            )
            .execute(&pool)
            .await
            .expect("expire");
        }
        let mut tx = pool.begin().await.expect("begin");
        let before = seq_scans_of_work(&mut tx).await;
        let (orphans,): (bool,) = sqlx::query_as(
            "SELECT orphans FROM workpump.maintenance_due(NULL, interval '30 s', NULL, NULL,
                                                          interval '1 day', interval '7 days', interval '7 days',
                                                          interval '0')",
        )
        .fetch_one(&mut *tx)
        .await
        .expect("maintenance_due");
        assert_eq!(orphans, lapsed);
        let released: Vec<i32> = sqlx::query_scalar(
            "SELECT ended FROM workpump.dead_letter_expired(1000) WHERE state = 'running'",
        )
        .fetch_all(&mut *tx)
        .await
        .expect("sweep");
        assert_eq!(released, if lapsed { vec![1] } else { vec![] });
        let after = seq_scans_of_work(&mut tx).await;
        assert_eq!(
            after - before,
            0,
            "lapsed {lapsed}: the sweep scanned work whole"
        );
        tx.commit().await.expect("commit");
    }
}

/// Whether `statement`, run on `conn` in a transaction of its own (rolled back), took a
/// transaction id: whether it wrote, a row lock included.
async fn takes_xid(conn: &mut PgConnection, statement: &str) -> bool {
    let mut tx = conn.begin().await.expect("begin");
    sqlx::query(statement)
        .execute(&mut *tx)
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
    let xid: Option<i64> = sqlx::query_scalar("SELECT txid_current_if_assigned()")
        .fetch_one(&mut *tx)
        .await
        .expect("xid");
    tx.rollback().await.expect("rollback");
    xid.is_some()
}

/// A session of its own for a peer's calls beside another session's open transaction; it
/// gives up waiting for a lock after 2 s, so a call that waits fails the test, never hangs it.
async fn impatient_peer(pool: &PgPool) -> PgConnection {
    let mut peer = PgConnection::connect_with(&pool.connect_options())
        .await
        .expect("connection");
    sqlx::query("SET lock_timeout = '2s'")
        .execute(&mut peer)
        .await
        .expect("lock_timeout");
    peer
}

/// `statement` is refused with WP002 and a message naming `what`.
async fn assert_wp002(conn: &mut PgConnection, statement: &str, what: &str) {
    let err = sqlx::query(statement)
        .execute(conn)
        .await
        .expect_err("refused");
    let db = err.as_database_error().expect("a database error");
    assert_eq!(db.code().as_deref(), Some("WP002"), "{statement}");
    assert!(db.message().contains(what), "{}", db.message());
}

/// The fleet's turn to look for lapsed leases is taken without waiting: while one sweep's
/// call is looking (its transaction open), a peer's call skips the look at once instead of
/// queueing on the `lapsed_look` row, and a look whose transaction rolls back took no turn,
/// so the next call looks. A call on a store with nothing running, or off its turn, writes
/// nothing: it takes no transaction id (a row lock would).
#[tokio::test]
async fn a_sweep_never_waits_for_a_peer_taking_the_lapsed_lease_turn() {
    let (_db, pool, c) = migrated().await;
    const DUE: &str = "SELECT orphans FROM workpump.maintenance_due(NULL, interval '30 s', NULL,
         NULL, interval '1 day', interval '7 days', interval '7 days', interval '1 hour')";
    let mut peer = impatient_peer(&pool).await;
    let me = registered(&c).await;
    enqueue_n(&c, 2).await;
    assert!(
        !takes_xid(&mut peer, DUE).await,
        "nothing runs: no turn, no write"
    );
    let claimed = claim(&c, me, 2, LEASE).await;
    assert!(
        takes_xid(&mut peer, DUE).await,
        "a lease held: the call takes the turn"
    );
    let lapse = |id: WorkId| {
        sqlx::query("UPDATE workpump.work SET lease_expiry = now() - interval '1 s' WHERE id = $1")
            .bind(id)
            .execute(&pool)
    };

    /// `maintenance_due`'s orphans flag on `conn`: with the leases here, whether it looked
    /// and found a lapsed one.
    async fn due(conn: &mut PgConnection, when: &str) -> bool {
        sqlx::query_scalar(DUE)
            .fetch_one(conn)
            .await
            .unwrap_or_else(|e| panic!("{when}: {e}"))
    }

    let mut taker = pool.begin().await.expect("begin");
    assert!(!due(&mut taker, "the taker's call").await, "nothing lapsed");
    lapse(claimed.items[0].fence.id)
        .await
        .expect("expire a lease");
    assert!(
        !due(
            &mut peer,
            "the peer's call: it must not wait for the taker's lock"
        )
        .await,
        "the turn is the taker's while its transaction is open"
    );

    taker.rollback().await.expect("rollback");
    assert!(
        due(&mut peer, "the peer's call after the rollback").await,
        "a look rolled back took no turn: the peer looks"
    );
    assert!(
        due(&mut peer, "the next call").await,
        "a look that found a lapsed lease left the turn free"
    );
    sqlx::query("SELECT * FROM workpump.dead_letter_expired(1000)")
        .execute(&pool)
        .await
        .expect("release the lapsed lease");
    assert!(
        !due(&mut peer, "the call after the release").await,
        "nothing lapsed: this look takes the turn"
    );
    lapse(claimed.items[1].fence.id)
        .await
        .expect("expire the other lease");
    assert!(
        !due(&mut peer, "the call after").await,
        "the turn was taken: no look for an hour"
    );
    assert!(!takes_xid(&mut peer, DUE).await, "off its turn: no write");

    // Called directly (the Rust API cannot send these), a negative or NULL period is refused.
    for every in ["interval '-1 s'", "NULL"] {
        let statement = DUE.replace("interval '1 hour'", every);
        assert_wp002(&mut peer, &statement, "lapsed_look_every").await;
    }
}

/// The queue depth is sampled in turns (docs/store.md, "The queue depth, sampled in turns"):
/// a call that finds a peer counting returns the last sample at once instead of waiting for
/// the peer's lock; a call that reads a fresh sample writes nothing (no transaction id); a
/// count rolled back stores nothing; and the store's first sample, with a peer counting, is
/// counted rather than read empty.
#[tokio::test]
async fn a_depth_sample_never_waits_for_a_peer_counting_and_a_read_writes_nothing() {
    let (_db, pool, c) = migrated().await;
    /// `(available items of the queue, the sample's age in seconds)` by `queue_depth(max_age)`
    /// on `conn`.
    async fn depth(conn: &mut PgConnection, max_age: &str, when: &str) -> (i64, f64) {
        sqlx::query_as(&format!(
            "SELECT coalesce(sum(items) FILTER (WHERE state = 'available'), 0)::bigint,
                    coalesce(max(sample_age), 0)
             FROM workpump.queue_depth(interval '{max_age}')"
        ))
        .fetch_one(conn)
        .await
        .unwrap_or_else(|e| panic!("{when}: {e}"))
    }
    const READ_WITHIN_AN_HOUR: &str = "SELECT * FROM workpump.queue_depth(interval '1 hour')";
    let mut peer = impatient_peer(&pool).await;
    enqueue_n(&c, 2).await;

    // The store's first sample, taken by a counter that has not committed: the peer does not
    // wait for it, and counts for itself rather than read the empty sample.
    let mut counter = pool.begin().await.expect("begin");
    assert_eq!(depth(&mut counter, "0", "the counter").await.0, 2);
    assert_eq!(
        depth(
            &mut peer,
            "0",
            "the peer beside the first count: it must not wait"
        )
        .await,
        (2, 0.0)
    );
    counter.rollback().await.expect("rollback");
    assert!(
        takes_xid(&mut peer, READ_WITHIN_AN_HOUR).await,
        "the count rolled back stored nothing: the next call counts"
    );
    assert_eq!(depth(&mut peer, "0", "a count").await.0, 2);

    enqueue_n(&c, 3).await;
    assert!(
        !takes_xid(&mut peer, READ_WITHIN_AN_HOUR).await,
        "a fresh sample is read: no write"
    );
    assert_eq!(
        depth(&mut peer, "1 hour", "a read").await.0,
        2,
        "the sample as it was counted"
    );
    let mut counter = pool.begin().await.expect("begin");
    assert_eq!(depth(&mut counter, "0", "the counter").await.0, 5);
    let (items, age) = depth(&mut peer, "0", "the peer beside a count: it must not wait").await;
    assert_eq!(items, 2, "the last committed sample, older than asked");
    assert!(age >= 0.0, "{age}");
    counter.commit().await.expect("commit");
    assert_eq!(
        depth(&mut peer, "1 hour", "after the commit").await.0,
        5,
        "the committed count is the fleet's sample"
    );

    // Called directly (the Rust API cannot send these), a negative or NULL max_age is refused.
    for max_age in ["interval '-1 s'", "NULL"] {
        let statement = format!("SELECT * FROM workpump.queue_depth({max_age})");
        assert_wp002(&mut peer, &statement, "max_age").await;
    }
}

/// The check for headless ordering keys is taken in turns (docs/ordering.md, "The
/// backstop"): a call that finds a peer checking goes on at once instead of waiting for the
/// peer's lock; a store with nothing blocked, and a call off its turn, write nothing (no
/// transaction id); a check rolled back took no turn.
#[tokio::test]
async fn an_ordering_check_never_waits_for_a_peer_checking_and_off_its_turn_writes_nothing() {
    let (_db, pool, c) = migrated().await;
    /// `ordering_repair(100, every)` on `conn`: the keys repaired.
    async fn repair(conn: &mut PgConnection, every: &str, when: &str) -> i32 {
        sqlx::query_scalar(&format!(
            "SELECT workpump.ordering_repair(100, interval '{every}')"
        ))
        .fetch_one(conn)
        .await
        .unwrap_or_else(|e| panic!("{when}: {e}"))
    }
    const CHECK_WITHIN_AN_HOUR: &str = "SELECT workpump.ordering_repair(100, interval '1 hour')";
    let mut peer = impatient_peer(&pool).await;
    enqueue_n(&c, 2).await;
    assert!(
        !takes_xid(&mut peer, CHECK_WITHIN_AN_HOUR).await,
        "nothing blocked: no turn, no write"
    );
    let keyed = |k: &str| {
        (0..2)
            .map(|i| NewWork::new("q", json!(i)).ordering_key(k))
            .collect::<Vec<_>>()
    };
    let a = enqueue(&c, keyed("a")).await;
    assert!(
        takes_xid(&mut peer, CHECK_WITHIN_AN_HOUR).await,
        "something blocked: the call takes the turn"
    );
    let delete_head = |id: WorkId| {
        sqlx::query("DELETE FROM workpump.work WHERE id = $1")
            .bind(id)
            .execute(&pool)
    };
    delete_head(a[0].id).await.expect("delete a head");

    let mut checker = pool.begin().await.expect("begin");
    assert_eq!(repair(&mut checker, "1 hour", "the checker").await, 1);
    assert_eq!(
        repair(&mut peer, "0", "the peer beside a check: it must not wait").await,
        0,
        "the turn is the checker's while its transaction is open"
    );
    checker.rollback().await.expect("rollback");
    assert_eq!(
        repair(&mut peer, "1 hour", "after the rollback").await,
        1,
        "a check rolled back took no turn: the peer checks"
    );
    let b = enqueue(&c, keyed("b")).await;
    delete_head(b[0].id).await.expect("delete a head");
    assert_eq!(
        repair(&mut peer, "1 hour", "the call after").await,
        0,
        "the turn was taken: no check for an hour"
    );
    assert!(
        !takes_xid(&mut peer, CHECK_WITHIN_AN_HOUR).await,
        "off its turn: no write"
    );
    assert_eq!(repair(&mut peer, "0", "zero").await, 1);

    // Called directly (the Rust API cannot send these), a negative or NULL period is refused.
    for every in ["interval '-1 s'", "NULL"] {
        let statement = format!("SELECT workpump.ordering_repair(100, {every})");
        assert_wp002(&mut peer, &statement, "every").await;
    }
}

/// A batch without unique keys is inserted without `ON CONFLICT`, so none of its rows is a
/// speculative insertion (a probe of the arbiter index and one more WAL record a row, the
/// confirmation; docs/performance.md, "Enqueue"). `pg_stat_statements` counts the INSERT's
/// WAL records: a row writes its heap tuple and an entry in each of `work_pkey` and
/// `work_claim`, three records; speculative insertion makes it four. The sequence's log
/// record (one per 32 ids), new pages and page splits add a few per batch.
#[tokio::test]
async fn an_enqueue_without_unique_keys_writes_no_speculative_insertion() {
    let (_db, pool, _c) = migrated().await;
    let mut conn = counted_session(&pool, &[]).await;
    const ROWS: i64 = 300;
    let answered: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM workpump.enqueue_work(
             array_fill('q'::text, ARRAY[$1]), array_fill('{}'::jsonb, ARRAY[$1]),
             array_fill(0::smallint, ARRAY[$1]), array_fill(NULL::interval, ARRAY[$1]),
             array_fill(NULL::timestamptz, ARRAY[$1]), array_fill(NULL::text, ARRAY[$1]),
             array_fill(NULL::integer, ARRAY[$1]), array_fill(NULL::text, ARRAY[$1]),
             array_fill(NULL::jsonb, ARRAY[$1]), array_fill(NULL::text, ARRAY[$1]), false)",
    )
    .bind(ROWS as i32)
    .fetch_one(&mut conn)
    .await
    .expect("enqueue");
    assert_eq!(answered, ROWS);
    let inserts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 60), wal_records
         FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND NOT toplevel AND query LIKE '%INSERT INTO work (%'",
    )
    .fetch_all(&mut conn)
    .await
    .expect("pg_stat_statements");
    let [(_, records)] = inserts[..] else {
        panic!("one INSERT into work ran (nested, counted): {inserts:?}");
    };
    assert!(
        (3 * ROWS..=3 * ROWS + ROWS / 10).contains(&records),
        "{ROWS} rows wrote {records} WAL records: three a row and a few more were expected, four \
         a row is a speculative insertion"
    );
}

/// A claim with `async_commit` turns `synchronous_commit` off for the rest of its transaction
/// (its commit does not wait for the WAL flush), and only then: a claim without it leaves the
/// session's setting alone, and the next transaction has the session's setting again.
#[tokio::test]
async fn a_claim_with_async_commit_commits_without_waiting_for_the_flush() {
    let (_db, pool, c) = migrated().await;
    enqueue_n(&c, 2).await;
    let me = registered(&c).await;
    let mut conn = PgConnection::connect_with(&pool.connect_options())
        .await
        .expect("connection");
    // The test cluster runs with it off: the session turns it on, so that off can be seen.
    sqlx::query("SET synchronous_commit = on")
        .execute(&mut conn)
        .await
        .expect("set");
    for async_commit in [true, false] {
        let mut tx = conn.begin().await.expect("begin");
        let claimed: i64 = sqlx::query_scalar(
            "SELECT count(id) FROM workpump.claim_work($1, ARRAY['q'], 1, interval '60 s', $2)",
        )
        .bind(me.0)
        .bind(async_commit)
        .fetch_one(&mut *tx)
        .await
        .expect("claim");
        assert_eq!(claimed, 1, "async_commit {async_commit}");
        let setting: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&mut *tx)
            .await
            .expect("show");
        let expected = if async_commit { "off" } else { "on" };
        assert_eq!(setting, expected, "async_commit {async_commit}");
        tx.commit().await.expect("commit");
        let after: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&mut conn)
            .await
            .expect("show");
        assert_eq!(
            after, "on",
            "after a claim with async_commit {async_commit}"
        );
    }
    // The argument is checked like the others.
    let err =
        sqlx::query("SELECT * FROM workpump.claim_work($1, ARRAY['q'], 1, interval '60 s', NULL)")
            .bind(me.0)
            .execute(&mut conn)
            .await
            .expect_err("a NULL async_commit");
    assert!(
        err.to_string().contains("async_commit must not be null"),
        "{err}"
    );
}

/// The calls pg_stat_statements counted, in this database, of statements whose text is
/// `LIKE` `pattern`.
async fn calls_like(pool: &PgPool, pattern: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND query LIKE $1",
    )
    .bind(pattern)
    .fetch_one(pool)
    .await
    .expect("pg_stat_statements")
}

/// A store on a one-connection pool whose sessions count nested statements in
/// pg_stat_statements (the extension created and its counts reset through `pool`).
async fn tracked_store(pool: &PgPool) -> (PgPool, PgCoordinator) {
    let tracked = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(
            pool.connect_options()
                .as_ref()
                .clone()
                .options([("pg_stat_statements.track", "all")]),
        )
        .await
        .expect("a pool that tracks nested statements");
    // Creates the extension and resets the counts; the session itself is not needed.
    drop(counted_session(pool, &[]).await);
    (tracked.clone(), PgCoordinator::new(tracked))
}

/// `PgCoordinator::claim_work` hands `ClaimWorkParams::async_commit` to the store: a claim
/// with it runs the statement that turns `synchronous_commit` off, a claim without it does
/// not (counted by `pg_stat_statements` in the coordinator's own sessions, which track nested
/// statements).
#[tokio::test]
async fn the_coordinator_passes_async_commit_to_the_store() {
    let (_db, pool, c) = migrated().await;
    enqueue_n(&c, 3).await;
    let me = registered(&c).await;
    let (tracked, store) = tracked_store(&pool).await;
    let turned_off = || calls_like(&tracked, "%set_config%");
    for (async_commit, expected) in [(false, 0), (true, 1), (false, 1)] {
        let out = store
            .claim_work(ClaimWorkParams {
                instance: me,
                queues: vec!["q".into()],
                max_items: 1,
                lease: LEASE,
                async_commit,
            })
            .await
            .expect("claim");
        assert_eq!(out.items.len(), 1, "async_commit {async_commit}");
        assert_eq!(
            turned_off().await,
            expected,
            "set_config calls after a claim with async_commit {async_commit}"
        );
    }
}

/// An enqueue in a caller's transaction through `enqueue_deferring_wake` does not notify (its
/// commit takes no notification lock, docs/store.md "Wake signals"), and owes a wake for the
/// queues given due work only; `wake`, after the commit, sends it. `enqueue_with`, in
/// contrast, notifies inside the transaction: the count that stays 0 for the first moves for
/// the second.
#[tokio::test]
async fn an_enqueue_deferring_its_wake_notifies_only_after_the_commit() {
    let (_db, pool, _c) = migrated().await;
    let (tracked, store) = tracked_store(&pool).await;
    let notified_in_enqueue = || calls_like(&pool, "%pg_notify(current_schema()%");
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .expect("a listener");
    listener.listen("workpump.wake").await.expect("listen");

    let items = || EnqueueWorkParams {
        items: vec![
            NewWork::new("q", json!(1)),
            NewWork::new("q", json!(2)).run_after(Duration::from_secs(3600)),
        ],
    };
    let mut tx = store.begin_transaction().await.expect("begin");
    let (out, pending) = store
        .enqueue_deferring_wake(&mut tx, items())
        .await
        .expect("enqueue");
    assert_eq!(out.items.len(), 2);
    assert_eq!(pending.queues(), ["q".to_string()]);
    store.commit_transaction(tx).await.expect("commit");
    assert_eq!(
        notified_in_enqueue().await,
        0,
        "no NOTIFY in the transaction"
    );
    store.wake(pending).await;
    let woken = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("a wake within 10 s")
        .expect("the notification");
    assert_eq!(woken.payload(), "q");

    let mut tx = tracked.begin().await.expect("begin");
    store.enqueue_with(&mut tx, items()).await.expect("enqueue");
    tx.commit().await.expect("commit");
    assert_eq!(
        notified_in_enqueue().await,
        1,
        "enqueue_with notifies in the transaction"
    );
}

/// Wake signals owed by several enqueues of one transaction merge: each queue once, sorted;
/// an enqueue of only later work owes none.
#[tokio::test]
async fn pending_wakes_merge_into_one_per_queue() {
    let (_db, _pool, c) = migrated().await;
    c.register_queue(RegisterQueueParams::new("a"))
        .await
        .expect("register a");
    let mut tx = c.begin_transaction().await.expect("begin");
    let mut owed = PendingWake::default();
    for items in [
        vec![NewWork::new("q", json!(1)), NewWork::new("a", json!(2))],
        vec![NewWork::new("q", json!(3))],
        vec![NewWork::new("a", json!(4)).run_after(Duration::from_secs(60))],
    ] {
        let (_, pending) = c
            .enqueue_deferring_wake(&mut tx, EnqueueWorkParams { items })
            .await
            .expect("enqueue");
        owed.merge(pending);
    }
    assert_eq!(owed.queues(), ["a".to_string(), "q".to_string()]);
    let (_, later) = c
        .enqueue_deferring_wake(
            &mut tx,
            EnqueueWorkParams {
                items: vec![NewWork::new("q", json!(5)).run_after(Duration::from_secs(60))],
            },
        )
        .await
        .expect("enqueue later work");
    assert!(later.queues().is_empty());
    tx.rollback().await.expect("rollback");
}
