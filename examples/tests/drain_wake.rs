//! A drain hands its items to idle peers at once. `HostHandle::shutdown` promises that peers
//! claim the released items "at once"; an idle peer, though, only learns of new work from a
//! wake signal (NOTIFY) or its next safety-net poll, which with the default settings comes
//! 5 to 10 s later. So the release must wake the queue's claimers, as `enqueue_work`,
//! `promote_scheduled` and the reap in `cleanup_stale_instances` do.

mod support;

use std::time::Duration;

use serde_json::json;

use support::{database, db_now, enqueue, scalar, wait_until, Proc, FAST_LIVENESS};

#[tokio::test]
async fn a_drain_wakes_an_idle_peer_which_picks_up_the_released_items_at_once() {
    let (db, pool) = database().await;
    let args = ["--lease-ms", "60000", "--concurrency", "4"];
    let mut first = Proc::start("d1", db.url(), &args, &FAST_LIVENESS).await;
    let sleepers = (0..4).map(|_| json!({ "kind": "sleep", "ms": 60_000 }));
    enqueue(&pool, sleepers.collect()).await;
    wait_until(Duration::from_secs(10), "d1 runs all 4 items", || async {
        scalar(&pool, "SELECT count(*) FROM workpump_ledger").await == 4
    })
    .await;
    // The peer runs with the default poll settings.
    let mut second = Proc::start("d2", db.url(), &args, &FAST_LIVENESS).await;

    let sent = db_now(&pool).await;
    assert!(first.terminate().await.success());
    wait_until(Duration::from_secs(15), "d2 runs all 4 items", || async {
        scalar(
            &pool,
            &format!(
                "SELECT count(DISTINCT item) FROM workpump_ledger WHERE instance = '{}'",
                second.instance
            ),
        )
        .await
            == 4
    })
    .await;
    let slowest: f64 = sqlx::query_scalar(
        "SELECT max(extract(epoch FROM at)::float8 - $2) FROM workpump_ledger WHERE instance = $1",
    )
    .bind(second.instance)
    .bind(sent)
    .fetch_one(&pool)
    .await
    .expect("pickup times");
    assert!(
        slowest < 2.0,
        "d2 started the last released item {slowest:.1} s after the SIGTERM: the release \
         woke no one, and d2 found the items on its next safety-net poll"
    );

    assert!(second.terminate().await.success());
    pool.close().await;
    db.drop_database().await.expect("drop");
}
