//! The fresh-database fixture every crate's PostgreSQL tests share (feature `testing`).

use sqlx::postgres::PgPool;
use workpump_testdb::TestDatabase;

use crate::coordinator::WorkCoordinator;
use crate::pg::{migrate, PgCoordinator, DEFAULT_SCHEMA};
use crate::types::{InstanceId, TakeAliveLockOutcome, TakeAliveLockParams};

/// A fresh database of its own on the test server (`workpump_testdb::server()`: the
/// throwaway cluster, or `DATABASE_URL`'s), migrated into [`DEFAULT_SCHEMA`], with a
/// [`PgCoordinator`] and a pool on it for the reads and `UPDATE`s a test makes behind the
/// trait. Dropping it drops the database (`DROP DATABASE ... WITH (FORCE)`), whatever still
/// holds connections to it; move the fields out to keep only what a test needs.
pub struct FreshStore {
    /// The coordinator on the database, sharing [`pool`](Self::pool).
    pub coordinator: PgCoordinator,
    /// A pool on the database, as `TestDatabase::pool` makes it.
    pub pool: PgPool,
    /// The database; dropped last, and with it every session still on it.
    pub db: TestDatabase,
}

/// A fresh, empty database of its own on the test server, not migrated (unlike
/// [`fresh_store`]), with a pool on it: for tests that migrate it themselves. Panics when
/// there is no server: it is for tests.
pub async fn fresh_database() -> (TestDatabase, PgPool) {
    let db = workpump_testdb::server()
        .await
        .expect("a PostgreSQL server")
        .create_database()
        .await
        .expect("a fresh database");
    let pool = db.pool().await.expect("connect");
    (db, pool)
}

/// Creates a fresh database, migrates it and opens a [`PgCoordinator`] on it. Panics when
/// there is no server or the migration fails: it is for tests.
pub async fn fresh_store() -> FreshStore {
    let (db, pool) = fresh_database().await;
    migrate(&pool, DEFAULT_SCHEMA).await.expect("migrate");
    FreshStore {
        coordinator: PgCoordinator::new(pool.clone()),
        pool,
        db,
    }
}

/// [`fresh_store`] with `queue` registered (default settings), as most store tests start:
/// the database, its pool and the coordinator.
pub async fn fresh_store_with_queue(queue: &str) -> (TestDatabase, PgPool, PgCoordinator) {
    let FreshStore {
        coordinator,
        pool,
        db,
    } = fresh_store().await;
    coordinator
        .register_queue(crate::types::RegisterQueueParams::new(queue))
        .await
        .expect("register the queue");
    (db, pool, coordinator)
}

/// Makes the registered `instance` a judge that may apply every liveness rule at once (see
/// the SQL function `cleanup_stale_instances`): takes its alive-lock through `coordinator`
/// (keep the returned session: dropping it ends the lock) and moves the start of its watch an
/// hour back, as if it had seen the server that long. Panics when the lock is not taken.
pub async fn seasoned_judge(
    coordinator: &PgCoordinator,
    pool: &PgPool,
    instance: InstanceId,
) -> TakeAliveLockOutcome {
    let lock = coordinator
        .take_alive_lock(TakeAliveLockParams { instance })
        .await
        .expect("take the judge's alive-lock");
    assert!(
        lock.held,
        "the judge's alive-lock is held by another session"
    );
    sqlx::query(&format!(
        "UPDATE {DEFAULT_SCHEMA}.instances SET lock_since = lock_since - interval '1 hour'
         WHERE instance_id = $1"
    ))
    .bind(instance.0)
    .execute(pool)
    .await
    .expect("age the judge's watch");
    lock
}
