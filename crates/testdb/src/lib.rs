//! A throwaway PostgreSQL for workpump's tests, demo and benchmarks. Its one job: hand a
//! test a fresh, empty database on a real server with no setup beyond an installed
//! PostgreSQL. [`server()`] finds the server — `DATABASE_URL`'s if set, else a private
//! cluster under the workspace's `target/` that it initialises and starts on first use and
//! leaves running for the next run — and [`Server::create_database`] makes a
//! `wp_<uuid>` database that is dropped again when the [`TestDatabase`] is. It connects with
//! sqlx's `PgConnectOptions` (the server's, with the database's name:
//! [`TestDatabase::connect_options`]); URLs are what it hands out, never what it edits to
//! connect. [`Cluster`] is
//! the same machinery for `cargo xtask pg` (start, stop, status) and for suites that
//! restart the server on purpose; the `"bench"` cluster keeps PostgreSQL's durability.
//! [`Cluster::start_standby`] makes a streaming standby of a cluster on a port of its own
//! ([`Standby`]), which failover tests promote after stopping its primary.
//!
//! It deliberately does not run migrations, hold pools across tests (a pool belongs to the
//! tokio runtime that made it, and every `#[tokio::test]` makes its own), download or build
//! PostgreSQL, or touch any server process but the one in its own data directory. It depends
//! on nothing of workpump's, and nothing in the library depends on it: it is a dev-dependency
//! of the crates whose tests need a database, a dependency of `xtask`, and an optional one of
//! the coordinator's `testing` feature, whose `testing::fresh_store` (a fresh database,
//! migrated, with a `PgCoordinator` and a pool) is the fixture those tests share.
//!
//! ```no_run
//! # async fn example() -> workpump_testdb::Result<()> {
//! let db = workpump_testdb::server().await?.create_database().await?;
//! let pool = db.pool().await?;
//! sqlx::query("SELECT 1").execute(&pool).await.expect("the database answers");
//! db.drop_database().await?;
//! # Ok(())
//! # }
//! ```

mod backend;
mod cluster;
mod error;
mod install;
mod probe;
mod query;
mod run_as;
mod server;
mod standby;
mod url;

pub use cluster::{Cluster, StopMode};
pub use error::{Error, Result};
pub use server::{server, Server, TestDatabase};
pub use standby::{Replication, Standby};
