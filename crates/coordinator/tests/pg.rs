//! What only the PostgreSQL store has: migrations, constraints, caller transactions, NOTIFY,
//! row locks, schemas and an unreachable server.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Connection;
use workpump_coordinator::testing::{
    fresh_database as fresh, fresh_store_with_queue, registered_instance,
};
use workpump_coordinator::*;
use workpump_testdb::TestDatabase;

async fn migrated() -> (TestDatabase, PgPool, PgCoordinator) {
    fresh_store_with_queue("q").await
}

async fn claim_one(c: &PgCoordinator, me: InstanceId) -> ClaimedWork {
    claim_one_committing(c, me, false).await
}

/// [`claim_one`], its commit asynchronous when `async_commit`.
async fn claim_one_committing(
    c: &PgCoordinator,
    me: InstanceId,
    async_commit: bool,
) -> ClaimedWork {
    let out = c
        .claim_work(ClaimWorkParams {
            instance: me,
            queues: vec!["q".into()],
            max_items: 1,
            lease: Duration::from_secs(60),
            async_commit,
        })
        .await
        .expect("claim");
    out.items.into_iter().next().expect("one item")
}

#[tokio::test]
async fn migrations_run_twice_are_a_no_op_and_concurrent_migrations_are_safe() {
    let (_db, pool) = fresh().await;
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { migrate(&pool, DEFAULT_SCHEMA).await })
        })
        .collect();
    for r in runs {
        r.await.expect("task").expect("concurrent migrate");
    }
    migrate(&pool, DEFAULT_SCHEMA).await.expect("again");
    let applied: i64 =
        sqlx::query_scalar("SELECT count(*) FROM workpump._sqlx_migrations WHERE success")
            .fetch_one(&pool)
            .await
            .expect("count");
    let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../sql/migrations"))
        .expect("sql/migrations")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "sql"))
        })
        .count();
    assert_eq!(applied as usize, files);
    // The pool's own connections never saw the migration's search_path.
    let path: String = sqlx::query_scalar("SHOW search_path")
        .fetch_one(&pool)
        .await
        .expect("search_path");
    assert!(!path.contains("workpump"), "{path}");
}

/// A rolling upgrade: the new release migrated the store, and an instance of the previous
/// release (re)starts beside it, running its own `migrate` (`migrate = true`). It must find
/// nothing to do, not refuse the migration it does not know.
#[tokio::test]
async fn an_older_build_migrates_nothing_against_a_schema_a_newer_build_migrated() {
    let (_db, pool) = fresh().await;
    migrate(&pool, DEFAULT_SCHEMA).await.expect("migrate");
    // What the next release's migration leaves in sqlx's history (its checksum is the
    // newer build's business: this build cannot check a migration it does not ship).
    sqlx::query(
        "INSERT INTO workpump._sqlx_migrations \
             (version, description, success, checksum, execution_time) \
         VALUES (99999, 'from a newer release', true, '\\x00', 1)",
    )
    .execute(&pool)
    .await
    .expect("a newer release's migration");

    migrate(&pool, DEFAULT_SCHEMA)
        .await
        .expect("an older build beside a newer schema migrates nothing");
    let status = migration_status(&pool, DEFAULT_SCHEMA)
        .await
        .expect("status");
    let newer = status.iter().find(|m| m.version == 99999).expect("listed");
    assert_eq!(newer.state, MigrationState::Unknown);
    assert!(
        status
            .iter()
            .filter(|m| m.version != 99999)
            .all(|m| m.state == MigrationState::Applied),
        "{status:?}"
    );
}

#[tokio::test]
async fn constraints_make_impossible_states_impossible() {
    let (_db, pool, c) = migrated().await;
    let me = registered_instance(&c).await;
    c.enqueue_work(EnqueueWorkParams {
        items: vec![NewWork::new("q", json!(1))],
    })
    .await
    .expect("enqueue");
    let item = claim_one(&c, me).await;
    let cases = [
        (
            "UPDATE workpump.work SET lease_expiry = NULL WHERE id = $1",
            "work_owner_has_expiry",
        ),
        (
            "UPDATE workpump.work SET attempt = -1 WHERE id = $1",
            "work_attempt_in_range",
        ),
        (
            "UPDATE workpump.work SET state = 'available' WHERE id = $1",
            "work_only_running_is_owned",
        ),
        (
            "UPDATE workpump.work SET claim_token = NULL WHERE id = $1",
            "work_running_has_claim",
        ),
        (
            "UPDATE workpump.work SET finished_at = now() WHERE id = $1",
            "work_finished_at_iff_finished",
        ),
        (
            "UPDATE workpump.work SET state = 'completed', finished_at = now(),
                    instance_id = NULL, lease_expiry = NULL
             WHERE id = $1",
            "work_completed_is_history",
        ),
    ];
    for (sql, constraint) in cases {
        let err = sqlx::query(sql)
            .bind(item.fence.id)
            .execute(&pool)
            .await
            .expect_err(sql);
        let db = err.as_database_error().expect("a database error");
        assert_eq!(db.constraint(), Some(constraint), "{sql}: {db}");
    }
    let err = sqlx::query("UPDATE workpump.work SET state = 'lost' WHERE id = $1")
        .bind(item.fence.id)
        .execute(&pool)
        .await
        .expect_err("unknown state");
    assert!(
        err.to_string().contains("invalid input value for enum"),
        "{err}"
    );
}

#[tokio::test]
async fn enqueue_in_a_caller_transaction_commits_or_rolls_back_with_it() {
    let (_db, pool, c) = migrated().await;
    let mut tx = pool.begin().await.expect("begin");
    c.enqueue_with(
        &mut tx,
        EnqueueWorkParams {
            items: vec![NewWork::new("q", json!("rolled back")); 3],
        },
    )
    .await
    .expect("enqueue");
    tx.rollback().await.expect("rollback");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM workpump.work_all")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(n, 0, "a rolled-back enqueue leaves nothing");

    let mut tx = pool.begin().await.expect("begin");
    let out = c
        .enqueue_with(
            &mut tx,
            EnqueueWorkParams {
                items: vec![NewWork::new("q", json!("kept")); 2],
            },
        )
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM workpump.work_all WHERE id = ANY($1)")
        .bind(out.items.iter().map(|e| e.id).collect::<Vec<_>>())
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(n, 2);
}

#[tokio::test]
async fn a_failed_enqueue_inside_a_transaction_writes_nothing_of_the_batch() {
    let (_db, pool, c) = migrated().await;
    let mut conn = pool.acquire().await.expect("conn");
    let err = c
        .enqueue_with(
            &mut conn,
            EnqueueWorkParams {
                items: vec![
                    NewWork::new("q", json!(1)),
                    NewWork::new("unknown", json!(2)),
                ],
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownQueue(q) if q == "unknown"),
        "{err}"
    );
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM workpump.work_all")
        .fetch_one(&mut *conn)
        .await
        .expect("count");
    assert_eq!(n, 0);
}

/// The SQL function, called directly (other languages do; the Rust API checks first): a
/// batch with a bad row is refused with its first problem named — the first unknown queue,
/// else the first invalid item — wherever in the batch the rows are, and nothing is written.
#[tokio::test]
async fn the_sql_function_names_a_refused_batchs_first_problem_and_writes_nothing() {
    let (_db, pool, _c) = migrated().await;
    // Five items into `q`; `queues` and `max_attempts` replace some.
    let call = |queues: Vec<&'static str>, max_attempts: Vec<Option<i32>>| {
        let pool = pool.clone();
        async move {
            let n = queues.len();
            sqlx::query(
                "SELECT * FROM workpump.enqueue_work($1, array_fill('{}'::jsonb, ARRAY[$2]),
                     array_fill(NULL::smallint, ARRAY[$2]), array_fill(NULL::interval, ARRAY[$2]),
                     array_fill(NULL::timestamptz, ARRAY[$2]), array_fill(NULL::text, ARRAY[$2]),
                     $3, array_fill(NULL::text, ARRAY[$2]), array_fill(NULL::jsonb, ARRAY[$2]),
                     array_fill(NULL::text, ARRAY[$2]))",
            )
            .bind(queues)
            .bind(n as i32)
            .bind(max_attempts)
            .fetch_all(&pool)
            .await
        }
    };
    let code_and_message = |r: Result<Vec<sqlx::postgres::PgRow>, sqlx::Error>| {
        let e = r.expect_err("refused");
        let db = e.as_database_error().expect("a database error");
        (
            db.code().expect("a code").into_owned(),
            db.message().to_owned(),
        )
    };
    // An invalid item (the 2nd) before an unknown queue (the 4th): the unknown queue is named.
    let (code, message) = code_and_message(
        call(
            vec!["q", "q", "q", "nope", "q"],
            vec![None, Some(0), None, None, None],
        )
        .await,
    );
    assert_eq!(code, "WP001");
    assert_eq!(
        message,
        "enqueue_work: unknown queue 'nope' (register it first)"
    );
    // Invalid items only: the first is named, with every rule.
    let (code, message) = code_and_message(
        call(
            vec!["q", "q", "q", "q", "q"],
            vec![None, None, Some(1001), Some(0), None],
        )
        .await,
    );
    assert_eq!(code, "WP002");
    assert!(
        message.starts_with("enqueue_work: item 3 is invalid (payload must not be null;")
            && message.contains("max_attempts must be 1..1000"),
        "{message}"
    );
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM workpump.work_all")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(n, 0, "a refused batch writes nothing");
    // A good batch: one row per item, in order, ids increasing with the items.
    let rows = call(vec!["q"; 5], vec![None; 5]).await.expect("enqueued");
    let answers: Vec<(i32, i64, bool)> = rows
        .iter()
        .map(|r| {
            use sqlx::Row;
            (r.get("ord"), r.get("id"), r.get("inserted"))
        })
        .collect();
    assert_eq!(
        answers.iter().map(|a| a.0).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    assert!(answers.windows(2).all(|w| w[0].1 < w[1].1), "{answers:?}");
    assert!(answers.iter().all(|a| a.2));
}

/// A listener on `c`'s wake channel, connected.
async fn connected_listener(c: &PgCoordinator) -> Box<dyn WakeListener> {
    let mut listener = c.listen(ListenParams::default()).await.expect("listen");
    assert_eq!(
        listener.next_event().await.expect("event"),
        ListenEvent::Connected
    );
    listener
}

/// The queues woken, in order, until queue `sentinel` is (the tests wake it last: its signal
/// marks the end of those before it).
async fn wakes_before_the_sentinel(listener: &mut Box<dyn WakeListener>) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), listener.next_event())
            .await
            .expect("a signal within the deadline")
            .expect("event");
        match event {
            ListenEvent::Wake { queue } if queue == "sentinel" => return seen,
            ListenEvent::Wake { queue } => seen.push(queue),
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// `PgCoordinator::enqueue_work` commits without notifying and wakes right after the commit,
/// before it returns: the queues with items due now or at a business time, not a queue whose
/// items are only delayed. The function called with `notify => false` sends nothing.
#[tokio::test]
async fn enqueue_work_wakes_after_its_commit_and_the_function_without_notify_sends_nothing() {
    let (_db, pool, c) = migrated().await;
    for q in ["delayed", "at", "sentinel"] {
        c.register_queue(RegisterQueueParams::new(q))
            .await
            .expect("queue");
    }
    let mut listener = connected_listener(&c).await;
    // Without notify: nothing, though the item is due.
    let rows = sqlx::query(
        "SELECT * FROM workpump.enqueue_work(ARRAY['sentinel'], ARRAY['{}'::jsonb],
             ARRAY[NULL::smallint], ARRAY[NULL::interval], ARRAY[NULL::timestamptz],
             ARRAY[NULL::text], ARRAY[NULL::integer], ARRAY[NULL::text], ARRAY[NULL::jsonb],
             ARRAY[NULL::text], false)",
    )
    .fetch_all(&pool)
    .await
    .expect("enqueued");
    assert_eq!(rows.len(), 1);
    c.enqueue_work(EnqueueWorkParams {
        items: vec![
            NewWork::new("delayed", json!(1)).run_after(Duration::from_secs(600)),
            NewWork::new("q", json!(2)),
            NewWork::new("at", json!(3)).run_at(chrono::Utc::now() - chrono::Duration::hours(1)),
            NewWork::new("q", json!(4)),
        ],
    })
    .await
    .expect("enqueue");
    // A later transaction's signal marks the end of the ones before.
    c.enqueue_with(
        &mut pool.acquire().await.expect("conn"),
        EnqueueWorkParams {
            items: vec![NewWork::new("sentinel", json!(5))],
        },
    )
    .await
    .expect("enqueue");
    let mut seen = wakes_before_the_sentinel(&mut listener).await;
    seen.sort();
    assert_eq!(seen, vec!["at".to_owned(), "q".to_owned()]);
}

/// Producers of one coordinator share their wakes (a producer that commits while another's
/// wake is in flight waits for the next one, which carries every queue asked for meanwhile):
/// with 16 producers enqueueing at once, each to a queue of its own, fewer wake statements
/// run than enqueues (one each without the sharing), every queue is still woken, and every
/// producer's wake has been sent when its `enqueue_work` returns.
#[tokio::test]
async fn producers_enqueueing_at_once_share_wakes_and_every_queue_is_woken() {
    let (_db, pool, c) = migrated().await;
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&pool)
        .await
        .expect("pg_stat_statements");
    // The wake statements run in this database so far (`pg_stat_statements`, top level).
    let wake_statements = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND toplevel AND query LIKE '%pg_notify(%unnest(%'",
        )
        .fetch_one(&pool)
        .await
        .expect("the wake statements");
        n
    };
    let names: Vec<String> = (0..16).map(|i| format!("p{i}")).collect();
    for q in names.iter().chain([&"sentinel".to_owned()]) {
        c.register_queue(RegisterQueueParams::new(q))
            .await
            .expect("queue");
    }
    let mut listener = connected_listener(&c).await;
    const EACH: i64 = 5;
    let before = wake_statements().await;
    let producers = names.iter().map(|q| {
        let c = c.clone();
        let q = q.clone();
        async move {
            for i in 0..EACH {
                c.enqueue_work(EnqueueWorkParams {
                    items: vec![NewWork::new(&q, json!(i))],
                })
                .await
                .expect("enqueue");
            }
        }
    });
    futures::future::join_all(producers).await;
    let sent = wake_statements().await - before;
    let enqueues = EACH * names.len() as i64;
    assert!(
        (1..enqueues).contains(&sent),
        "{sent} wake statements for {enqueues} enqueues: none shared"
    );
    // Every wake was sent before its producer returned: a later one marks the end of them.
    c.enqueue_work(EnqueueWorkParams {
        items: vec![NewWork::new("sentinel", json!(0))],
    })
    .await
    .expect("enqueue");
    let seen: std::collections::BTreeSet<String> = wakes_before_the_sentinel(&mut listener)
        .await
        .into_iter()
        .collect();
    assert_eq!(seen, names.iter().cloned().collect());
}

/// NOTIFY goes out on commit, once per queue per transaction, and reaches a listener.
#[tokio::test]
async fn enqueue_wakes_listeners_once_per_queue_per_transaction_on_commit() {
    let (_db, pool, c) = migrated().await;
    c.register_queue(RegisterQueueParams::new("other"))
        .await
        .expect("queue");
    c.register_queue(RegisterQueueParams::new("sentinel"))
        .await
        .expect("queue");
    let mut listener = connected_listener(&c).await;
    let mut tx = pool.begin().await.expect("begin");
    for _ in 0..3 {
        c.enqueue_with(
            &mut tx,
            EnqueueWorkParams {
                items: vec![NewWork::new("q", json!(1)), NewWork::new("other", json!(2))],
            },
        )
        .await
        .expect("enqueue");
    }
    // A delayed item wakes nobody.
    c.enqueue_with(
        &mut tx,
        EnqueueWorkParams {
            items: vec![NewWork::new("sentinel", json!(0)).run_after(Duration::from_secs(600))],
        },
    )
    .await
    .expect("enqueue");
    tx.commit().await.expect("commit");
    // A later transaction's signal marks the end of the first one's.
    c.enqueue_work(EnqueueWorkParams {
        items: vec![NewWork::new("sentinel", json!(1))],
    })
    .await
    .expect("enqueue");
    let mut seen: HashMap<String, usize> = HashMap::new();
    for queue in wakes_before_the_sentinel(&mut listener).await {
        *seen.entry(queue).or_default() += 1;
    }
    assert_eq!(
        seen,
        HashMap::from([("q".to_owned(), 1), ("other".to_owned(), 1)])
    );
}

#[tokio::test]
async fn a_terminated_listener_reports_disconnected_then_reconnects_and_hears_again() {
    let (_db, pool, c) = migrated().await;
    let mut listener = c.listen(ListenParams::default()).await.expect("listen");
    assert_eq!(
        listener.next_event().await.expect("event"),
        ListenEvent::Connected
    );
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND query LIKE 'LISTEN%'",
    )
    .fetch_all(&pool)
    .await
    .expect("terminate");
    assert_eq!(killed, vec![true]);
    let event = tokio::time::timeout(Duration::from_secs(10), listener.next_event())
        .await
        .expect("in time")
        .expect("event");
    assert_eq!(event, ListenEvent::Disconnected);
    let event = tokio::time::timeout(Duration::from_secs(10), listener.next_event())
        .await
        .expect("in time")
        .expect("reconnect");
    assert_eq!(event, ListenEvent::Connected);
    c.enqueue_work(EnqueueWorkParams {
        items: vec![NewWork::new("q", json!(1))],
    })
    .await
    .expect("enqueue");
    let event = tokio::time::timeout(Duration::from_secs(10), listener.next_event())
        .await
        .expect("in time")
        .expect("event");
    assert_eq!(event, ListenEvent::Wake { queue: "q".into() });
}

/// Transactional completion: business write and completion commit together.
#[tokio::test]
async fn a_fenced_transaction_commits_the_business_write_with_the_completion() {
    let (_db, pool, c) = migrated().await;
    sqlx::query("CREATE TABLE effects (item bigint PRIMARY KEY)")
        .execute(&pool)
        .await
        .expect("table");
    let me = registered_instance(&c).await;
    c.enqueue_work(EnqueueWorkParams {
        items: vec![NewWork::new("q", json!(1))],
    })
    .await
    .expect("enqueue");
    let item = claim_one(&c, me).await;
    let mut tx = c.begin_fenced(me, item.fence).await.expect("fenced tx");
    sqlx::query("INSERT INTO effects VALUES ($1)")
        .bind(item.fence.id)
        .execute(tx.connection())
        .await
        .expect("business write");
    // While the transaction holds the row, a renewal is busy, not lost.
    let renewal = c
        .renew_leases(RenewLeasesParams {
            instance: me,
            leases: vec![item.fence],
            lease: Duration::from_secs(60),
        })
        .await
        .expect("renew");
    assert_eq!(renewal.items[0].status, RenewalStatus::Busy);
    tx.complete().await.expect("complete");
    let state: String =
        sqlx::query_scalar("SELECT state::text FROM workpump.work_all WHERE id = $1")
            .bind(item.fence.id)
            .fetch_one(&pool)
            .await
            .expect("state");
    assert_eq!(state, "completed");
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(&pool)
        .await
        .expect("effects");
    assert_eq!(effects, 1);
}

/// A completion moves the item out of `work` into `work_history`, and the operator reads it
/// as before: every column it had while it ran (payload, kind, metadata, keys, checkpoint,
/// attempt, claim token, renewals, timings) survives the move, with the lease gone and
/// `finished_at` set; listing finds it, and a discard deletes it there.
#[tokio::test]
async fn a_completed_item_leaves_work_and_reads_as_it_ran() {
    let (_db, pool, c) = migrated().await;
    let me = registered_instance(&c).await;
    let ids = c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("q", json!({"to": "a@example.com"}))
                .kind("send_email")
                .metadata(json!({"traceparent": "00-1-2-01"}))
                .ordering_key("customer-1")
                .unique_key("once")
                .priority(3)
                .max_attempts(4)],
        })
        .await
        .expect("enqueue")
        .items;
    let item = claim_one(&c, me).await;
    assert_eq!(item.fence.id, ids[0].id);
    c.checkpoint_work(CheckpointWorkParams {
        instance: me,
        fence: item.fence,
        checkpoint: json!({"page": 2}),
    })
    .await
    .expect("checkpoint");
    c.renew_leases(RenewLeasesParams {
        instance: me,
        leases: vec![item.fence],
        lease: Duration::from_secs(60),
    })
    .await
    .expect("renew");
    let running = c
        .get_work(GetWorkParams { id: item.fence.id })
        .await
        .expect("get running")
        .item;
    let done = c
        .complete_work(CompleteWorkParams {
            instance: me,
            items: vec![item.fence],
            hand_off: Vec::new(),
        })
        .await
        .expect("complete");
    assert_eq!(done.items[0].state, Some(WorkState::Completed));

    let in_work: i64 = sqlx::query_scalar("SELECT count(*) FROM workpump.work WHERE id = $1")
        .bind(item.fence.id)
        .fetch_one(&pool)
        .await
        .expect("count in work");
    assert_eq!(in_work, 0, "a completed item is not in work");
    let completed = c
        .get_work(GetWorkParams { id: item.fence.id })
        .await
        .expect("get completed")
        .item;
    assert_eq!(completed.state, WorkState::Completed);
    assert!(completed.finished_at.is_some());
    assert_eq!((completed.instance, completed.lease_expiry), (None, None));
    assert_eq!(
        WorkDetail {
            state: running.state,
            finished_at: None,
            instance: running.instance,
            lease_expiry: running.lease_expiry,
            ..completed.clone()
        },
        running,
        "everything but the state, the lease and finished_at is as it was while it ran"
    );
    assert_eq!(completed.checkpoint, Some(json!({"page": 2})));
    assert_eq!(completed.renewals, 1);
    assert_eq!(completed.claim_token, Some(item.fence.token));

    let listed = c
        .list_work(ListWorkParams {
            filter: WorkFilter::new().state(WorkState::Completed),
            cursor: None,
            page_size: None,
        })
        .await
        .expect("list");
    assert_eq!(
        listed.items.iter().map(|i| i.id).collect::<Vec<_>>(),
        vec![item.fence.id]
    );
    // Its unique key is free again: a new item may take it.
    let again = c
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("q", json!(2)).unique_key("once")],
        })
        .await
        .expect("enqueue again");
    assert!(again.items[0].inserted);
    c.discard_work(DiscardWorkParams { id: item.fence.id })
        .await
        .expect("discard");
    assert!(matches!(
        c.get_work(GetWorkParams { id: item.fence.id }).await,
        Err(Error::NotFound { .. })
    ));
}

#[tokio::test]
async fn a_fenced_transaction_on_a_lost_lease_is_refused_and_writes_nothing() {
    let (_db, pool, c) = migrated().await;
    let zombie = registered_instance(&c).await;
    let peer = registered_instance(&c).await;
    c.enqueue_work(EnqueueWorkParams {
        items: vec![NewWork::new("q", json!(1))],
    })
    .await
    .expect("enqueue");
    let old = claim_one(&c, zombie).await;
    sqlx::query("UPDATE workpump.work SET lease_expiry = now() - interval '1 s' WHERE id = $1")
        .bind(old.fence.id)
        .execute(&pool)
        .await
        .expect("expire");
    c.dead_letter_expired(DeadLetterExpiredParams { limit: 100 })
        .await
        .expect("the sweep releases the lapsed lease");
    let new = claim_one(&c, peer).await;
    assert_eq!(new.fence.id, old.fence.id);
    let err = c.begin_fenced(zombie, old.fence).await.unwrap_err();
    assert!(
        matches!(err, Error::FencedOut { id } if id == old.fence.id),
        "{err}"
    );
    // Rolling back keeps the claim: the holder can still finish.
    let tx = c.begin_fenced(peer, new.fence).await.expect("fenced tx");
    tx.rollback().await.expect("rollback");
    let done = c
        .complete_work(CompleteWorkParams {
            instance: peer,
            items: vec![new.fence],
            hand_off: Vec::new(),
        })
        .await
        .expect("complete");
    assert!(done.all_recorded().is_ok());
}

#[tokio::test]
async fn two_schemas_in_one_database_are_independent() {
    let (_db, pool) = fresh().await;
    migrate(&pool, "tenant_a").await.expect("migrate a");
    migrate(&pool, "tenant_b").await.expect("migrate b");
    let a = PgCoordinator::with_schema(pool.clone(), "tenant_a").expect("a");
    let b = PgCoordinator::with_schema(pool.clone(), "tenant_b").expect("b");
    a.register_queue(RegisterQueueParams::new("q"))
        .await
        .expect("queue");
    a.enqueue_work(EnqueueWorkParams {
        items: vec![NewWork::new("q", json!(1))],
    })
    .await
    .expect("enqueue a");
    let err = b
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("q", json!(1))],
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::UnknownQueue(_)), "{err}");
    assert_eq!(a.wake_channel(), "tenant_a.wake");
    // The same instance has different alive-lock keys per schema.
    let keys: Vec<i64> = sqlx::query_scalar(
        "SELECT tenant_a.alive_lock_key($1) UNION SELECT tenant_b.alive_lock_key($1)",
    )
    .bind(uuid::Uuid::nil())
    .fetch_all(&pool)
    .await
    .expect("keys");
    assert_eq!(keys.len(), 2);
    for bad in ["Tenant", "a; DROP SCHEMA public", "pg_x", ""] {
        assert!(
            matches!(
                PgCoordinator::with_schema(pool.clone(), bad),
                Err(Error::InvalidArgument(_))
            ),
            "{bad}"
        );
        assert!(matches!(
            migrate(&pool, bad).await,
            Err(Error::InvalidArgument(_))
        ));
    }
}

#[tokio::test]
async fn an_unreachable_database_gets_an_error_that_says_what_was_being_done() {
    // A port nothing listens on: bind one, learn it, let it go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(1))
        .connect_lazy(&format!("postgres://nobody@127.0.0.1:{port}/none"))
        .expect("lazy pool");
    let c = PgCoordinator::new(pool);
    let err = c
        .claim_work(ClaimWorkParams {
            instance: InstanceId::new(),
            queues: vec!["q".into()],
            max_items: 10,
            lease: Duration::from_secs(60),
            async_commit: false,
        })
        .await
        .unwrap_err();
    assert!(err.is_transient());
    assert!(
        err.to_string().starts_with("claiming up to 10 items"),
        "{err}"
    );
    let err = c
        .listen(ListenParams::default())
        .await
        .err()
        .expect("error");
    assert!(err.to_string().contains("listening"), "{err}");
    let Err(err) = c
        .take_alive_lock(TakeAliveLockParams {
            instance: InstanceId::new(),
        })
        .await
    else {
        panic!("locking on an unreachable server succeeded");
    };
    assert!(err.to_string().contains("alive-lock"), "{err}");
    assert!(
        sqlx::PgConnection::connect(&format!("postgres://nobody@127.0.0.1:{port}/none"))
            .await
            .is_err()
    );
}

/// The owner learns at once that its lock session is gone, without sending a query.
#[tokio::test]
async fn the_alive_lock_session_reports_its_loss_at_once() {
    let (_db, pool, c) = migrated().await;
    let me = registered_instance(&c).await;
    let mut lock = c
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("lock");
    assert!(lock.held);
    let pid = lock.session.session_id().expect("a backend pid");
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&pool)
        .await
        .expect("terminate");
    assert!(killed);
    tokio::time::timeout(Duration::from_secs(10), lock.session.lost())
        .await
        .expect("the loss is noticed");
    // Gone means gone: no silent reconnect that would not hold the lock.
    assert!(lock.session.retake().await.is_err());
    let alive = c
        .is_instance_alive(IsInstanceAliveParams { instance: me })
        .await
        .expect("alive?");
    assert!(!alive.alive);
}

/// Inserts `n` completed items of queue `q`, finished `spread` apart going back from now (the
/// newest first), as a store that ran for a while would hold them (in `work_history`, where
/// completed items live).
async fn completed_rows(pool: &PgPool, q: &str, n: i64, spread: &str) {
    sqlx::query(
        "INSERT INTO workpump.work_history (id, queue, priority, attempt, max_attempts, run_at,
                                            claim_token, renewals, cancel_requested, payload,
                                            errors, created_at, finished_at)
         SELECT nextval('workpump.work_id_seq'), $1, 0, 1, 10, now(),
                nextval('workpump.claim_token_seq'), 0, false, '{}', '[]',
                now() - g * $3::interval, now() - g * $3::interval
         FROM generate_series(1, $2) g",
    )
    .bind(q)
    .bind(n)
    .bind(spread)
    .execute(pool)
    .await
    .expect("insert completed rows");
}

#[tokio::test]
async fn list_work_reads_by_primary_key_and_stops_after_its_scan_budget() {
    let (_db, pool, c) = migrated().await;
    let me = registered_instance(&c).await;
    // The oldest item is a dead letter with a rare error; 60 000 completed items are newer
    // (so many that reading 10 000 of them by index is the planner's choice, as on any store
    // where the budget matters).
    c.enqueue_work(EnqueueWorkParams {
        items: vec![NewWork::new("q", json!({}))],
    })
    .await
    .expect("enqueue");
    let dead = claim_one(&c, me).await.fence;
    c.fail_work(FailWorkParams {
        instance: me,
        items: vec![Failure {
            fence: dead,
            error: "a rare needle".into(),
            disposition: FailDisposition::DeadLetter,
        }],
    })
    .await
    .expect("fail");
    completed_rows(&pool, "q", 60_000, "1 millisecond").await;
    sqlx::query("ANALYZE workpump.work, workpump.work_history")
        .execute(&pool)
        .await
        .expect("analyze");

    // In one transaction, before and after: pg_stat_xact_user_tables counts this backend's
    // reads not yet reported (earlier transactions' too), so the difference is this call's.
    // The items are in `work` and (the completed ones) `work_history`'s partitions: all count.
    let mut tx = pool.begin().await.expect("begin");
    let stats = "SELECT sum(seq_scan)::int8, sum(coalesce(idx_tup_fetch, 0))::int8
                 FROM pg_stat_xact_user_tables
                 WHERE schemaname = 'workpump'
                   AND (relname = 'work' OR relname LIKE 'work\\_history%')";
    let (seq_before, fetched_before): (i64, i64) = sqlx::query_as(stats)
        .fetch_one(&mut *tx)
        .await
        .expect("stats");
    let rows: Vec<(Option<i64>, Option<String>, Option<bool>)> = sqlx::query_as(
        "SELECT id, next_cursor, scan_exhausted FROM workpump.list_work($1, NULL, 50)",
    )
    .bind(json!({"error_contains": "NEEDLE"}))
    .fetch_all(&mut *tx)
    .await
    .expect("list");
    let (seq_after, fetched_after): (i64, i64) = sqlx::query_as(stats)
        .fetch_one(&mut *tx)
        .await
        .expect("stats");
    tx.commit().await.expect("commit");
    let (seq_scans, fetched) = (seq_after - seq_before, fetched_after - fetched_before);
    assert_eq!(seq_scans, 0, "no sequential scan of work or work_history");
    assert!(
        (10_000..=10_100).contains(&fetched),
        "about the budget of rows read by index, got {fetched}"
    );
    assert_eq!(
        rows.len(),
        1,
        "only the end row: no match among the newest 10 000"
    );
    let (id, cursor, exhausted) = rows[0].clone();
    assert_eq!((id, exhausted), (None, Some(true)));
    let cursor = cursor.expect("a cursor to scan further");

    let filter = WorkFilter::new().error_contains("needle");
    let mut cursor = Some(cursor);
    let mut calls = 1;
    let out = loop {
        let out = c
            .list_work(ListWorkParams {
                filter: filter.clone(),
                cursor: cursor.take(),
                page_size: None,
            })
            .await
            .expect("the next page");
        calls += 1;
        if !out.items.is_empty() || out.next_cursor.is_none() {
            break out;
        }
        assert!(out.scan_exhausted);
        cursor = out.next_cursor;
    };
    assert_eq!(calls, 7, "60 001 rows, 10 000 a call");
    assert_eq!(out.items.len(), 1);
    assert_eq!(out.items[0].id, dead.id);
    assert_eq!(out.items[0].last_error.as_deref(), Some("a rare needle"));
    assert_eq!((out.next_cursor, out.scan_exhausted), (None, false));
}

#[tokio::test]
async fn queue_overview_bounds_finished_counts_past_its_sample_and_says_which_rates_are_estimates()
{
    let (_db, pool, c) = migrated().await;
    // 10 500 completions in the last 17.5 minutes: the newest 10 000 span 16.7 minutes.
    completed_rows(&pool, "q", 10_500, "100 milliseconds").await;
    let out = c
        .queue_overview(QueueOverviewParams {})
        .await
        .expect("overview");
    let q = out.get("q").expect("q");
    assert_eq!(
        q.completed,
        Count {
            items: 10_000,
            exact: false
        },
        "a lower bound"
    );
    assert!(!q.completed_per_minute.exact);
    let rate = q.completed_per_minute.per_minute;
    assert!(
        (580.0..=620.0).contains(&rate),
        "about 600 a minute: {rate}"
    );
    assert_eq!(
        q.dead,
        Count {
            items: 0,
            exact: true
        }
    );

    // Spread over two hours, the newest 10 000 reach back past the hour: the rate is exact.
    sqlx::raw_sql("DELETE FROM workpump.work; DELETE FROM workpump.work_history")
        .execute(&pool)
        .await
        .expect("clear");
    completed_rows(&pool, "q", 10_500, "700 milliseconds").await;
    let q = c
        .queue_overview(QueueOverviewParams {})
        .await
        .expect("overview")
        .get("q")
        .cloned()
        .expect("q");
    assert!(!q.completed.exact);
    assert!(q.completed_per_minute.exact);
    let in_hour: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM workpump.work_all WHERE finished_at > now() - interval '1 hour'",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    let expected = in_hour as f64 / 60.0;
    assert!(
        (q.completed_per_minute.per_minute - expected).abs() < 0.5,
        "{} vs {expected}",
        q.completed_per_minute.per_minute
    );
}

/// The overview's sample of dead letters (and cancelled items) is read from `work_finished`
/// alone, its `INCLUDE (queue)` included: no heap visit per dead letter sampled, which on a
/// store whose dead letters are spread one to a page was a page read each (34 of a 69 ms
/// overview in the bench's store of 1 000 000 items).
#[tokio::test]
async fn queue_overview_samples_dead_letters_from_their_index_alone() {
    const DEAD: i64 = 30_000;
    let (_db, pool, _) = migrated().await;
    // Committed durably (the test cluster commits asynchronously otherwise): VACUUM marks a
    // page all-visible only once its rows' commit has reached the disk.
    sqlx::raw_sql(&format!(
        "SET LOCAL synchronous_commit = on;
         INSERT INTO workpump.work (queue, payload, max_attempts, state, run_at)
         SELECT 'q', '{{}}', 10, 'available', now() FROM generate_series(1, {DEAD});
         UPDATE workpump.work SET state = 'dead', attempt = 1,
                finished_at = now() - id * interval '1 millisecond',
                errors = jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(),
                    'instance', NULL, 'kind', 'rejected', 'error', 'invalid address'))"
    ))
    .execute(&pool)
    .await
    .expect("dead letters");
    // All-visible pages, as a store's settled dead letters are.
    sqlx::raw_sql("VACUUM (ANALYZE) workpump.work")
        .execute(&pool)
        .await
        .expect("vacuum");
    let mut tx = pool.begin().await.expect("begin");
    // Rows of work read from its heap by this transaction, by any path.
    let read = "SELECT coalesce(sum(idx_tup_fetch + seq_tup_read), 0)::int8
                FROM pg_stat_xact_user_tables
                WHERE schemaname = 'workpump' AND relname = 'work'";
    let before: i64 = sqlx::query_scalar(read)
        .fetch_one(&mut *tx)
        .await
        .expect("read");
    let (dead, exact): (i64, bool) =
        sqlx::query_as("SELECT dead, dead_exact FROM workpump.queue_overview() WHERE queue = 'q'")
            .fetch_one(&mut *tx)
            .await
            .expect("overview");
    let after: i64 = sqlx::query_scalar(read)
        .fetch_one(&mut *tx)
        .await
        .expect("read");
    tx.commit().await.expect("commit");
    assert_eq!((dead, exact), (10_000, false), "the sample's lower bound");
    assert!(
        after - before < 100,
        "the overview read {} rows of work's heap to sample 10 000 of {DEAD} dead letters",
        after - before
    );
}

#[tokio::test]
async fn fail_work_counts_failures_per_minute_and_forgets_buckets_past_two_hours() {
    let (_db, pool, c) = migrated().await;
    let me = registered_instance(&c).await;
    sqlx::query(
        "INSERT INTO workpump.queue_failures (queue, minute, failed)
         VALUES ('q', date_trunc('minute', now() - interval '3 hours'), 7),
                ('other', date_trunc('minute', now() - interval '3 hours'), 5)",
    )
    .execute(&pool)
    .await
    .expect("old buckets");
    c.enqueue_work(EnqueueWorkParams {
        items: vec![NewWork::new("q", json!(1)), NewWork::new("q", json!(2))],
    })
    .await
    .expect("enqueue");
    let retried = claim_one(&c, me).await.fence;
    let cancelled = claim_one(&c, me).await.fence;
    let items = vec![
        Failure {
            fence: retried,
            error: "x".into(),
            disposition: FailDisposition::RetryAfter(Duration::from_secs(60)),
        },
        Failure {
            fence: cancelled,
            error: "x".into(),
            disposition: FailDisposition::Cancelled,
        },
    ];
    c.fail_work(FailWorkParams {
        instance: me,
        items,
    })
    .await
    .expect("fail");
    let buckets: Vec<(String, i64, bool)> = sqlx::query_as(
        "SELECT queue, failed, minute = date_trunc('minute', now())
         FROM workpump.queue_failures ORDER BY queue",
    )
    .fetch_all(&pool)
    .await
    .expect("buckets");
    assert_eq!(
        buckets,
        vec![("other".into(), 5, false), ("q".into(), 1, true)],
        "the cancelled attempt is not a failure; q's old bucket is gone, another queue's kept"
    );
    let q = c
        .queue_overview(QueueOverviewParams {})
        .await
        .expect("overview")
        .get("q")
        .cloned()
        .expect("q");
    assert_eq!(q.failed_per_minute, 1.0 / 60.0);
}

#[tokio::test]
async fn list_instances_sees_the_alive_locks_of_its_own_database_only() {
    let (_db, pool, c) = migrated().await;
    let me = registered_instance(&c).await;
    let key: i64 = sqlx::query_scalar("SELECT workpump.alive_lock_key($1)")
        .bind(me.0)
        .fetch_one(&pool)
        .await
        .expect("key");
    // Another database on the same server takes an advisory lock with the same key.
    let (_other_db, other) = fresh().await;
    let mut elsewhere = other.acquire().await.expect("connection");
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(key)
        .execute(&mut *elsewhere)
        .await
        .expect("lock elsewhere");
    let alive = |out: ListInstancesOutcome| {
        out.instances
            .iter()
            .find(|i| i.instance == me)
            .expect("listed")
            .alive_lock_held
    };
    let out = c
        .list_instances(ListInstancesParams {})
        .await
        .expect("instances");
    assert!(
        !alive(out),
        "a lock in another database is not this instance's"
    );
    let lock = c
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("take");
    assert!(lock.held);
    let out = c
        .list_instances(ListInstancesParams {})
        .await
        .expect("instances");
    assert!(alive(out));
    drop(elsewhere);
}

/// The repair finds exactly the keys left without a head — one whose head was deleted behind
/// the store's back, one whose dead head sits in a queue that skips dead heads — and not a key
/// held by its dead head in a 'hold' queue, nor a healthy one; at most `limit` keys a call.
#[tokio::test]
async fn the_repair_finds_exactly_the_headless_keys_at_most_limit_a_call() {
    let (_db, pool, c) = migrated().await;
    c.register_queue(RegisterQueueParams::new("skip"))
        .await
        .expect("register");
    sqlx::query("UPDATE workpump.queues SET ordering_dead_head = 'skip' WHERE name = 'skip'")
        .execute(&pool)
        .await
        .expect("skip dead heads");
    let keyed = |q: &str, k: &str| NewWork::new(q, json!(k)).ordering_key(k);
    let keys = [
        ("q", "gone"),
        ("q", "held"),
        ("skip", "skipped"),
        ("skip", "healthy"),
    ];
    let items = keys
        .iter()
        .flat_map(|(q, k)| [keyed(q, k), keyed(q, k)])
        .collect();
    c.enqueue_work(EnqueueWorkParams { items })
        .await
        .expect("enqueue");
    let head = "(SELECT min(id) FROM workpump.work_all WHERE ordering_key = $1)";
    let behind_the_back = [
        format!("DELETE FROM workpump.work WHERE id = {head}"),
        format!("UPDATE workpump.work SET state = 'dead', finished_at = now() WHERE id = {head}"),
    ];
    for (sql, key) in [
        (&behind_the_back[0], "gone"),
        (&behind_the_back[1], "held"),
        (&behind_the_back[1], "skipped"),
    ] {
        let done = sqlx::query(sql)
            .bind(key)
            .execute(&pool)
            .await
            .expect("write behind the store's back");
        assert_eq!(done.rows_affected(), 1, "{key}");
    }
    let repair = |limit| {
        let c = &c;
        async move {
            c.ordering_repair(OrderingRepairParams {
                limit,
                every: Duration::ZERO,
            })
            .await
            .expect("repair")
            .repaired
        }
    };
    assert_eq!(repair(1).await, 1, "at most `limit` keys a call");
    assert_eq!(repair(100).await, 1, "the other headless key");
    assert_eq!(repair(100).await, 0, "nothing left");
    for (key, expected) in [
        ("gone", vec!["available"]),
        ("held", vec!["dead", "blocked"]),
        ("skipped", vec!["dead", "available"]),
        ("healthy", vec!["available", "blocked"]),
    ] {
        let states: Vec<String> = sqlx::query_scalar(
            "SELECT state::text FROM workpump.work_all WHERE ordering_key = $1 ORDER BY ordering_seq",
        )
        .bind(key)
        .fetch_all(&pool)
        .await
        .expect("states");
        assert_eq!(states, expected, "{key}");
    }
}

/// Claims of one queue with a max_running take different slots and never wait for each other
/// (each locks the free slots it takes, SKIP LOCKED; docs/flow-control.md): a claim made while
/// another one's transaction is still open returns at once, and together they never exceed
/// the limit — every running item in a slot of its own, none above it.
#[tokio::test]
async fn claims_of_a_limited_queue_do_not_wait_for_each_other_and_hold_distinct_slots() {
    let (_db, pool, c) = migrated().await;
    c.set_queue_settings(SetQueueSettingsParams {
        max_running: Some(Some(5)),
        ..SetQueueSettingsParams::new("q")
    })
    .await
    .expect("limit");
    let me = registered_instance(&c).await;
    c.enqueue_work(EnqueueWorkParams {
        items: (0..10).map(|i| NewWork::new("q", json!(i))).collect(),
    })
    .await
    .expect("enqueue");
    let claim_sql = "SELECT id FROM workpump.claim_work($1, '{q}', $2, interval '60 seconds')
                     WHERE id IS NOT NULL";

    // The first claim of 2, left uncommitted: it holds slots 1 and 2, and 3 (one more than it
    // can take, to tell a limit from max_items).
    let mut first = pool.begin().await.expect("begin");
    let a: Vec<i64> = sqlx::query_scalar(claim_sql)
        .bind(me.0)
        .bind(2)
        .fetch_all(&mut *first)
        .await
        .expect("first claim");
    assert_eq!(a.len(), 2);

    // A second claim meanwhile: with a lock wait it would hit lock_timeout (the queue row's
    // lock serialized these claims before slots).
    let mut conn = pool.acquire().await.expect("connection");
    sqlx::query("SET lock_timeout = '10s'")
        .execute(&mut *conn)
        .await
        .expect("lock_timeout");
    let b: Vec<i64> = sqlx::query_scalar(claim_sql)
        .bind(me.0)
        .bind(10)
        .fetch_all(&mut *conn)
        .await
        .expect("a second claim while the first is open does not wait");
    assert_eq!(b.len(), 2, "slots 4 and 5: the first claim holds 1 to 3");
    sqlx::query("RESET lock_timeout")
        .execute(&mut *conn)
        .await
        .expect("reset");
    drop(conn);
    first.commit().await.expect("commit the first claim");

    let c3: Vec<i64> = sqlx::query_scalar(claim_sql)
        .bind(me.0)
        .bind(10)
        .fetch_all(&pool)
        .await
        .expect("third claim");
    assert_eq!(c3.len(), 1, "slot 3, freed by the first claim's commit");
    let slots: Vec<i32> = sqlx::query_scalar(
        "SELECT slot FROM workpump.work_all WHERE state = 'running' ORDER BY slot",
    )
    .fetch_all(&pool)
    .await
    .expect("slots");
    assert_eq!(slots, vec![1, 2, 3, 4, 5]);
    let none: Vec<i64> = sqlx::query_scalar(claim_sql)
        .bind(me.0)
        .bind(10)
        .fetch_all(&pool)
        .await
        .expect("fourth claim");
    assert!(none.is_empty(), "five run: the limit");
}

/// What docs/guarantees.md ("Asynchronous claims") says of a claim that a crash loses: its
/// row comes back as it was before the claim while the handler it started keeps running,
/// another claim takes the item, and still one outcome is recorded. The crash is simulated by
/// writing the row back to its pre-claim version (what recovery leaves when the claim's
/// commit record never reached the disk). Two ways on: a peer claims the item (the first
/// handler's token matches nothing), or the same instance claims it and the sequence, whose
/// unflushed WAL was lost too, hands it the same token (the first handler's outcome then
/// lands for the new claim, whose own handler is fenced out).
#[tokio::test]
async fn a_claim_lost_in_a_crash_still_gets_one_outcome() {
    let (_db, pool, c) = migrated().await;
    let a = registered_instance(&c).await;
    let b = registered_instance(&c).await;
    for peer_claims in [true, false] {
        let id = c
            .enqueue_work(EnqueueWorkParams {
                items: vec![NewWork::new("q", json!({ "peer": peer_claims }))],
            })
            .await
            .expect("enqueue")
            .items[0]
            .id;
        let lost = claim_one_committing(&c, a, true).await;
        assert_eq!(lost.fence.id, id);
        // Recovery without the claim's commit: the pre-claim version of the row.
        sqlx::query(
            "UPDATE workpump.work SET state = 'available', instance_id = NULL,
                 lease_expiry = NULL, claim_token = NULL, attempt = attempt - 1, renewals = 0
             WHERE id = $1",
        )
        .bind(id)
        .execute(&pool)
        .await
        .expect("write the row back");
        let again = claim_one(&c, if peer_claims { b } else { a }).await;
        assert_eq!(again.fence.id, id);
        let second = if peer_claims {
            again.fence
        } else {
            // The sequence handed out the lost claim's token again.
            sqlx::query("UPDATE workpump.work SET claim_token = $2 WHERE id = $1")
                .bind(id)
                .bind(lost.fence.token)
                .execute(&pool)
                .await
                .expect("the same token");
            lost.fence
        };
        let complete = |instance, fence| {
            c.complete_work(CompleteWorkParams {
                instance,
                items: vec![fence],
                hand_off: Vec::new(),
            })
        };
        // The first handler finishes first, then the second.
        let first = complete(a, lost.fence).await.expect("first outcome");
        let later = complete(if peer_claims { b } else { a }, second)
            .await
            .expect("second outcome");
        let landed: Vec<bool> = [&first, &later]
            .iter()
            .map(|o| !o.items[0].fenced_out())
            .collect();
        assert_eq!(
            landed,
            if peer_claims {
                [false, true]
            } else {
                [true, false]
            },
            "peer claims: {peer_claims}"
        );
        let history: i64 =
            sqlx::query_scalar("SELECT count(*) FROM workpump.work_history WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .expect("history");
        assert_eq!(history, 1, "one completion, peer claims: {peer_claims}");
    }
}
