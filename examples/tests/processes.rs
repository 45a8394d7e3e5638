//! End-to-end with hosts in separate processes: `workpump-worker` (this package's binary)
//! started several times on one throwaway database, then killed with SIGKILL or stopped
//! with SIGTERM. The database is the witness: the workers' ledger (one row per handler
//! execution) and the audit (`workpump_audit`, examples/sql/evidence.sql) of every change to an
//! item.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use sqlx::types::Uuid;
use tokio::process::Command;

use support::{database, db_now, enqueue, scalar, wait_until, Proc, FAST_LIVENESS, QUEUE};

#[tokio::test]
async fn a_killed_workers_items_are_reclaimed_by_the_others_and_completed_exactly_once() {
    let (db, pool) = database().await;
    let args = ["--lease-ms", "2000", "--concurrency", "8"];
    let mut workers = Vec::new();
    for name in ["k1", "k2", "k3"] {
        workers.push(Proc::start(name, db.url(), &args, &FAST_LIVENESS).await);
    }
    let payloads: Vec<serde_json::Value> = (0..240)
        .map(|i| match i % 4 {
            0 => json!({ "kind": "sleep", "ms": 300 + (i * 37) % 600 }),
            1 => json!({ "kind": "tx" }),
            2 => json!({ "kind": "fail", "times": 1 }),
            _ => json!({ "kind": "noop" }),
        })
        .collect();
    enqueue(&pool, payloads).await;

    // Kill k2 while its handlers run (their ledger rows are in: the attempts started).
    let victim = workers[1].instance;
    wait_until(
        Duration::from_secs(20),
        "k2 runs at least 3 items",
        || async {
            let running: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM workpump.work_all w
             WHERE w.instance_id = $1 AND w.state = 'running'
               AND EXISTS (SELECT 1 FROM workpump_ledger l
                           WHERE l.item = w.id AND l.token = w.claim_token)",
            )
            .bind(victim)
            .fetch_one(&pool)
            .await
            .expect("count");
            running >= 3
        },
    )
    .await;
    let killed_at = db_now(&pool).await;
    workers[1].kill9().await;
    let held: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM workpump.work_all WHERE instance_id = $1 AND state = 'running'",
    )
    .bind(victim)
    .fetch_all(&pool)
    .await
    .expect("its items");

    wait_until(Duration::from_secs(40), "every item completed", || async {
        scalar(
            &pool,
            "SELECT count(*) FROM workpump.work_all WHERE state = 'completed'",
        )
        .await
            == 240
    })
    .await;

    // Exactly once: one final outcome per item in the audit, each written under the claim
    // (instance and token) of an execution the ledger saw start; one effect per tx item.
    let outcomes: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT item, count(*) FROM workpump_audit
         WHERE to_state IN ('completed', 'dead', 'cancelled') GROUP BY item",
    )
    .fetch_all(&pool)
    .await
    .expect("outcomes");
    assert_eq!(outcomes.len(), 240);
    assert!(
        outcomes.iter().all(|(_, n)| *n == 1),
        "one outcome per item"
    );
    let unbacked = scalar(
        &pool,
        "SELECT count(*) FROM workpump_audit a
         WHERE a.to_state = 'completed'
           AND NOT EXISTS (SELECT 1 FROM workpump_ledger l WHERE l.item = a.item
                           AND l.token = a.from_token AND l.instance = a.from_instance)",
    )
    .await;
    assert_eq!(
        unbacked, 0,
        "every outcome came from a claim that ran the handler"
    );
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM workpump_effects").await,
        60
    );

    // The killed worker's items: each was claimed again by a survivor and completed there —
    // unless a write the killed worker had already sent finished it first (a statement in
    // flight when it died); never both. Its attempts show in the ledger, and no outcome of
    // it landed for an item a survivor had reclaimed.
    assert!(!held.is_empty());
    let reclaimed: BTreeMap<i64, Uuid> = sqlx::query_as(
        "SELECT DISTINCT ON (item) item, to_instance FROM workpump_audit
         WHERE item = ANY ($1) AND to_instance IS NOT NULL AND to_instance <> $2
           AND at >= to_timestamp($3)
         ORDER BY item, at",
    )
    .bind(&held)
    .bind(victim)
    .bind(killed_at)
    .fetch_all(&pool)
    .await
    .expect("reclaims")
    .into_iter()
    .collect();
    // (A write in flight is stamped when its statement ran, which may be before the kill;
    // it committed after the snapshot, since the item was still running then.)
    let finished_late: BTreeSet<i64> = sqlx::query_scalar(
        "SELECT item FROM workpump_audit WHERE item = ANY ($1) AND from_instance = $2
           AND to_state IN ('completed', 'dead', 'cancelled')",
    )
    .bind(&held)
    .bind(victim)
    .fetch_all(&pool)
    .await
    .expect("late writes")
    .into_iter()
    .collect();
    let survivors: BTreeSet<Uuid> = [workers[0].instance, workers[2].instance].into();
    for item in &held {
        match (reclaimed.get(item), finished_late.contains(item)) {
            (Some(by), false) => assert!(survivors.contains(by), "{item} went to a survivor"),
            (None, true) => {}
            (None, false) => panic!("item {item} of the killed worker was never reclaimed"),
            (Some(_), true) => panic!("item {item} was reclaimed and finished by the dead"),
        }
    }
    assert!(!reclaimed.is_empty(), "the survivors reclaimed its items");
    let victims_runs: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM workpump_ledger WHERE instance = $1 AND item = ANY ($2)",
    )
    .bind(victim)
    .bind(reclaimed.keys().copied().collect::<Vec<i64>>())
    .fetch_one(&pool)
    .await
    .expect("count");
    assert!(
        victims_runs > 0,
        "the killed worker's attempts show in the ledger"
    );

    for i in [0, 2] {
        assert!(workers[i].terminate().await.success());
    }
    pool.close().await;
    db.drop_database().await.expect("drop");
}

#[tokio::test]
async fn a_terminated_worker_releases_its_leases_and_a_peer_picks_them_up_long_before_they_expire()
{
    let (db, pool) = database().await;
    // A 60 s lease: a pickup within 10 s of the SIGTERM can only come from the drain's
    // release, never from expiry.
    let args = ["--lease-ms", "60000", "--concurrency", "4"];
    let mut first = Proc::start("t1", db.url(), &args, &FAST_LIVENESS).await;
    let sleepers: Vec<serde_json::Value> = (0..4)
        .map(|_| json!({ "kind": "sleep", "ms": 60_000 }))
        .collect();
    enqueue(&pool, sleepers).await;
    wait_until(Duration::from_secs(10), "t1 runs all 4 items", || async {
        scalar(&pool, "SELECT count(*) FROM workpump_ledger").await == 4
    })
    .await;
    // t2 idles until then. A release sends no wake signal (see drain_wake.rs), so t2 finds
    // the items on its safety-net poll: keep that under 2 s, whatever its idle backoff.
    let mut env = FAST_LIVENESS.to_vec();
    env.extend([
        ("WORKPUMP_CLAIM__NOTIFY_HEALTHY_BASE_MS", "1000"),
        ("WORKPUMP_CLAIM__POLL_MAX_MS", "2000"),
    ]);
    let mut second = Proc::start("t2", db.url(), &args, &env).await;

    let sent = db_now(&pool).await;
    let status = first.terminate().await;
    assert!(status.success(), "t1 drained and exited cleanly: {status}");
    wait_until(Duration::from_secs(10), "t2 runs all 4 items", || async {
        let on_second: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT item) FROM workpump_ledger WHERE instance = $1",
        )
        .bind(second.instance)
        .fetch_one(&pool)
        .await
        .expect("count");
        on_second == 4
    })
    .await;

    // The release gave the leases back without counting the attempt (no error in the
    // history), and t2 ran the same attempt number again, within 10 s of the SIGTERM.
    let releases: Vec<(String, bool)> = sqlx::query_as(
        "SELECT to_state, error IS NOT NULL FROM workpump_audit
             WHERE from_instance = $1 AND to_state <> from_state",
    )
    .bind(first.instance)
    .fetch_all(&pool)
    .await
    .expect("t1's transitions");
    assert_eq!(releases.len(), 4);
    assert!(
        releases
            .iter()
            .all(|(to, failed)| to == "available" && !failed),
        "released, not failed: {releases:?}"
    );
    let attempts: Vec<(Uuid, i32)> =
        sqlx::query_as("SELECT instance, attempt FROM workpump_ledger ORDER BY at")
            .fetch_all(&pool)
            .await
            .expect("the ledger");
    assert!(attempts.iter().all(|(_, a)| *a == 1), "{attempts:?}");
    let slowest: f64 = sqlx::query_scalar(
        "SELECT max(extract(epoch FROM at)::float8 - $2) FROM workpump_ledger WHERE instance = $1",
    )
    .bind(second.instance)
    .bind(sent)
    .fetch_one(&pool)
    .await
    .expect("pickup times");
    assert!(
        slowest < 10.0,
        "t2 started the last item {slowest:.1} s after the SIGTERM"
    );

    assert!(second.terminate().await.success());
    pool.close().await;
    db.drop_database().await.expect("drop");
}

/// A multi-host URL is the host's to follow (sqlx reads one host): the worker lets the host
/// connect and gives its handlers the host's pool, so their own queries — the ledger, a `hold`
/// item's transaction — go where the host found a server that qualifies. Here the first host
/// listed refuses connections and the second is the database.
#[tokio::test]
async fn a_worker_on_a_multi_host_url_runs_its_handlers_on_the_host_that_qualifies() {
    let server = workpump_testdb::server()
        .await
        .expect("the test PostgreSQL");
    let Some(cluster) = server.cluster() else {
        eprintln!("skipped: DATABASE_URL names an external server, whose port is not ours");
        return;
    };
    let (db, pool) = database().await;
    let refusing = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let url = format!(
        "postgres://postgres@127.0.0.1:{refusing},127.0.0.1:{}/{}?target_session_attrs=read-write",
        cluster.port(),
        db.name()
    );
    let mut worker = Proc::start("m1", &url, &["--concurrency", "4"], &FAST_LIVENESS).await;
    let payloads: Vec<serde_json::Value> = (0..40)
        .map(|i| match i % 4 {
            0 => json!({ "kind": "tx" }),
            1 => json!({ "kind": "hold", "ms": 50 }),
            2 => json!({ "kind": "sleep", "ms": 50 }),
            _ => json!({ "kind": "noop" }),
        })
        .collect();
    enqueue(&pool, payloads).await;
    wait_until(Duration::from_secs(30), "every item completed", || async {
        scalar(
            &pool,
            "SELECT count(*) FROM workpump.work_all WHERE state = 'completed'",
        )
        .await
            == 40
    })
    .await;
    assert_eq!(
        scalar(&pool, "SELECT count(DISTINCT item) FROM workpump_ledger").await,
        40,
        "every execution was recorded in the ledger, through the host's pool"
    );
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM workpump_effects").await,
        10
    );
    assert!(worker.terminate().await.success());
    pool.close().await;
    db.drop_database().await.expect("drop");
}

#[tokio::test]
async fn a_worker_with_an_invalid_configuration_exits_naming_every_violated_setting() {
    let output = Command::new(env!("CARGO_BIN_EXE_workpump-worker"))
        .args([
            "--database-url",
            "postgres://nobody@127.0.0.1:1/nothing",
            "--queue",
            QUEUE,
        ])
        .env("WORKPUMP_LIVENESS__STALE_AFTER_MS", "100")
        .env("WORKPUMP_LEASE__LEASE_MS", "1000")
        .env("WORKPUMP_LEASE__RENEWAL_INTERVAL_MS", "5000")
        .env("WORKPUMP_CLAIM__MAX_ITEMS_PER_CLAIM", "0")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run workpump-worker");
    assert!(!output.status.success(), "it refuses to start");
    let stderr = String::from_utf8_lossy(&output.stderr);
    for setting in [
        "liveness.stale_after_ms",
        "lease.renewal_interval_ms",
        "claim.max_items_per_claim",
    ] {
        assert!(stderr.contains(setting), "{setting} is named:\n{stderr}");
    }
    assert!(
        !String::from_utf8_lossy(&output.stdout).contains("READY"),
        "it never said READY"
    );
}
