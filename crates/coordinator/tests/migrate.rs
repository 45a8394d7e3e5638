//! `migrate` against a session that squats on its lock: a role with nothing but CONNECT can
//! take the migration advisory lock (advisory locks are open to every role), and `migrate`
//! must then give up after its lock timeout, naming that session, rather than wait forever.
//!
//! The role is cluster-wide, so its name carries the test database's name, and it is dropped
//! at the end whatever happened. The test needs a user that may create roles: the throwaway
//! server's `postgres`, or a `DATABASE_URL` user with CREATEROLE.

use std::time::Duration;

use sqlx::postgres::PgConnection;
use sqlx::Connection;
use tokio::time::Instant;
use workpump_coordinator::*;

fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_gives_up_after_its_lock_timeout_naming_the_session_that_holds_the_lock() {
    assert_eq!(
        MigrateOptions::default().lock_timeout,
        Duration::from_secs(60)
    );
    let db = workpump_testdb::server()
        .await
        .expect("a PostgreSQL server")
        .create_database()
        .await
        .expect("a fresh database");
    let admin = db.pool().await.expect("connect as the admin");
    let role = format!("wpsquat_{}", db.name());
    let password = uuid::Uuid::new_v4().simple().to_string();
    // Nothing but what every role gets: CONNECT on the database (PUBLIC's).
    sqlx::query(&format!(
        "CREATE ROLE {} LOGIN PASSWORD '{password}'",
        ident(&role)
    ))
    .execute(&admin)
    .await
    .expect("a role with only CONNECT");

    // The body runs in a task of its own, so that the role is dropped even when it panics.
    let body = {
        let (admin, options, role) = (admin.clone(), db.connect_options(), role.clone());
        tokio::spawn(async move {
            let options = options
                .username(&role)
                .password(&password)
                .application_name("lock-squatter");
            let mut squatter = PgConnection::connect_with(&options)
                .await
                .expect("connect as the role");
            let pid: i32 = sqlx::query_scalar(
                "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock(hashtextextended('workpump.migrate:' || $1, 0))) l",
            )
            .bind(DEFAULT_SCHEMA)
            .fetch_one(&mut squatter)
            .await
            .expect("the role takes the migration lock");

            let started = Instant::now();
            let options = MigrateOptions {
                lock_timeout: Duration::from_secs(1),
            };
            let err = tokio::time::timeout(
                Duration::from_secs(20),
                migrate_with(&admin, DEFAULT_SCHEMA, options),
            )
            .await
            .expect("migrate gives up on its own, after its lock timeout")
            .expect_err("the lock is held");
            let waited = started.elapsed();
            assert!(waited >= Duration::from_secs(1), "gave up after {waited:?}");
            match &err {
                Error::MigrationLocked {
                    schema,
                    waited,
                    holder: Some(holder),
                } => {
                    assert_eq!(schema, DEFAULT_SCHEMA);
                    assert_eq!(*waited, Duration::from_secs(1));
                    assert_eq!(holder.pid, pid);
                    assert_eq!(holder.user.as_deref(), Some(role.as_str()));
                    assert_eq!(holder.application_name.as_deref(), Some("lock-squatter"));
                    assert!(holder.connected_since.is_some(), "{holder:?}");
                }
                other => panic!("expected MigrationLocked naming the squatter, got {other:?}"),
            }
            let message = err.to_string();
            for part in [
                &format!("pid {pid}"),
                &role,
                "lock-squatter",
                "nothing was migrated",
            ] {
                assert!(message.contains(part), "{message:?} lacks {part:?}");
            }
            assert!(err.is_transient());
            let created: bool =
                sqlx::query_scalar("SELECT to_regclass('workpump.work') IS NOT NULL")
                    .fetch_one(&admin)
                    .await
                    .expect("look for the table");
            assert!(!created, "nothing was migrated");

            // Once the squatter lets go, migrating works (and its session is not left with the
            // lock timeout: the connection is its own and closed).
            squatter.close().await.expect("the squatter leaves");
            migrate_with(&admin, DEFAULT_SCHEMA, options)
                .await
                .expect("migrate");
            let created: bool =
                sqlx::query_scalar("SELECT to_regclass('workpump.work') IS NOT NULL")
                    .fetch_one(&admin)
                    .await
                    .expect("look for the table");
            assert!(created);
        })
    };
    let outcome = body.await;
    // A session of the role (the squatter of a panicking body) would keep DROP ROLE from
    // succeeding; end it first. The role owns nothing.
    let _ = sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE usename = $1 AND pid <> pg_backend_pid()",
    )
    .bind(&role)
    .execute(&admin)
    .await;
    let dropped = sqlx::query(&format!("DROP ROLE IF EXISTS {}", ident(&role)))
        .execute(&admin)
        .await;
    admin.close().await;
    let dropped_db = db.drop_database().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic.into_panic());
    }
    dropped.expect("drop the role");
    dropped_db.expect("drop the database");
}
