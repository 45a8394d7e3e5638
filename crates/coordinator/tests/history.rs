//! The completed items' history by partition (docs/store.md, "Retention of completed items"):
//! `prune_finished` rotates `work_history`'s partitions (the SQL function `rotate_history`),
//! completions land in them, and a partition past the retention goes whole.

use std::time::Duration;

use serde_json::json;
use sqlx::postgres::PgPool;
use sqlx::Connection;
use workpump_coordinator::testing::{fresh_store_with_queue, registered_instance};
use workpump_coordinator::*;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// Enqueues, claims and completes `n` items of "q"; their ids.
async fn complete_n(c: &PgCoordinator, me: InstanceId, n: usize) -> Vec<i64> {
    c.enqueue_work(EnqueueWorkParams {
        items: (0..n)
            .map(|i| NewWork::new("q", json!({ "n": i })))
            .collect(),
    })
    .await
    .expect("enqueue");
    let claimed = c
        .claim_work(ClaimWorkParams {
            instance: me,
            queues: vec!["q".into()],
            max_items: n as u32,
            lease: Duration::from_secs(60),
            async_commit: false,
        })
        .await
        .expect("claim");
    assert_eq!(claimed.items.len(), n);
    let done = c
        .complete_work(CompleteWorkParams {
            instance: me,
            items: claimed.items.iter().map(|i| i.fence).collect(),
            hand_off: Vec::new(),
        })
        .await
        .expect("complete");
    assert!(done
        .items
        .iter()
        .all(|i| i.state == Some(WorkState::Completed)));
    claimed.items.iter().map(|i| i.fence.id).collect()
}

/// The default retentions' prune (24 h, 7 days), at most 100 items.
async fn prune(c: &PgCoordinator) -> PruneFinishedOutcome {
    c.prune_finished(PruneFinishedParams {
        completed_retention: DAY,
        dead_retention: 7 * DAY,
        limit: 100,
    })
    .await
    .expect("prune")
}

/// The partition (table name) each of these completed items is in.
async fn partitions_of(pool: &PgPool, ids: &[i64]) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT DISTINCT h.tableoid::regclass::text FROM workpump.work_history h
         WHERE h.id = ANY ($1) ORDER BY 1",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
    .expect("partitions of the items")
}

/// The partitions rotate_history keeps, as (name, whether its window has begun), oldest first.
async fn listed(pool: &PgPool) -> Vec<(String, bool)> {
    sqlx::query_as(
        "SELECT 'workpump.' || name, from_at <= now()
         FROM workpump.history_partitions ORDER BY from_at",
    )
    .fetch_all(pool)
    .await
    .expect("history_partitions")
}

/// Attaches a partition for the window `[now() - from_ago, now() - to_ago)` by hand (as the
/// owner, the way rotate_history would have attached it then) and lists it.
async fn attach_past_window(pool: &PgPool, name: &str, from_ago: &str, to_ago: &str) {
    let mut tx = pool.begin().await.expect("begin");
    for sql in [
        format!("CREATE TABLE workpump.{name} (LIKE workpump.work_history)"),
        format!(
            "ALTER TABLE workpump.work_history ATTACH PARTITION workpump.{name}
             FOR VALUES FROM (now() - interval '{from_ago}') TO (now() - interval '{to_ago}')"
        ),
        format!(
            "INSERT INTO workpump.history_partitions (name, from_at, to_at)
             VALUES ('{name}', now() - interval '{from_ago}', now() - interval '{to_ago}')"
        ),
    ] {
        sqlx::query(&sql).execute(&mut *tx).await.expect(&sql);
    }
    tx.commit().await.expect("commit");
}

/// Moves these completed items' finished_at back by `ago` (PostgreSQL moves each row to the
/// partition of its new finished_at).
async fn finish_earlier(pool: &PgPool, ids: &[i64], ago: &str) {
    sqlx::query(&format!(
        "UPDATE workpump.work_history SET finished_at = finished_at - interval '{ago}'
         WHERE id = ANY ($1)"
    ))
    .bind(ids)
    .execute(pool)
    .await
    .expect("age completed items");
}

async fn exists(pool: &PgPool, table: &str) -> bool {
    sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL")
        .bind(table)
        .fetch_one(pool)
        .await
        .expect("to_regclass")
}

async fn due(c: &PgCoordinator) -> bool {
    c.maintenance_due(MaintenanceDueParams {
        judge: None,
        stale_after: Duration::from_secs(30),
        dead_after: Some(Duration::from_secs(300)),
        lock_grace: None,
        completed_retention: DAY,
        dead_retention: 7 * DAY,
        evicted_retention: 7 * DAY,
        lapsed_look_every: Duration::ZERO,
    })
    .await
    .expect("maintenance_due")
    .finished
}

/// A fresh store's first prune attaches now()'s window and those up to 3 windows ahead (1 h
/// windows for a 24 h retention), after which nothing is due; completions land in those
/// partitions, none in the default one; and a partition whose window ended a retention ago is
/// dropped whole, its items gone without a DELETE, while a completion in the default
/// partition is deleted row by row.
#[tokio::test]
async fn completions_land_in_partitions_and_a_partition_past_the_retention_goes_whole() {
    let (_db, pool, c) = fresh_store_with_queue("q").await;
    let me = registered_instance(&c).await;
    assert!(
        due(&c).await,
        "a store without partitions is due a rotation"
    );

    let first = prune(&c).await;
    let kept = listed(&pool).await;
    assert_eq!(first.partitions_created, kept.len() as u64, "{first:?}");
    assert!(
        (3..=4).contains(&kept.len()),
        "now()'s window and up to 3 ahead: {kept:?}"
    );
    assert!(kept[0].1, "the first window is now()'s: {kept:?}");
    assert!(!first.partitions_busy);
    assert!(!due(&c).await, "nothing is due after the rotation");
    assert_eq!(
        prune(&c).await,
        PruneFinishedOutcome::default(),
        "a second call has nothing to do"
    );

    let ids = complete_n(&c, me, 20).await;
    let names: Vec<String> = kept.iter().map(|(n, _)| n.clone()).collect();
    let landed = partitions_of(&pool, &ids).await;
    assert!(
        !landed.is_empty() && landed.iter().all(|p| names.contains(p)),
        "completions land in the listed partitions: {landed:?} of {names:?}"
    );

    // Ten items completed two days ago, in a partition of that day; one in the default
    // partition (no partition covers 3 days ago); one 25 hours ago, in a partition whose
    // window has not ended a retention ago: it waits for its window (row by row it would go
    // now); eight stay.
    attach_past_window(&pool, "work_history_old", "50 hours", "40 hours").await;
    attach_past_window(&pool, "work_history_straddling", "30 hours", "20 hours").await;
    finish_earlier(&pool, &ids[..10], "45 hours").await;
    finish_earlier(&pool, &ids[10..11], "3 days").await;
    finish_earlier(&pool, &ids[11..12], "25 hours").await;
    assert_eq!(
        partitions_of(&pool, &ids[11..12]).await,
        vec!["workpump.work_history_straddling".to_string()]
    );
    assert_eq!(
        partitions_of(&pool, &ids[..10]).await,
        vec!["workpump.work_history_old".to_string()]
    );
    assert_eq!(
        partitions_of(&pool, &ids[10..11]).await,
        vec!["workpump.work_history_default".to_string()]
    );
    assert!(due(&c).await, "a partition past the retention is due");

    let out = prune(&c).await;
    assert_eq!(
        out,
        PruneFinishedOutcome {
            completed: 1,
            partitions_dropped: 1,
            ..Default::default()
        },
        "the old partition dropped, the default partition's item deleted"
    );
    assert!(!exists(&pool, "workpump.work_history_old").await);
    let mut names = names;
    names.insert(0, "workpump.work_history_straddling".to_string());
    assert_eq!(
        listed(&pool)
            .await
            .into_iter()
            .map(|(n, _)| n)
            .collect::<Vec<_>>(),
        names,
        "the dropped partition is unlisted"
    );
    let left: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM workpump.work_all WHERE id = ANY ($1) ORDER BY id")
            .bind(&ids)
            .fetch_all(&pool)
            .await
            .expect("items left");
    assert_eq!(left, ids[11..].to_vec());
    for id in &ids[11..] {
        let item = c
            .get_work(GetWorkParams { id: *id })
            .await
            .expect("get")
            .item;
        assert_eq!(item.state, WorkState::Completed);
    }
    assert!(!due(&c).await);
}

/// A drop needs the history to itself: while a transaction reads it, the rotation waits at
/// most its lock timeout, says busy and drops nothing (the call still succeeds); the next call
/// drops it. A second rotation while one runs says busy at once.
#[tokio::test]
async fn a_rotation_that_cannot_lock_the_history_says_busy_and_goes_on_next_time() {
    let (db, pool, c) = fresh_store_with_queue("q").await;
    prune(&c).await;
    attach_past_window(&pool, "work_history_old", "50 hours", "40 hours").await;

    let mut reader = sqlx::PgConnection::connect(db.url())
        .await
        .expect("connect");
    let mut tx = reader.begin().await.expect("begin");
    sqlx::query("SELECT count(*) FROM workpump.work_history")
        .execute(&mut *tx)
        .await
        .expect("read the history");
    let blocked = prune(&c).await;
    assert_eq!(
        blocked,
        PruneFinishedOutcome {
            partitions_busy: true,
            ..Default::default()
        }
    );
    assert!(exists(&pool, "workpump.work_history_old").await);
    tx.commit().await.expect("commit");

    let mut rotating = sqlx::PgConnection::connect(db.url())
        .await
        .expect("connect");
    let mut tx = rotating.begin().await.expect("begin");
    sqlx::query("LOCK TABLE workpump.history_partitions IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .expect("hold the rotation's lock");
    assert!(prune(&c).await.partitions_busy, "another rotation holds it");
    tx.rollback().await.expect("rollback");

    let out = prune(&c).await;
    assert_eq!(
        (out.partitions_dropped, out.partitions_busy),
        (1, false),
        "{out:?}"
    );
    assert!(!exists(&pool, "workpump.work_history_old").await);
}

/// Completions that finished before the first rotation are in the default partition: now()'s
/// window, which holds them, is not attached (PostgreSQL would refuse it); the next ones are,
/// and the items stay readable where they are.
#[tokio::test]
async fn a_window_with_completions_in_the_default_partition_is_skipped() {
    let (_db, pool, c) = fresh_store_with_queue("q").await;
    let me = registered_instance(&c).await;
    let ids = complete_n(&c, me, 3).await;
    assert_eq!(
        partitions_of(&pool, &ids).await,
        vec!["workpump.work_history_default".to_string()]
    );

    let out = prune(&c).await;
    assert!(out.partitions_created >= 3, "{out:?}");
    assert!(!out.partitions_busy);
    let covering: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM workpump.history_partitions p, workpump.work_history_default h
         WHERE h.id = ANY ($1) AND p.from_at <= h.finished_at AND h.finished_at < p.to_at",
    )
    .bind(&ids)
    .fetch_one(&pool)
    .await
    .expect("windows holding the items");
    assert_eq!(covering, 0, "no partition's window holds them");
    assert_eq!(
        partitions_of(&pool, &ids).await,
        vec!["workpump.work_history_default".to_string()]
    );
    assert!(!due(&c).await);
}

/// The window of the partitions for a retention: the widest of the ladder at most an eighth of
/// it (docs/store.md, "Retention of completed items"), 1 min below the ladder.
#[tokio::test]
async fn the_window_is_the_widest_step_within_an_eighth_of_the_retention() {
    let (_db, pool, _c) = fresh_store_with_queue("q").await;
    let windows: Vec<(String, String)> = sqlx::query_as(
        "SELECT r::text, workpump.history_window(r)::text
         FROM unnest(ARRAY['1 second', '10 minutes', '1 hour', '24 hours', '7 days', '30 days',
                           '100 days', '3650 days']::interval[]) AS r",
    )
    .fetch_all(&pool)
    .await
    .expect("history_window");
    let got: Vec<(&str, &str)> = windows
        .iter()
        .map(|(r, w)| (r.as_str(), w.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("00:00:01", "00:01:00"),
            ("00:10:00", "00:01:00"),
            ("01:00:00", "00:05:00"),
            ("24:00:00", "01:00:00"),
            ("7 days", "06:00:00"),
            ("30 days", "1 day"),
            ("100 days", "7 days"),
            ("3650 days", "365 days"),
        ]
    );
}
