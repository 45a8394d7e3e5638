//! The liveness rule on a real server (`cleanup_stale_instances` and its parts): what only
//! PostgreSQL can show — sessions reset by the server, the age of the sweeping connection,
//! row locks between concurrent heartbeats. Each test failed against the store before the
//! rule (`5dc7744`), as its last sentence says.

use std::time::Duration;

use sqlx::{Connection, PgConnection};
use uuid::Uuid;
use workpump_coordinator::testing::{fresh_store, FreshStore};
use workpump_testdb::TestDatabase;

/// The longest any wait here lasts.
const DEADLINE: Duration = Duration::from_secs(20);

async fn database() -> TestDatabase {
    let FreshStore { pool, db, .. } = fresh_store().await;
    pool.close().await;
    db
}

async fn connect(db: &TestDatabase) -> PgConnection {
    PgConnection::connect(db.url()).await.expect("connect")
}

/// Registers `id` (a registration beat that reports no lock session): stale after `stale`,
/// dead after 5 min, lock grace `grace`.
async fn register(conn: &mut PgConnection, id: Uuid, stale: &str, grace: &str) {
    let evicted: bool = sqlx::query_scalar(&format!(
        "SELECT evicted FROM workpump.record_heartbeat($1, 'test', '{{}}', interval '{stale}',
                                                       interval '5 minutes', interval '{grace}',
                                                       NULL, true)"
    ))
    .bind(id)
    .fetch_one(conn)
    .await
    .expect("heartbeat");
    assert!(!evicted);
}

/// Takes `id`'s alive-lock on a connection of its own, which the caller keeps.
async fn lock(db: &TestDatabase, id: Uuid) -> PgConnection {
    let mut session = connect(db).await;
    let held: bool = sqlx::query_scalar("SELECT workpump.take_alive_lock($1)")
        .bind(id)
        .fetch_one(&mut session)
        .await
        .expect("take the alive-lock");
    assert!(held);
    session
}

async fn exec(conn: &mut PgConnection, sql: &str, id: Uuid) {
    sqlx::query(sql)
        .bind(id)
        .execute(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// An operator's sweep (no judge): its watch is the calling connection's.
async fn sweep(conn: &mut PgConnection, stale: &str, grace: &str) -> Vec<Uuid> {
    sqlx::query_scalar(&format!(
        "SELECT instance_id FROM workpump.cleanup_stale_instances(NULL, interval '{stale}',
                                                               interval '5 minutes',
                                                               interval '{grace}')"
    ))
    .fetch_all(conn)
    .await
    .expect("sweep")
}

async fn registered(conn: &mut PgConnection) -> Vec<Uuid> {
    sqlx::query_scalar("SELECT instance_id FROM workpump.instances ORDER BY instance_id")
        .fetch_all(conn)
        .await
        .expect("instances")
}

/// Waits until the connection has been open for longer than `age` (server clock).
async fn until_older_than(conn: &mut PgConnection, age: Duration) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let old: bool = sqlx::query_scalar(
            "SELECT now() - backend_start > $1 FROM pg_stat_activity WHERE pid = pg_backend_pid()",
        )
        .bind(age)
        .fetch_one(&mut *conn)
        .await
        .expect("read the connection's age");
        if old {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never got {age:?} old"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Ends every session of the database but the caller's, as a crash of one backend does for
/// the whole server (crash recovery resets every session; `pg_postmaster_start_time()` does
/// not change, nor does it on a promoted standby), and waits until they are gone.
async fn reset_every_other_session(conn: &mut PgConnection) {
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_all(&mut *conn)
    .await
    .expect("sessions");
    for pid in &pids {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&mut *conn)
            .await
            .expect("terminate");
    }
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY ($1)")
                .bind(&pids)
                .fetch_one(&mut *conn)
                .await
                .expect("count");
        if left == 0 {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A reset ends every session, and with them every alive-lock: at beat ages 0, 35 and 55 s
/// (the slow cadence is 60 s, the stale cutoff 30 s) nothing there is evidence that a client
/// died. Sweeps right after it, and after the locks have been gone for longer than the
/// grace, reap nobody. (Before the rule the 35 s and 55 s instances went at the first sweep, by
/// staleness, and the third after the grace, by the lost lock.)
#[tokio::test]
async fn a_reset_of_every_session_evicts_nobody_whatever_the_beat_ages() {
    let db = database().await;
    let mut admin = connect(&db).await;
    let ids = [Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4()];
    let mut locks = Vec::new();
    for (id, age) in ids.iter().zip([0, 35, 55]) {
        register(&mut admin, *id, "30 seconds", "3 seconds").await;
        locks.push(lock(&db, *id).await);
        exec(
            &mut admin,
            &format!(
                "UPDATE workpump.instances SET last_heartbeat_at = now() - interval '{age} s'
                 WHERE instance_id = $1"
            ),
            *id,
        )
        .await;
    }
    reset_every_other_session(&mut admin).await;
    drop(locks);
    admin.close().await.expect("close");

    let mut sweeper = connect(&db).await;
    assert_eq!(
        sweep(&mut sweeper, "30 seconds", "3 seconds").await,
        Vec::<Uuid>::new(),
        "the first sweep after the reset"
    );
    sqlx::query("UPDATE workpump.instances SET lock_lost_at = lock_lost_at - interval '1 minute'")
        .execute(&mut sweeper)
        .await
        .expect("age the lock losses");
    assert_eq!(
        sweep(&mut sweeper, "30 seconds", "3 seconds").await,
        Vec::<Uuid>::new(),
        "locks gone for longer than the grace"
    );
    let mut expected = ids.to_vec();
    expected.sort();
    assert_eq!(registered(&mut sweeper).await, expected);
}

/// A live instance at the slow cadence (its beat older than the stale cutoff) whose lock
/// session is killed is not reaped by the first sweep that sees the lock gone, even by a
/// judge that has watched for longer than the stale cutoff: the lock grace holds on the stale
/// path too, and the owner takes its lock again within it. (Before the rule the first sweep
/// reaped it by staleness.)
#[tokio::test]
async fn a_lock_blip_past_the_stale_cutoff_is_covered_by_the_grace() {
    let db = database().await;
    let mut sweeper = connect(&db).await;
    let me = Uuid::new_v4();
    register(&mut sweeper, me, "2 seconds", "1 second").await;
    let session = lock(&db, me).await;
    until_older_than(&mut sweeper, Duration::from_secs(2)).await;
    exec(
        &mut sweeper,
        "UPDATE workpump.instances SET last_heartbeat_at = now() - interval '3 s'
         WHERE instance_id = $1",
        me,
    )
    .await;
    session.close().await.expect("the lock session ends");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let alive: bool = sqlx::query_scalar("SELECT workpump.is_instance_alive($1)")
            .bind(me)
            .fetch_one(&mut sweeper)
            .await
            .expect("alive?");
        if !alive {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        sweep(&mut sweeper, "2 seconds", "1 second").await,
        Vec::<Uuid>::new(),
        "first sight of the lost lock"
    );
    // Within the grace the owner takes its lock again: a later sweep keeps it.
    let _again = lock(&db, me).await;
    exec(
        &mut sweeper,
        "UPDATE workpump.instances SET last_heartbeat_at = now() - interval '10 s'
         WHERE instance_id = $1",
        me,
    )
    .await;
    assert_eq!(
        sweep(&mut sweeper, "2 seconds", "1 second").await,
        Vec::<Uuid>::new(),
        "its lock is held again"
    );
    assert_eq!(registered(&mut sweeper).await, vec![me]);
}

/// A sweep judges staleness only once it has watched the server for longer than the cutoff:
/// an operator's sweep on a connection younger than the stale cutoff reaps nobody, the same
/// sweep on the same connection later does. (Before the rule any sweep reaped at once.)
#[tokio::test]
async fn a_sweep_on_a_young_connection_reaps_nobody_by_staleness() {
    let db = database().await;
    let mut admin = connect(&db).await;
    let gone = Uuid::new_v4();
    register(&mut admin, gone, "5 seconds", "1 second").await;
    exec(
        &mut admin,
        "UPDATE workpump.instances SET last_heartbeat_at = now() - interval '1 minute'
         WHERE instance_id = $1",
        gone,
    )
    .await;
    let mut sweeper = connect(&db).await;
    assert_eq!(
        sweep(&mut sweeper, "5 seconds", "1 second").await,
        Vec::<Uuid>::new(),
        "a connection seconds old has not watched for 5 s"
    );
    until_older_than(&mut sweeper, Duration::from_secs(5)).await;
    assert_eq!(
        sweep(&mut sweeper, "5 seconds", "1 second").await,
        vec![gone]
    );
}

/// The store refuses cutoffs below its floor: a caller cannot reap its peers with a
/// microsecond. (Before the rule it reaped every instance whose beat was older than that.)
#[tokio::test]
async fn a_cutoff_below_the_store_floor_is_refused() {
    let db = database().await;
    let mut conn = connect(&db).await;
    register(&mut conn, Uuid::new_v4(), "30 seconds", "3 seconds").await;
    let err =
        sqlx::query("SELECT * FROM workpump.cleanup_stale_instances(NULL, interval '1 microsecond', NULL, NULL)")
            .execute(&mut conn)
            .await
            .expect_err("refused");
    let text = err.to_string();
    assert!(
        text.contains("stale_after") && text.contains("floor"),
        "{text}"
    );
    assert_eq!(registered(&mut conn).await.len(), 1);
}

/// The floor the Rust side refuses cutoffs below at start (`STORE_FLOOR`, which
/// `Liveness::validate` and the fake use) is the one the migration installs.
#[tokio::test]
async fn the_floor_rust_checks_at_start_is_the_migrated_store_floor() {
    let db = database().await;
    let mut conn = connect(&db).await;
    let (stale, dead, grace): (f64, f64, f64) = sqlx::query_as(
        "SELECT extract(epoch FROM stale_after)::float8, extract(epoch FROM dead_after)::float8,
                extract(epoch FROM lock_grace)::float8
         FROM workpump.liveness_floor",
    )
    .fetch_one(&mut conn)
    .await
    .expect("the floor");
    let floor = workpump_coordinator::STORE_FLOOR;
    assert_eq!(stale, floor.stale_after.as_secs_f64());
    assert_eq!(Some(dead), floor.dead_after.map(|d| d.as_secs_f64()));
    assert_eq!(Some(grace), floor.lock_grace.map(|g| g.as_secs_f64()));
}

/// Two heartbeats whose sweeps each record the other's lost lock, while each holds its own
/// row, do not wait on each other (before the rule this deadlocked: each locked its own row,
/// then its sweep waited for the other's).
#[tokio::test]
async fn two_heartbeats_sweeping_each_other_do_not_deadlock() {
    let db = database().await;
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let mut one = connect(&db).await;
    let mut two = connect(&db).await;
    register(&mut one, a, "30 seconds", "3 seconds").await;
    register(&mut one, b, "30 seconds", "3 seconds").await;
    let (lock_a, lock_b) = (lock(&db, a).await, lock(&db, b).await);
    // Each opens a transaction holding its own row (a beat while both locks are held sweeps
    // nothing)...
    sqlx::query("BEGIN").execute(&mut one).await.expect("begin");
    sqlx::query("BEGIN").execute(&mut two).await.expect("begin");
    register(&mut one, a, "30 seconds", "3 seconds").await;
    register(&mut two, b, "30 seconds", "3 seconds").await;
    // ...then both locks go, and each beats again: each sweep records the other's loss.
    lock_a.close().await.expect("close");
    lock_b.close().await.expect("close");
    let mut probe = connect(&db).await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let held: i64 = sqlx::query_scalar("SELECT count(*) FROM workpump.alive_lock_held_keys()")
            .fetch_one(&mut probe)
            .await
            .expect("locks");
        if held == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for conn in [&mut one, &mut two] {
        sqlx::query("SET statement_timeout = '5s'")
            .execute(&mut *conn)
            .await
            .expect("timeout");
    }
    let first = tokio::spawn(async move {
        register(&mut one, a, "30 seconds", "3 seconds").await;
        one
    });
    register(&mut two, b, "30 seconds", "3 seconds").await;
    let mut one = tokio::time::timeout(DEADLINE, first)
        .await
        .expect("the first beat returns")
        .expect("no panic");
    sqlx::query("COMMIT")
        .execute(&mut one)
        .await
        .expect("commit");
    sqlx::query("COMMIT")
        .execute(&mut two)
        .await
        .expect("commit");
}

/// The ordering keys' transaction locks live in the other advisory lock space (two int4
/// keys): while an enqueue holds one, `alive_lock_held_keys()` reports nothing of its session,
/// so no ordering lock can ever pass for an instance's alive-lock.
#[tokio::test]
async fn an_ordering_keys_lock_is_never_taken_for_an_alive_lock() {
    let db = database().await;
    let mut setup = connect(&db).await;
    sqlx::query("SELECT workpump.register_queue('q', 10, NULL, 'hold', NULL, NULL, NULL)")
        .execute(&mut setup)
        .await
        .expect("queue");
    let mut enqueuer = connect(&db).await;
    sqlx::query("BEGIN")
        .execute(&mut enqueuer)
        .await
        .expect("begin");
    let pid: i32 = sqlx::query_scalar(
        "SELECT pg_backend_pid() FROM workpump.enqueue_work(ARRAY['q'], ARRAY['{}'::jsonb],
             ARRAY[NULL::smallint], ARRAY[NULL::interval], ARRAY[NULL::timestamptz],
             ARRAY[NULL::text], ARRAY[NULL::int], ARRAY[NULL::text], ARRAY[NULL::jsonb],
             ARRAY['customer-1'])",
    )
    .fetch_one(&mut enqueuer)
    .await
    .expect("a keyed enqueue, left open");
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1 AND granted",
    )
    .bind(pid)
    .fetch_one(&mut setup)
    .await
    .expect("pg_locks");
    assert_eq!(held, 1, "the enqueue holds its key's lock until it commits");
    let seen: i64 =
        sqlx::query_scalar("SELECT count(*) FROM workpump.alive_lock_held_keys() WHERE pid = $1")
            .bind(pid)
            .fetch_one(&mut setup)
            .await
            .expect("alive_lock_held_keys");
    assert_eq!(seen, 0);
    sqlx::query("COMMIT")
        .execute(&mut enqueuer)
        .await
        .expect("commit");
}
