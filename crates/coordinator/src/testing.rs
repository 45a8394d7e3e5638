//! The fresh-database fixture every crate's PostgreSQL tests share (feature `testing`).

use sqlx::postgres::PgPool;
use workpump_testdb::TestDatabase;

use crate::pg::{migrate, PgCoordinator, DEFAULT_SCHEMA};

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

/// Creates a fresh database, migrates it and opens a [`PgCoordinator`] on it. Panics when
/// there is no server or the migration fails: it is for tests.
pub async fn fresh_store() -> FreshStore {
    let db = workpump_testdb::server()
        .await
        .expect("a PostgreSQL server")
        .create_database()
        .await
        .expect("a fresh database");
    let pool = db.pool().await.expect("connect");
    migrate(&pool, DEFAULT_SCHEMA).await.expect("migrate");
    FreshStore {
        coordinator: PgCoordinator::new(pool.clone()),
        pool,
        db,
    }
}
